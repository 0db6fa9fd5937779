"""IQ4_NL's CPU kernels (format: localllm/quant/iq4_nl.py): the one-row dot product with a q8_0 activation,
and the row dequantizer in vector code."""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic

from ....jit import exact_kernel, fast_kernel, fma_f32, read_f16
from ....quant.iq4_nl import BLOCK, BLOCK_BYTES, KVALUES
from .vector import VectorCode


@intrinsic
def block_dot(typingctx, w, qs, aqs, a):
    """<KVALUES[indices], aqs[a : a+32]> for the 16 index bytes at w[qs:], as int32."""
    sig = types.int32(w, qs, aqs, a)

    def codegen(context, builder, signature, args):
        w_, qs_, aqs_, a_ = args
        v = VectorCode(context, builder)
        packed = v.load(signature.args[0], w_, qs_, 16)
        values = v.lookup16(KVALUES, v.join(v.and_(packed, 15), v.shr(packed, 4)))
        acts = v.load(signature.args[2], aqs_, a_, BLOCK)
        return v.sum(v.scale_pairs(v.dot_pairs_signed(values, acts), v.constant(1, 16, 16)))

    return sig, codegen


@intrinsic
def dequantize_indices(typingctx, src, qs, step, out, o):
    """out[o : o+32] = step * KVALUES[index] for the 32 indices packed at src[qs : qs+16] (low nibbles
    first), each lane one IEEE float32 product (what the NumPy reference computes)."""
    sig = types.void(src, qs, step, out, o)

    def codegen(context, builder, signature, args):
        src_, qs_, step_, out_, o_ = args
        v = VectorCode(context, builder)
        packed = v.load(signature.args[0], src_, qs_, 16)
        values = v.lookup16(KVALUES, v.join(v.and_(packed, 15), v.shr(packed, 4)))
        step32 = context.cast(builder, step_, signature.args[2], types.float32)
        v.store_dequantized(signature.args[3], out_, o_, values, True, (step32, step32))
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*18] -> out: float32[nb*32], d * KVALUES[index] (quant.iq4_nl.dequantize_row's bits)."""
    for b in range(out.shape[0] // BLOCK):
        dequantize_indices(src, b * BLOCK_BYTES + 2, read_f16(src, b * BLOCK_BYTES), out, b * BLOCK)


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*18] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32]: q8_0 activation."""
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        total = block_dot(w, b * BLOCK_BYTES + 2, aqs, b * BLOCK)
        acc = fma_f32(np.float32(total), read_f16(w, b * BLOCK_BYTES) * ad[b], acc)  # in block order, everywhere
    return acc
