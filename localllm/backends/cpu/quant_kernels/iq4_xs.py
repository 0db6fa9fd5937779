"""IQ4_XS's CPU kernels (format: localllm/quant/iq4_xs.py): the one-row dot product with a q8_k activation,
and the row dequantizer in vector code."""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic

from ....jit import exact_kernel, fast_kernel, fma_f32, read_f16
from ....quant.iq4_xs import BLOCK, BLOCK_BYTES, KVALUES, N_SUB, SUB, _D, _QS, _SCALES_H, _SCALES_L, sub_scale
from .iq4_nl import dequantize_indices
from .vector import VectorCode


def emit_scales(v: VectorCode, w_type, w, base):
    """The 8 signed sub-block scales of the block at w[base:] as <8 x i8>, unpacked in vector registers."""
    low_bytes = v.load(w_type, w, v.offset(base, _SCALES_L), 4)
    high_bytes = v.load(w_type, w, v.offset(base, _SCALES_H), 2)  # scales_h, little-endian
    # sub-block k: nibble k%2 of scales_l[k//2], and bits 2k..2k+1 of scales_h (bits 2*(k%4) of byte k//4)
    subs = range(N_SUB)
    low = v.and_(v.shr(v.shuffle(low_bytes, [k // 2 for k in subs]), [4 * (k % 2) for k in subs]), 15)
    high = v.and_(v.shr(v.shuffle(high_bytes, [k // 4 for k in subs]), [2 * (k % 4) for k in subs]), 3)
    return v.builder.sub(v.or_(low, v.shl(high, 4)), v.constant(32, N_SUB, 8))


@intrinsic
def block_sum(typingctx, w, base, aqs, a):
    """sum_k scale_k * <KVALUES[idx_k], a_k> over the 8 sub-blocks of the block at w[base:], against
    aqs[a : a+256], as int32 (table look-up and signed multiply-add in vector registers)."""
    sig = types.int32(w, base, aqs, a)

    def codegen(context, builder, signature, args):
        w_, base_, aqs_, a_ = args
        wt, at = signature.args[0], signature.args[2]
        v = VectorCode(context, builder)
        scales16 = v.widen(emit_scales(v, wt, w_, base_), 16)
        acc = None
        for k in range(N_SUB):
            packed = v.load(wt, w_, v.offset(base_, _QS + 16 * k), 16)
            values = v.lookup16(KVALUES, v.join(v.and_(packed, 15), v.shr(packed, 4)))
            acts = v.load(at, aqs_, v.offset(a_, SUB * k), SUB)
            acc = v.add(acc, v.scale_pairs(v.dot_pairs_signed(values, acts), v.shuffle(scales16, [k] * 16)))
        return v.sum(acc)

    return sig, codegen


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*136] -> out: float32[nb*256], (d * scale_k) * KVALUES[index], the step rounded to
    float32 first (quant.iq4_xs.dequantize_row's bits)."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        d = read_f16(src, base + _D)
        for k in range(N_SUB):
            step = d * np.float32(sub_scale(src, base, k))
            dequantize_indices(src, base + _QS + 16 * k, step, out, b * BLOCK + SUB * k)


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*136] weight row; aqs int8[n], ad float32[n/256], asum int32[n/16]: q8_k activation."""
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        acc = fma_f32(ad[b] * read_f16(w, base + _D), np.float32(block_sum(w, base, aqs, b * BLOCK)), acc)  # block order
    return acc
