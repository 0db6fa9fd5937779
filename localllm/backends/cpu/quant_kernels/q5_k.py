"""Q5_K's CPU kernels (format: localllm/quant/q5_k.py): the vector row dequantizer and the one-row dot
product with a q8_k activation (Q4_K's scale/min unpacking, a fifth bit per quant)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ....jit import exact_kernel, fast_kernel, read_f16
from ....quant.q5_k import BLOCK, BLOCK_BYTES, N_SUB, SUB, _D, _DMIN, _QH, _QS, _SCALES, scale_min
from .q4_k import accumulate, emit_mins_sum, emit_scales_and_mins, scale_min_words
from .vector import VectorCode


@intrinsic
def dequantize_pair(typingctx, src, qs, qh, c, out, o, step_lo, off_lo, step_hi, off_hi):
    """Sub-blocks 2c and 2c+1 of a block: nibbles at src[qs : qs + 32], fifth bits 2c and 2c+1 of the
    32 bytes at src[qh:]; out[o : o + 64] = step * q - offset (each half with its own step and offset)."""
    sig = types.void(src, qs, qh, c, out, o, step_lo, off_lo, step_hi, off_hi)

    def codegen(context, builder, signature, args):
        src_, qs_, qh_, c_, out_, o_, step_lo_, off_lo_, step_hi_, off_hi_ = args
        v = VectorCode(context, builder)
        src_type, out_type = signature.args[0], signature.args[4]
        packed = v.load(src_type, src_, qs_, SUB)
        shift = v.splat(builder.trunc(builder.shl(c_, ir.Constant(c_.type, 1)), ir.IntType(8)), SUB)
        high = builder.lshr(v.load(src_type, src_, qh_, SUB), shift)  # bit 2c now bit 0, bit 2c+1 bit 1
        low_quants = v.or_(v.and_(packed, 15), v.shl(v.and_(high, 1), 4))
        high_quants = v.or_(v.shr(packed, 4), v.shl(v.and_(high, 2), 3))
        v.store_dequantized(
            out_type,
            out_,
            o_,
            low_quants,
            False,
            (step_lo_, step_lo_),
            (off_lo_, off_lo_),
        )
        v.store_dequantized(
            out_type,
            out_,
            v.offset(o_, SUB),
            high_quants,
            False,
            (step_hi_, step_hi_),
            (off_hi_, off_hi_),
        )
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*176] -> out: float32[nb*256]; as Q4_K's (vector code per sub-block pair)."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        d = read_f16(src, base + _D)
        dmin = read_f16(src, base + _DMIN)
        for c in range(N_SUB // 2):
            sc_lo, mn_lo = scale_min(src, base + _SCALES, 2 * c)
            sc_hi, mn_hi = scale_min(src, base + _SCALES, 2 * c + 1)
            dequantize_pair(
                src,
                base + _QS + SUB * c,
                base + _QH,
                c,
                out,
                b * BLOCK + 2 * SUB * c,
                d * np.float32(sc_lo),
                dmin * np.float32(mn_lo),
                d * np.float32(sc_hi),
                dmin * np.float32(mn_hi),
            )


@intrinsic
def block_sums(typingctx, w, base, aqs, a, asum, group, words):
    """(sum_k scale_k * <q_k, a_k>, sum_k min_k * <1, a_k>) for the block at w[base:], against
    aqs[a : a+256] and the 16-element sums asum[group : group+16]; as Q4_K's, with the 5th bits."""
    sig = types.UniTuple(types.int32, 2)(w, base, aqs, a, asum, group, words)

    def codegen(context, builder, signature, args):
        w_, base_, aqs_, a_, asum_, group_, words_ = args
        v = VectorCode(context, builder)
        scale_vectors, mins = emit_scales_and_mins(v, [builder.extract_value(words_, i) for i in range(4)])
        high = v.load(signature.args[0], w_, v.offset(base_, _QH), SUB)
        acc = None
        for c in range(N_SUB // 2):
            packed = v.load(signature.args[0], w_, v.offset(base_, _QS + SUB * c), SUB)
            for half, low in enumerate((v.and_(packed, 15), v.shr(packed, 4))):
                k = 2 * c + half
                quants = v.or_(low, v.shl(v.and_(v.shr(high, k), 1), 4))  # bit k of qh[l] is the 5th bit
                acts = v.load(signature.args[2], aqs_, v.offset(a_, SUB * k), SUB)
                acc = v.add(acc, v.scale_pairs(v.dot_pairs(quants, acts), scale_vectors[k]))
        mins_sum = emit_mins_sum(v, mins, signature.args[4], asum_, group_)
        return context.make_tuple(builder, signature.return_type, [v.sum(acc), mins_sum])

    return sig, codegen


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*176] weight row; aqs int8[n], ad float32[n/256], asum int32[n/16]: q8_k activation.

    As Q4_K: integer sums per super-block (block_sums), the mins through the 16-element sums, then
    Q4_K's float step (q4_k.accumulate: d and dmin sit at the same offsets),
    fma(ad, fma(d, float(scaled), -(dmin * float(mins))), acc), stated so that the multi-row kernels
    (kquant_rows) can repeat it exactly. (Written as acc += ad * (d * scaled - dmin * mins) it had
    compiled to the same, measured bit for bit on 360 rows of 256..14336.)
    """
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        words = scale_min_words(w, base + _SCALES)
        scaled, mins = block_sums(w, base, aqs, b * BLOCK, asum, b * (BLOCK // 16), words)
        acc = accumulate(acc, ad[b], w, base, scaled, mins)
    return acc
