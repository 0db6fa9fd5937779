"""How every localllm Numba kernel is compiled.

Numba ships LLVM's SLP vectorizer switched off (`NUMBA_SLP_VECTORIZE=0`). Our block dot products are short
fixed-length integer loops (32 int8 products summed, then scaled) that only the SLP vectorizer turns into
packed AVX2/AVX-512 instructions: measured on this machine kind, a Q8_0 matvec runs 5x faster with it on.
Numba's on-disk cache does not key on the setting, so it must be in force whenever a localllm kernel is
compiled; it is set here, in the one module every kernel module imports, rather than left to the user's
environment. It changes how Numba optimises code compiled from now on and nothing else.

Two decorators:
- `exact_kernel`: IEEE arithmetic as written (no fast-math), for dequantizers and quantizers that must
  equal llama.cpp's reference bit for bit (fast-math would contract a*b+c into an FMA and change roundings).
- `fast_kernel`: fast-math allowed, for dot products whose float reductions may be reordered.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

numba.config.SLP_VECTORIZE = 1


# ----- Numba's on-disk cache, keyed on every kernel source -----
#
# Numba keeps a cached kernel while *its own* file is unchanged, but our kernels inline intrinsics and
# helpers from other files (vector.VectorCode, _legacy, jit): after an edit there, a type module's cached
# vec_dot stays the old code while freshly compiled drivers (whose file names carry a source hash) use
# the new one, so the two can disagree (seen during development, until the cache was emptied). So
# for the files of localllm.quant and localllm.backends.cpu the cache's source stamp also carries a
# hash of all those files: any edit there recompiles every kernel once. (Numba's locator list is not
# public API; if it moves, this does nothing and the old behaviour stays.)

_KERNEL_DIRS = tuple(
    str(Path(__file__).resolve().parent / sub) for sub in (".", "../backends/cpu")
)


@lru_cache(maxsize=1)
def kernel_sources_hash() -> str:
    digest = hashlib.sha256()
    for folder in _KERNEL_DIRS:
        for path in sorted(Path(folder).resolve().glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _is_kernel_file(py_file) -> bool:
    folder = str(Path(py_file).resolve().parent)
    return any(folder == str(Path(d).resolve()) for d in _KERNEL_DIRS)


def _keyed_on_kernel_sources(base):
    class Locator(base):
        @classmethod
        def from_function(cls, py_func, py_file):
            if not _is_kernel_file(py_file):
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return (super().get_source_stamp(), kernel_sources_hash())

    Locator.__name__ = f"KernelSources{base.__name__}"
    return Locator


def _install_cache_locators() -> None:
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None)
    locators = getattr(impl, "_locator_classes", None)
    names = ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")
    if not isinstance(locators, list) or not all(hasattr(caching, n) for n in names):
        return
    if any(getattr(c, "__name__", "").startswith("KernelSources") for c in locators):
        return
    locators[:0] = [_keyed_on_kernel_sources(getattr(caching, n)) for n in names]


_install_cache_locators()


def exact_kernel(fn=None, *, parallel: bool = False):
    deco = numba.njit(cache=True, nogil=True, parallel=parallel, error_model="numpy")
    return deco(fn) if fn is not None else deco


def fast_kernel(fn=None, *, parallel: bool = False):
    deco = numba.njit(cache=True, nogil=True, parallel=parallel, fastmath=True, error_model="numpy")
    return deco(fn) if fn is not None else deco


@intrinsic
def f16_to_f32(typingctx, bits):
    """IEEE half given as its 16 bits (any integer type) -> float32, exactly (LLVM fpext: F16C on x86)."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        (value,) = args
        as_i16 = builder.trunc(value, ir.IntType(16)) if value.type.width > 16 else builder.zext(value, ir.IntType(16)) if value.type.width < 16 else value
        return builder.fpext(builder.bitcast(as_i16, ir.HalfType()), ir.FloatType())

    return sig, codegen


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
    totals = []
    for acc in sums:
        total = builder.load(acc)
        width = DOT_LANES
        while width > 1:
            width //= 2
            index = ir.VectorType(ir.IntType(32), width)
            low = builder.shuffle_vector(total, total, ir.Constant(index, list(range(width))))
            high = builder.shuffle_vector(total, total, ir.Constant(index, list(range(width, 2 * width))))
            total = builder.fadd(low, high, flags=PINNED)
        totals.append(builder.extract_element(total, ir.Constant(ir.IntType(32), 0)))
    return totals


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


@intrinsic
def fma_f32(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma.f32), float32. A call, not a reassociable fadd: a loop
    `acc = fma_f32(x, y, acc)` sums in its written order in every kernel it is inlined into (a fast-math
    `acc += x * y` was reordered differently in different drivers, measured on IQ4_NL). In a fast-math
    kernel Numba flags the call too, as it does q4_k's and q6_k's accumulation steps, which rely on the
    same: LLVM keeps a flagged fma a single fma."""
    if not all(t == types.float32 for t in (a, b, c)):
        return None
    sig = types.float32(a, b, c)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32")
        return builder.call(fma, args)

    return sig, codegen


@intrinsic
def u32_as_f32(typingctx, bits):
    """Reinterpret the 32 bits of an unsigned integer as a float32 (no conversion)."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        (value,) = args
        as_i32 = builder.trunc(value, ir.IntType(32)) if value.type.width > 32 else value
        return builder.bitcast(as_i32, ir.FloatType())

    return sig, codegen


@intrinsic
def f32_bits(typingctx, value):
    """The 32 bits of a float32 as an int32 (no conversion): with the sign bit cleared, their order
    is the order of the magnitudes, for every value but NaN, which an integer max reduces in vector
    registers where a float compare-and-keep loop stays scalar (quant.activation)."""
    if not isinstance(value, types.Float) or value.bitwidth != 32:
        return None
    sig = types.int32(value)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@exact_kernel
def read_f16(buf, offset):
    """float32 value of the little-endian half stored at buf[offset:offset+2] (buf: uint8[:])."""
    return f16_to_f32(np.uint16(buf[offset]) | (np.uint16(buf[offset + 1]) << np.uint16(8)))


@exact_kernel
def read_f32(buf, offset):
    """float32 stored little-endian at buf[offset:offset+4] (buf: uint8[:])."""
    bits = (
        np.uint32(buf[offset])
        | (np.uint32(buf[offset + 1]) << np.uint32(8))
        | (np.uint32(buf[offset + 2]) << np.uint32(16))
        | (np.uint32(buf[offset + 3]) << np.uint32(24))
    )
    return u32_as_f32(bits)


@intrinsic
def f32_to_f16_bits(typingctx, value):
    """float32 -> the 16 bits of the nearest float16 (round to nearest even, as F16C and numpy do)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        (x,) = args
        return builder.bitcast(builder.fptrunc(x, ir.HalfType()), ir.IntType(16))

    return sig, codegen


@exact_kernel
def round_to_f16(value):
    """float32 value rounded to the nearest float16, returned as float32."""
    return f16_to_f32(f32_to_f16_bits(np.float32(value)))
