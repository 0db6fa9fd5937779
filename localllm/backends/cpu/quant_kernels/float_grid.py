"""Dot products of float weight rows (F32, F16, BF16) with float32 activations, several at once.

One order for every dot, in every kernel: the row is taken LANES = 16 elements at a time, each chunk's
weights widened to float32 (F16: vcvtph2ps; BF16: the 16 bits moved to the top of a word) and multiplied
into 16 running sums with one fused multiply-add per lane (acc = fma(w, x, acc)); the 16 sums are then
added by halves (lanes l and l + 8, then l and l + 4, ...; the dots of a grid share those vector
adds, lanes.halving_sums); the last n % 16 elements follow one by one,
each an fma into that total. `vec_dot` (one weight row, one activation row: decode) and the grid kernels
(R weight rows x A activation rows, each weight and activation chunk loaded once for all the dots it
enters: prefill and batched decode) run exactly these operations per dot, so every product equals
vec_dot's bit for bit at every batch size.

Why a grid of dots rather than weight rows as lanes (q4_k_tiles): with the lanes along a row, the
one-row kernel keeps 16 independent sums too, so decode streams the weights at memory speed in the same
order; and a 4 x 4 grid keeps 16 accumulators, 4 weight and 4 activation vectors in the 32 vector
registers of AVX-512: 16 fused multiply-adds per 8 loads, bound by the FMA units as a GEMM is. Before
it, these types' prompts went through OpenBLAS (after a float32 copy of each weight tile), whose kernels
some machines pin to AVX2 (OPENBLAS_CORETYPE=Haswell): half the FMA width of a 512-bit core.
"""

from __future__ import annotations

from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ....jit import exact_kernel
from .lanes import DOT_LANES, halving_sums


LANES = DOT_LANES  # 16 float32 lanes: one AVX-512 register
GRID_W, GRID_A = 4, 4  # weight rows x activation rows per grid call
MIN_ROWS = 2  # activation rows from which matmul_rows takes matvec_tiles
TILE = 16  # matvec_tiles covers the first N - N % TILE weight rows (the TileKernel contract)


def _widened(builder, kind: str, pointer):
    """<16 x float> from 16 weights at `pointer` (float* for f32, i16* for f16 / bf16)."""
    f32x16 = ir.VectorType(ir.FloatType(), LANES)
    if kind == "f32":
        return builder.load(builder.bitcast(pointer, f32x16.as_pointer()), align=4)
    shorts = builder.load(builder.bitcast(pointer, ir.VectorType(ir.IntType(16), LANES).as_pointer()), align=2)
    if kind == "f16":
        return builder.fpext(builder.bitcast(shorts, ir.VectorType(ir.HalfType(), LANES)), f32x16)
    words = builder.shl(builder.zext(shorts, ir.VectorType(ir.IntType(32), LANES)),
                        ir.Constant(ir.VectorType(ir.IntType(32), LANES), [16] * LANES))
    return builder.bitcast(words, f32x16)


def _row_pointers(context, builder, array_type, array, first, count, element):
    """Pointers (element*) to rows first..first+count-1 of a C-contiguous 2D array, or to the data of a
    1D array (count 1)."""
    arr = context.make_array(array_type)(context, builder, array)
    if array_type.ndim == 1:
        return [builder.bitcast(arr.data, element.as_pointer())]
    stride = cgutils.unpack_tuple(builder, arr.strides)[0]
    base = builder.bitcast(arr.data, ir.IntType(8).as_pointer())
    first = builder.sext(first, stride.type) if first.type.width < stride.type.width else first
    rows = []
    for i in range(count):
        offset = builder.mul(builder.add(first, ir.Constant(stride.type, i)), stride)
        rows.append(builder.bitcast(builder.gep(base, [offset]), element.as_pointer()))
    return rows


def _scalar_weight(builder, kind: str, pointer):
    """float from one weight at `pointer`, widened as _widened does."""
    if kind == "f32":
        return builder.load(pointer)
    short = builder.load(pointer)
    if kind == "f16":
        return builder.fpext(builder.bitcast(short, ir.HalfType()), ir.FloatType())
    return builder.bitcast(builder.shl(builder.zext(short, ir.IntType(32)), ir.Constant(ir.IntType(32), 16)), ir.FloatType())


def _element(kind: str):
    """The LLVM type of one stored weight: float for f32, the 16 bits of f16 / bf16."""
    return ir.FloatType() if kind == "f32" else ir.IntType(16)


def _dots(builder, kind: str, w_rows, x_rows, n_):
    """Codegen of every (weight row, activation row) dot in the module's order, over the first n_
    elements of the rows at the pointers w_rows (element*) and x_rows (float*): the float32 totals,
    ordered (w_rows[0], x_rows[0]), (w_rows[0], x_rows[1]), ..., (w_rows[1], x_rows[0]), ... Each chunk
    of 16 of every row is loaded and widened once a step, for all the dots it enters."""
    n_w, n_a = len(w_rows), len(x_rows)
    i64 = ir.IntType(64)
    n_ = builder.sext(n_, i64) if n_.type.width < 64 else n_
    f32x16 = ir.VectorType(ir.FloatType(), LANES)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32x16, [f32x16] * 3), "llvm.fma.v16f32")
    zero = ir.Constant(f32x16, [0.0] * LANES)
    accs = [cgutils.alloca_once_value(builder, zero) for _ in range(n_w * n_a)]
    with cgutils.for_range(builder, builder.udiv(n_, i64(LANES))) as loop:
        at = builder.mul(loop.index, i64(LANES))
        ws = [_widened(builder, kind, builder.gep(row, [at])) for row in w_rows]
        xs = [builder.load(builder.bitcast(builder.gep(row, [at]), f32x16.as_pointer()), align=4) for row in x_rows]
        for i, w in enumerate(ws):
            for j, xv in enumerate(xs):
                acc = accs[i * n_a + j]
                builder.store(builder.call(fma, [w, xv, builder.load(acc)]), acc)
    summed = halving_sums(builder, [builder.load(acc) for acc in accs])
    totals = [cgutils.alloca_once_value(builder, builder.extract_element(summed, ir.Constant(ir.IntType(32), k)))
              for k in range(len(accs))]
    # the last n % 16 elements, one fma each into the total
    fma1 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.FloatType(), [ir.FloatType()] * 3), "llvm.fma.f32")
    tail_start = builder.sub(n_, builder.urem(n_, i64(LANES)))
    with cgutils.for_range(builder, builder.urem(n_, i64(LANES))) as loop:
        at = builder.add(tail_start, loop.index)
        ws = [_scalar_weight(builder, kind, builder.gep(row, [at])) for row in w_rows]
        xs = [builder.load(builder.gep(row, [at])) for row in x_rows]
        for i, w in enumerate(ws):
            for j, xv in enumerate(xs):
                total = totals[i * n_a + j]
                builder.store(builder.call(fma1, [w, xv, builder.load(total)]), total)
    return [builder.load(t) for t in totals]


def grid_intrinsic(kind: str, n_w: int, n_a: int):
    """dots(weights, r0, x, t0, n) -> UniTuple(float32, n_w * n_a): the first n elements of weight rows
    r0..r0+n_w-1 (uint8[N, row_bytes], or a 1D row for n_w 1) dotted with activation rows
    t0..t0+n_a-1 (float32[T, >= n], or 1D for n_a 1) in the module's order, ordered (r0, t0), (r0,
    t0 + 1), ..., (r0 + 1, t0), ..."""

    @intrinsic
    def dots(typingctx, weights, r0, x, t0, n):
        sig = types.UniTuple(types.float32, n_w * n_a)(weights, r0, x, t0, n)

        def codegen(context, builder, signature, args):
            weights_, r0_, x_, t0_, n_ = args
            w_type, _, x_type, _, _ = signature.args
            w_rows = _row_pointers(context, builder, w_type, weights_, r0_, n_w, _element(kind))
            x_rows = _row_pointers(context, builder, x_type, x_, t0_, n_a, ir.FloatType())
            return context.make_tuple(builder, signature.return_type, _dots(builder, kind, w_rows, x_rows, n_))

        return sig, codegen

    return dots


def apart_intrinsic(kind: str, count: int):
    """dots(weights, r0, step, x, n) -> UniTuple(float32, count): weight rows r0, r0 + step, ...,
    r0 + (count - 1) * step (uint8[N, row_bytes]) dotted with one activation x (float32[>= n]) over the
    first n elements, each in the module's order. The rows are read side by side: decode's matvec gives
    them a part of the matrix apart, so each thread streams `count` sequential runs of it at once."""

    @intrinsic
    def dots(typingctx, weights, r0, step, x, n):
        if not (isinstance(weights, types.Array) and weights.ndim == 2 and isinstance(x, types.Array) and x.ndim == 1):
            return None
        sig = types.UniTuple(types.float32, count)(weights, r0, step, x, n)

        def codegen(context, builder, signature, args):
            weights_, r0_, step_, x_, n_ = args
            w_type, _, _, x_type, _ = signature.args
            step_ = builder.sext(step_, r0_.type) if step_.type.width < r0_.type.width else step_
            r0_ = builder.sext(r0_, step_.type) if r0_.type.width < step_.type.width else r0_
            firsts = [builder.add(r0_, builder.mul(step_, ir.Constant(step_.type, k))) for k in range(count)]
            w_rows = [_row_pointers(context, builder, w_type, weights_, r, 1, _element(kind))[0] for r in firsts]
            x_rows = _row_pointers(context, builder, x_type, x_, None, 1, ir.FloatType())
            return context.make_tuple(builder, signature.return_type, _dots(builder, kind, w_rows, x_rows, n_))

        return sig, codegen

    return dots


# The weight kinds, as the kernels below take them (a constant at each type's call site, so each type's
# compiled kernel keeps only its own branch).
F32, F16, BF16 = 0, 1, 2

f32_1x1, f32_4x1, f32_4x4 = (grid_intrinsic("f32", w, a) for w, a in ((1, 1), (GRID_W, 1), (GRID_W, GRID_A)))
f16_1x1, f16_4x1, f16_4x4 = (grid_intrinsic("f16", w, a) for w, a in ((1, 1), (GRID_W, 1), (GRID_W, GRID_A)))
bf16_1x1, bf16_4x1, bf16_4x4 = (grid_intrinsic("bf16", w, a) for w, a in ((1, 1), (GRID_W, 1), (GRID_W, GRID_A)))
STREAMS = 4  # decode's matvec: rows this many parts of the matrix apart, read side by side
f32_apart, f16_apart, bf16_apart = (apart_intrinsic(kind, STREAMS) for kind in ("f32", "f16", "bf16"))


@exact_kernel
def float_dot(w, x, kind):
    """vec_dot of the kind: w uint8[row_bytes] weight row, x float32[n] activation."""
    if kind == F32:
        return f32_1x1(w, 0, x, 0, x.shape[0])[0]
    if kind == F16:
        return f16_1x1(w, 0, x, 0, x.shape[0])[0]
    return bf16_1x1(w, 0, x, 0, x.shape[0])[0]


@exact_kernel
def _dots_4x4(weights, r0, x, t, n, kind):
    if kind == F32:
        return f32_4x4(weights, r0, x, t, n)
    if kind == F16:
        return f16_4x4(weights, r0, x, t, n)
    return bf16_4x4(weights, r0, x, t, n)


@exact_kernel
def _dots_4x1(weights, r0, x, n, kind):
    if kind == F32:
        return f32_4x1(weights, r0, x, 0, n)
    if kind == F16:
        return f16_4x1(weights, r0, x, 0, n)
    return bf16_4x1(weights, r0, x, 0, n)


@exact_kernel
def _dots_apart(weights, r0, step, x, n, kind):
    if kind == F32:
        return f32_apart(weights, r0, step, x, n)
    if kind == F16:
        return f16_apart(weights, r0, step, x, n)
    return bf16_apart(weights, r0, step, x, n)


@exact_kernel(parallel=True)
def float_matvec(weights, out, x, kind):
    """out[r] = float_dot(weights[r], x, kind) for every row r (decode). The first STREAMS * q rows are
    STREAMS parts of q rows; step i takes row i of each part (apart_intrinsic), so each thread streams
    STREAMS runs of the matrix side by side: one sequential run per core stops well short of the memory's
    speed, and four independent sums hide the fused multiply-add's latency (docs/performance.md). The
    last N % STREAMS rows follow one by one."""
    rows, n = weights.shape[0], x.shape[0]
    q = rows // STREAMS
    for i in prange(q):
        s0, s1, s2, s3 = _dots_apart(weights, i, q, x, n, kind)
        out[i] = s0
        out[q + i] = s1
        out[2 * q + i] = s2
        out[3 * q + i] = s3
    for r in range(STREAMS * q, rows):
        out[r] = float_dot(weights[r], x, kind)


@exact_kernel(parallel=True)
def float_matvec_tiles(weights, out, x, kind):
    """out[t, r] = float_dot(weights[r], x[t], kind) for r < N - N % TILE: groups of GRID_W weight rows
    in parallel, GRID_A activation rows at a time, then the last T % GRID_A one by one."""
    n_rows, n = x.shape
    for g in prange((weights.shape[0] - weights.shape[0] % TILE) // GRID_W):
        r0 = g * GRID_W
        t = 0
        while t + GRID_A <= n_rows:
            sums = _dots_4x4(weights, r0, x, t, n, kind)
            for i in range(GRID_W):
                for j in range(GRID_A):
                    out[t + j, r0 + i] = sums[i * GRID_A + j]
            t += GRID_A
        while t < n_rows:
            sums = _dots_4x1(weights, r0, x[t], n, kind)
            for i in range(GRID_W):
                out[t, r0 + i] = sums[i]
            t += 1
