"""SIMD lane helpers written as LLVM vector IR: float32 x float16 dot products and axpys in a fixed
order (the decode attention's key and value rows), a cache-line prefetch, and halving sums that
several dot products share.

The dots and axpys are Numba intrinsics (llvmlite code generation), used by the CPU backend's
attention kernels.
"""

from __future__ import annotations

from contextlib import contextmanager

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

DOT_LANES = 16
PINNED = ("arcp",)  # a float flag that permits nothing for + and *: keeps Numba's fast-math rewrite off


def _is_c_vector(t, dtype) -> bool:
    return isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C" and t.dtype == dtype


@contextmanager
def _f16_chunks(context, builder, bits_array, n_full):
    """Codegen of a loop over the first n_full values of a float16 row (bits_array: its Numba type and
    value, uint16 C-contiguous) DOT_LANES at a time: the body, inside the `with`, gets (the chunk's
    element offset, the chunk widened to <DOT_LANES x float>)."""
    bits_data = context.make_array(bits_array[0])(context, builder, bits_array[1]).data
    halves = ir.VectorType(ir.HalfType(), DOT_LANES)
    shorts = ir.VectorType(ir.IntType(16), DOT_LANES)
    n = builder.sext(n_full, ir.IntType(64)) if n_full.type.width < 64 else n_full
    with cgutils.for_range(builder, builder.sdiv(n, ir.Constant(n.type, DOT_LANES))) as loop:
        offset = builder.mul(loop.index, ir.Constant(loop.index.type, DOT_LANES))
        chunk = builder.load(builder.bitcast(builder.gep(bits_data, [offset]), shorts.as_pointer()), align=2)
        yield offset, builder.fpext(builder.bitcast(chunk, halves), ir.VectorType(ir.FloatType(), DOT_LANES))


def halving_sums(builder, vecs):
    """The totals of several <DOT_LANES x float> (len(vecs) a power of two, up to DOT_LANES), each added
    up by halves (lanes l and l + 8, then l and l + 4, ...), as one <len(vecs) x float> in their order.
    Each total is the same bits as halving that vector alone; the halvings of different vectors share
    vector adds: two vectors' low halves are gathered into one vector and their high halves into
    another (two permutes), then added at once, so 16 totals take 15 vector adds where one at a time
    they took 64."""
    per = DOT_LANES  # lanes of each total still to be halved, side by side in every vector
    while per > 1:
        half = per // 2
        if len(vecs) > 1:  # two vectors' segments: 2 * DOT_LANES lanes in, DOT_LANES out
            width, pairs = 2 * DOT_LANES, [(vecs[i], vecs[i + 1]) for i in range(0, len(vecs), 2)]
        else:  # one vector left: its segments halve in place
            width, pairs = vecs[0].type.count, [(vecs[0], vecs[0])]
        low = [s + e for s in range(0, width, per) for e in range(half)]
        high = [s + half + e for s in range(0, width, per) for e in range(half)]
        index = ir.VectorType(ir.IntType(32), len(low))
        vecs = [builder.fadd(builder.shuffle_vector(a, b, ir.Constant(index, low)),
                             builder.shuffle_vector(a, b, ir.Constant(index, high)), flags=PINNED)
                for a, b in pairs]
        per = half
    return vecs[0]


def _lane_dots(context, builder, a_arrays, bits_array, n_full):
    """The codegen of dot_f32_f16_lanes for several float32 rows against one float16 row: each chunk of
    DOT_LANES float16 values is loaded and widened once and multiplied into every row's running sums;
    each row's sums are then added up by halves. Per row, the same operations in the same order as one
    row alone, so the results are the same bits. a_arrays: (Numba type, value) of each row."""
    a_datas = [context.make_array(t)(context, builder, v).data for t, v in a_arrays]
    floats = ir.VectorType(ir.FloatType(), DOT_LANES)
    sums = [cgutils.alloca_once_value(builder, ir.Constant(floats, [0.0] * DOT_LANES)) for _ in a_datas]
    with _f16_chunks(context, builder, bits_array, n_full) as (offset, y):
        for a_data, acc in zip(a_datas, sums):
            x = builder.load(builder.bitcast(builder.gep(a_data, [offset]), floats.as_pointer()), align=4)
            builder.store(builder.fadd(builder.load(acc), builder.fmul(x, y, flags=PINNED), flags=PINNED), acc)
    summed = halving_sums(builder, [builder.load(acc) for acc in sums])
    return [builder.extract_element(summed, ir.Constant(ir.IntType(32), k)) for k in range(len(sums))]


@intrinsic
def dot_f32_f16_lanes(typingctx, a, bits, n_full):
    """sum(a[i] * float(bits[i]) for i < n_full), a float32[:] C-contiguous, bits the float16 bits
    uint16[:] C-contiguous, n_full a multiple of DOT_LANES, in a fixed order: DOT_LANES running sums
    (lane l takes the elements i % DOT_LANES == l, a product then a sum, no fused multiply-add), then
    added up by halves (lanes l and l + 8, then l and l + 4, ...). Written as LLVM vector IR so that it is
    packed (vcvtph2ps, vmulps, vaddps) without fast-math: the order is the IR's, not the optimiser's
    choice, so every compilation gives the same bits. Its float operations carry an explicit flag that
    permits nothing here (arcp), so that Numba's fast-math rewrite, which flags every unflagged float
    operation of a fast-math kernel, leaves them alone wherever this is inlined."""
    if not (_is_c_vector(a, types.float32) and _is_c_vector(bits, types.uint16) and isinstance(n_full, types.Integer)):
        return None
    sig = types.float32(a, bits, n_full)

    def codegen(context, builder, signature, args):
        a_val, bits_val, n_val = args
        (total,) = _lane_dots(context, builder, [(signature.args[0], a_val)], (signature.args[1], bits_val), n_val)
        return total

    return sig, codegen


@intrinsic
def dot4_f32_f16_lanes(typingctx, a0, a1, a2, a3, bits, n_full):
    """(dot_f32_f16_lanes(a_r, bits, n_full) for the four rows a0..a3), the same bits as four calls, with
    bits read and widened once: the query heads that share a key head (grouped-query attention) against
    one cached key."""
    rows = (a0, a1, a2, a3)
    if not (all(_is_c_vector(a, types.float32) for a in rows) and _is_c_vector(bits, types.uint16)
            and isinstance(n_full, types.Integer)):
        return None
    sig = types.UniTuple(types.float32, 4)(a0, a1, a2, a3, bits, n_full)

    def codegen(context, builder, signature, args):
        totals = _lane_dots(context, builder, list(zip(signature.args[:4], args[:4])), (signature.args[4], args[4]), args[5])
        return context.make_tuple(builder, signature.return_type, totals)

    return sig, codegen


def _lane_axpys(context, builder, weights, bits_array, n_full, y_arrays):
    """The codegen of axpy_f16_lanes for several (weight, row) pairs over one float16 row: each chunk of
    DOT_LANES float16 values is loaded and widened once, then y_r += w_r * x for every row (a product
    rounded to float32, then a sum). Elementwise: each y_r[i] gets the scalar loop's bits.
    weights: float32 values; y_arrays: (Numba type, value) of each row."""
    floats = ir.VectorType(ir.FloatType(), DOT_LANES)
    lanes = ir.VectorType(ir.IntType(32), DOT_LANES)
    splats = []
    for w in weights:  # each weight in every lane
        one = builder.insert_element(ir.Constant(floats, ir.Undefined), w, ir.Constant(ir.IntType(32), 0))
        splats.append(builder.shuffle_vector(one, one, ir.Constant(lanes, [0] * DOT_LANES)))
    y_datas = [context.make_array(t)(context, builder, v).data for t, v in y_arrays]
    with _f16_chunks(context, builder, bits_array, n_full) as (offset, x):
        for w, y_data in zip(splats, y_datas):
            where = builder.bitcast(builder.gep(y_data, [offset]), floats.as_pointer())
            builder.store(builder.fadd(builder.load(where, align=4), builder.fmul(w, x, flags=PINNED), flags=PINNED),
                          where, align=4)


@intrinsic
def axpy_f16_lanes(typingctx, w, bits, n_full, y):
    """y[i] += w * float(bits[i]) for i < n_full (y float32[:] and bits uint16[:] C-contiguous, n_full a
    multiple of DOT_LANES): a product rounded to float32, then a sum, as a scalar loop without fast-math
    computes it, but packed (the scalar loop was not vectorised: ~60 cycles per 128 values)."""
    if not (w == types.float32 and _is_c_vector(bits, types.uint16) and isinstance(n_full, types.Integer)
            and _is_c_vector(y, types.float32)):
        return None
    sig = types.void(w, bits, n_full, y)

    def codegen(context, builder, signature, args):
        _lane_axpys(context, builder, [args[0]], (signature.args[1], args[1]), args[2], [(signature.args[3], args[3])])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def axpy4_f16_lanes(typingctx, w0, w1, w2, w3, bits, n_full, y0, y1, y2, y3):
    """axpy_f16_lanes(w_r, bits, n_full, y_r) for four (weight, row) pairs, the same bits, with bits read
    and widened once: the attention weights of four query heads applied to one cached value row."""
    weights, ys = (w0, w1, w2, w3), (y0, y1, y2, y3)
    if not (all(w == types.float32 for w in weights) and all(_is_c_vector(y, types.float32) for y in ys)
            and _is_c_vector(bits, types.uint16) and isinstance(n_full, types.Integer)):
        return None
    sig = types.void(w0, w1, w2, w3, bits, n_full, y0, y1, y2, y3)

    def codegen(context, builder, signature, args):
        _lane_axpys(context, builder, list(args[:4]), (signature.args[4], args[4]), args[5],
                    list(zip(signature.args[6:], args[6:])))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch_lines(typingctx, array, n_bytes):
    """Ask the cache for the 64-byte lines of the first n_bytes of `array` (a C-contiguous 1-D array;
    llvm.prefetch into every level, as a read: never faults, so a range past the data is harmless)."""
    if not (isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C" and isinstance(n_bytes, types.Integer)):
        return None
    sig = types.void(array, n_bytes)

    def codegen(context, builder, signature, args):
        array_val, n_val = args
        i8p = ir.IntType(8).as_pointer()
        data = builder.bitcast(context.make_array(signature.args[0])(context, builder, array_val).data, i8p)
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8")
        n = builder.sext(n_val, ir.IntType(64)) if n_val.type.width < 64 else n_val
        lines = builder.sdiv(builder.add(n, ir.Constant(n.type, 63)), ir.Constant(n.type, 64))
        with cgutils.for_range(builder, lines) as loop:
            line = builder.gep(data, [builder.mul(loop.index, ir.Constant(loop.index.type, 64))])
            builder.call(fn, [line, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen
