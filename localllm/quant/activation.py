"""Activation quantization: the pairing formats the vec_dot kernels read.

llama.cpp quantizes the activation vector once per matmul to the weight type's `vec_dot_type`:
Q8_0 (or Q8_1) for 32-element block types, Q8_K for 256-element super-block types. We keep the same
numbers in unpacked arrays, which the kernels index directly:

q8_0: qs int8[n]; d float32[n/32] (the scale, rounded through float16 as ggml stores it);
      s int32[n/32] = sum of qs in each block (what Q8_1's `s` field holds divided by d; used by
      the types with a min, Q4_1 and Q5_1).
q8_k: qs int8[n]; d float32[n/256]; s int32[n/16] = sum of qs in each group of 16 (Q8_K's `bsums`).

`QuantizedActivation` owns the buffers so a decode loop quantizes into them without allocating.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit import exact_kernel, f32_bits, round_to_f16, u32_as_f32

QK8_0 = 32
QK_K = 256


_INFINITY_BITS = 0x7F800000  # float32 bits of +inf; a magnitude's bits above it are a NaN's


@exact_kernel
def largest_magnitude_bits(xb):
    """(bits of |v|) << 32 | (n - 1 - j) for v = xb[j], the first value of the largest magnitude,
    NaNs passed over; 0 in the high half when every value is zero or NaN. What llama.cpp's scalar scan
    (`if (fabsf(v) > amax)`, first maximum kept) finds, as an integer max that vectorizes: the scan
    itself compiled to a compare and branch per value (3.2 us for a 4096-float q8_k row, measured)."""
    n = xb.shape[0]
    best = np.int64(0)
    for j in range(n):
        bits = f32_bits(xb[j]) & 0x7FFFFFFF
        counted = np.int64(bits if bits <= _INFINITY_BITS else 0)
        best = max(best, (counted << 32) | (n - 1 - j))
    return best


def _block_pointer(context, builder, array_type, array, base, element):
    """element* to array[base] of a unit-stride 1D array."""
    arr = context.make_array(array_type)(context, builder, array)
    base = builder.sext(base, ir.IntType(64)) if base.type.width < 64 else base
    return builder.gep(builder.bitcast(arr.data, element.as_pointer()), [base])


@intrinsic
def _block_magnitude_bits(typingctx, x, base):
    """The largest of the magnitudes' bits of x[base : base + 32] (float32, unit stride), NaNs counted
    as 0: as int32, the bits of the largest |v| that is not NaN (0 for none). One vector max."""
    sig = types.int32(x, base)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        words = ir.VectorType(i32, QK8_0)
        pointer = _block_pointer(context, builder, signature.args[0], args[0], args[1], ir.FloatType())
        bits = builder.load(builder.bitcast(pointer, words.as_pointer()), align=4)
        bits = builder.and_(bits, ir.Constant(words, [0x7FFFFFFF] * QK8_0))
        nan = builder.icmp_signed(">", bits, ir.Constant(words, [_INFINITY_BITS] * QK8_0))
        bits = builder.select(nan, ir.Constant(words, [0] * QK8_0), bits)
        reduce = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [words]), f"llvm.vector.reduce.smax.v{QK8_0}i32")
        return builder.call(reduce, [bits])

    return sig, codegen


@intrinsic
def _round_block(typingctx, x, base, inv, qs):
    """qs[base + j] = int8(rint(x[base + j] * inv)) for j < 32 (x float32 and qs int8, unit strides);
    returns the sum of the rounded values (int32): the scalar loop's operations, as vectors."""
    sig = types.int32(x, base, inv, qs)

    def codegen(context, builder, signature, args):
        x_, base_, inv_, qs_ = args
        i32, f32 = ir.IntType(32), ir.FloatType()
        floats, ints = ir.VectorType(f32, QK8_0), ir.VectorType(i32, QK8_0)
        pointer = _block_pointer(context, builder, signature.args[0], x_, base_, f32)
        values = builder.load(builder.bitcast(pointer, floats.as_pointer()), align=4)
        scale = builder.insert_element(ir.Constant(floats, ir.Undefined), inv_, ir.Constant(i32, 0))
        scale = builder.shuffle_vector(scale, scale, ir.Constant(ints, [0] * QK8_0))
        rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(floats, [floats]), f"llvm.rint.v{QK8_0}f32")
        rounded = builder.fptosi(builder.call(rint, [builder.fmul(values, scale)]), ints)
        out = _block_pointer(context, builder, signature.args[3], qs_, base_, ir.IntType(8))
        builder.store(builder.trunc(rounded, ir.VectorType(ir.IntType(8), QK8_0)),
                      builder.bitcast(out, ir.VectorType(ir.IntType(8), QK8_0).as_pointer()), align=1)
        reduce = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [ints]), f"llvm.vector.reduce.add.v{QK8_0}i32")
        return builder.call(reduce, [rounded])

    return sig, codegen


@exact_kernel
def quantize_q8_0(x, qs, d, s):
    """x: float32[n] -> qs int8[n], d float32[n/32], s int32[n/32]; n % 32 == 0.

    Matches llama.cpp's x86 CPU path (quantize_row_q8_0/_q8_1 with AVX): d = amax/127, values scaled by
    127/amax and rounded to nearest even; the scale is stored as float16. Unit-stride rows take each
    block as vectors (_block_magnitude_bits, _round_block: the same operations, where LLVM leaves the
    scalar loop below scalar: a compare and branch, then a vcvtss2si, per value); others that loop.
    """
    nb = x.shape[0] // QK8_0
    vectors = x.strides[0] == 4 and qs.strides[0] == 1
    for b in range(nb):
        base = b * QK8_0
        if vectors:
            amax = u32_as_f32(_block_magnitude_bits(x, base))
        else:  # the largest |v|, NaNs passed over (0 if none)
            amax = np.float32(0.0)
            for j in range(QK8_0):
                v = abs(x[base + j])
                if v > amax:
                    amax = v
        dscale = amax / np.float32(127.0)
        inv = np.float32(127.0) / amax if amax != np.float32(0.0) else np.float32(0.0)
        if vectors:
            total = _round_block(x, base, inv, qs)
        else:
            total = np.int32(0)
            for j in range(QK8_0):
                q = np.int32(np.rint(x[base + j] * inv))
                qs[base + j] = q
                total += q
        d[b] = round_to_f16(dscale)
        s[b] = total


@exact_kernel
def quantize_q8_k(x, qs, d, s):
    """x: float32[n] -> qs int8[n], d float32[n/256], s int32[n/16]; n % 256 == 0.

    llama.cpp's quantize_row_q8_K_ref: the value of largest magnitude (with its sign) maps to -127;
    iscale = -127/max, q = nearest_int(iscale*x) clamped to 127, d = 1/iscale.
    """
    nb = x.shape[0] // QK_K
    for b in range(nb):
        xb, qb = x[b * QK_K : (b + 1) * QK_K], qs[b * QK_K : (b + 1) * QK_K]  # slices: no index wraparound in the loops
        key = largest_magnitude_bits(xb)
        if key >> 32 == 0:  # every value zero (or NaN)
            d[b] = np.float32(0.0)
            for j in range(QK_K):
                qb[j] = 0
            for g in range(QK_K // 16):
                s[b * (QK_K // 16) + g] = 0
            continue
        vmax = xb[QK_K - 1 - (key & 0xFFFFFFFF)]
        iscale = np.float32(-127.0) / vmax
        for j in range(QK_K):
            q = np.int32(np.rint(iscale * xb[j]))
            qb[j] = min(127, q)
        for g in range(QK_K // 16):
            total = 0
            for j in range(16):
                total += qb[g * 16 + j]
            s[b * (QK_K // 16) + g] = total
        d[b] = np.float32(1.0) / iscale


class QuantizedActivation:
    """Preallocated buffers for one activation vector of n floats in pairing format `kind`."""

    def __init__(self, kind: str, n: int):
        self.kind = kind
        self.n = n
        self.x = np.zeros(n, dtype=np.float32)
        if kind == "f32":
            self.arrays = (self.x,)
            return
        block = QK8_0 if kind == "q8_0" else QK_K
        if n % block:
            raise ValueError(f"activation length {n} is not a multiple of {block} ({kind})")
        self.qs = np.zeros(n, dtype=np.int8)
        self.d = np.zeros(n // block, dtype=np.float32)
        self.s = np.zeros(n // (QK8_0 if kind == "q8_0" else 16), dtype=np.int32)
        self.arrays = (self.qs, self.d, self.s)

    def quantize(self, x: np.ndarray) -> tuple:
        """Quantize x (float32[n]) into the buffers; returns the argument tuple vec_dot takes after w."""
        if self.kind == "f32":
            self.x[:] = x
        elif self.kind == "q8_0":
            quantize_q8_0(x, self.qs, self.d, self.s)
        else:
            quantize_q8_k(x, self.qs, self.d, self.s)
        return self.arrays
