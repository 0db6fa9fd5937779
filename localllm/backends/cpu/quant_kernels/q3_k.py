"""Q3_K's CPU kernel (format: localllm/quant/q3_k.py): the one-row dot product with a q8_k activation."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ....jit import exact_kernel, fma_f32, read_f16
from ....quant.q3_k import BLOCK, BLOCK_BYTES, N_GROUPS, _D, _HMASK, _QS, _SCALES
from .q2_k import two_bit_sums_wide
from .vector import VectorCode


def emit_scales(v: VectorCode, w_type, w, base):
    """The 16 signed scales of the block at w[base:] as <16 x i8>, unpacked in vector registers.

    Reads the 12 packed bytes as 8 + 4 (a 16-byte load could run past the end of the last block).
    """
    first8 = v.load(w_type, w, v.offset(base, _SCALES), 8)
    last4 = v.load(w_type, w, v.offset(base, _SCALES + 8), 4)
    low = v.join(v.and_(first8, 15), v.shr(first8, 4))  # groups 0..7, then 8..15
    # group g's top 2 bits: bits 2*(g//4) of byte 8 + g%4
    spread = v.shuffle(last4, [g % 4 for g in range(N_GROUPS)])
    high = v.and_(v.shr(spread, [2 * (g // 4) for g in range(N_GROUPS)]), 3)
    return v.builder.sub(v.or_(low, v.shl(high, 4)), v.constant(32, N_GROUPS, 8))


@intrinsic
def block_sum(typingctx, w, base, aqs, a, asum, group):
    """sum_g scale_g * <q_g, a_g> over the 16 groups of the block at w[base:], against aqs[a : a+256]
    and its group sums asum[group : group+16], as int32.

    Works on the unsigned quants u = q + 4 = low | high << 2; the offset -4 comes back once per block
    as -4 * sum_g scale_g * asum[g]. Where the target has AVX-512 BW, 64 weights a step, each block asking
    for its cache lines PREFETCH_BYTES further on (as q6_k.block_sum). The total is an exact integer, so
    the two paths give the same value.
    """
    sig = types.int32(w, base, aqs, a, asum, group)

    def codegen(context, builder, signature, args):
        w_, base_, aqs_, a_, asum_, group_ = args
        wt, at, st = signature.args[0], signature.args[2], signature.args[4]
        v = VectorCode(context, builder)
        scales = emit_scales(v, wt, w_, base_)
        scales16 = v.widen(scales, 16)
        hmask = v.load(wt, w_, v.offset(base_, _HMASK), 32)
        if v.avx512_bw:
            return _block_sum_wide(v, (wt, w_, base_), (at, aqs_, a_), (st, asum_, group_), scales, scales16, hmask)
        acc = None
        for h in range(2):
            qs = v.load(wt, w_, v.offset(base_, _QS + 32 * h), 32)
            for j in range(4):
                g = 8 * h + 2 * j  # elements 128h + 32j .. +32 are groups g and g+1
                u = v.or_(v.and_(v.shr(qs, 2 * j), 3), v.shl(v.and_(v.shr(hmask, 4 * h + j), 1), 2))
                acts = v.load(at, aqs_, v.offset(a_, 128 * h + 32 * j), 32)
                group_scales = v.shuffle(scales16, [g] * 8 + [g + 1] * 8)
                acc = v.add(acc, v.scale_pairs(v.dot_pairs(u, acts), group_scales))
        offset = v.sum(v.mul(v.widen(scales, 32), v.load(st, asum_, group_, N_GROUPS)))
        return builder.sub(v.sum(acc), builder.mul(offset, ir.Constant(offset.type, 4)))

    return sig, codegen


def _block_sum_wide(v: VectorCode, weights, acts, sums, scales, scales16, hmask):
    """block_sum on 512-bit vectors: Q2_K's two_bit_sums_wide with bit 4h + j of hmask as each field's
    third bit (bit_fields_wide again), then one sum per block."""
    wt, w_, base_ = weights
    st, asum_, group_ = sums
    for line in range(0, BLOCK_BYTES, 60):  # every cache line of the block PREFETCH_BYTES further on
        v.prefetch(wt, w_, v.offset(base_, line))
    offsets = v.mul(v.widen(scales, 32), v.load(st, asum_, group_, N_GROUPS))

    def high_bits(h, j0, j1):
        return v.bit_fields_wide(hmask, {2: 4 * h + j0}, {2: 4 * h + j1})

    acc = two_bit_sums_wide(v, weights, _QS, acts, scales16, high_bits)
    # sum(acc) - 4 * sum(offsets), lane by lane: the same wrapping int32 total
    return v.sum(v.builder.sub(acc, v.shl(offsets, 2)))


@exact_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*110] weight row; aqs int8[n], ad float32[n/256], asum int32[n/16]: q8_k activation.

    The float step once per block, stated: fma(ad * d, total, acc) (as q6_k.accumulate), so that the
    tiles (q3_k_tiles) compute each lane's bits (`acc += ad * d * total` under fast-math left LLVM free
    to contract it differently per kernel)."""
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        total = block_sum(w, base, aqs, b * BLOCK, asum, b * N_GROUPS)
        acc = fma_f32(ad[b] * read_f16(w, base + _D), np.float32(total), acc)
    return acc
