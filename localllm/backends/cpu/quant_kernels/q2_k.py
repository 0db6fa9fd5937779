"""Q2_K's CPU kernel (format: localllm/quant/q2_k.py): the one-row dot product with a q8_k activation."""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic

from ....jit import exact_kernel
from ....quant.q2_k import BLOCK, BLOCK_BYTES, N_GROUPS, _D, _QS, _SCALES
from .q4_k import accumulate
from .vector import VectorCode


@intrinsic
def block_sums(typingctx, w, base, aqs, a, asum, group):
    """(sum_g scale_g * <q_g, a_g>, sum_g min_g * asum[group + g]) for the block at w[base:], against
    aqs[a : a+256] and its group sums asum[group : group+16]; both int32. Where the target has AVX-512
    BW, 64 weights a step with prefetch (_block_sums_wide); exact integers either way."""
    sig = types.UniTuple(types.int32, 2)(w, base, aqs, a, asum, group)

    def codegen(context, builder, signature, args):
        w_, base_, aqs_, a_, asum_, group_ = args
        wt, at, st = signature.args[0], signature.args[2], signature.args[4]
        v = VectorCode(context, builder)
        packed = v.load(wt, w_, v.offset(base_, _SCALES), N_GROUPS)
        scales16 = v.widen(v.and_(packed, 15), 16, signed=False)
        if v.avx512_bw:
            totals = _block_sums_wide(v, (wt, w_, base_), (at, aqs_, a_), (st, asum_, group_), packed, scales16)
            return context.make_tuple(builder, signature.return_type, totals)
        acc = None
        for h in range(2):
            qs = v.load(wt, w_, v.offset(base_, _QS + 32 * h), 32)
            for j in range(4):
                g = 8 * h + 2 * j  # elements 128h + 32j .. +32 are groups g and g+1
                acts = v.load(at, aqs_, v.offset(a_, 128 * h + 32 * j), 32)
                group_scales = v.shuffle(scales16, [g] * 8 + [g + 1] * 8)
                acc = v.add(acc, v.scale_pairs(v.dot_pairs(v.and_(v.shr(qs, 2 * j), 3), acts), group_scales))
        mins = v.widen(v.shr(packed, 4), 32, signed=False)
        mins_sum = v.sum(v.mul(mins, v.load(st, asum_, group_, N_GROUPS)))
        return context.make_tuple(builder, signature.return_type, [v.sum(acc), mins_sum])

    return sig, codegen


def _block_sums_wide(v: VectorCode, weights, acts, sums, packed, scales16):
    """block_sums on 512-bit vectors (two_bit_sums_wide), the two totals by one halving tree."""
    wt, w_, base_ = weights
    st, asum_, group_ = sums
    for line in range(0, BLOCK_BYTES, 60):  # every cache line of the block PREFETCH_BYTES further on
        v.prefetch(wt, w_, v.offset(base_, line))
    mins = v.mul(v.widen(v.shr(packed, 4), 32, signed=False), v.load(st, asum_, group_, N_GROUPS))
    return list(v.sum_two(two_bit_sums_wide(v, weights, _QS, acts, scales16), mins))


def two_bit_sums_wide(v: VectorCode, weights, qs_at: int, acts, scales16, high_bits=None):
    """<16 x i32> partial sums of scale_g * u * a over one super-block whose low 2 bits lie as Q2_K's and
    Q3_K's qs (at byte qs_at of the block: 32 bytes per 128 elements, field j of byte l is element 32j +
    l), 64 weights a step: elements 128h + 64i .. +64 are fields 2i and 2i + 1 of qs[32h : 32h + 32],
    gathered by bit_fields_wide (one gf2p8affineqb with GFNI), against their 64 activations, by the
    scales of groups 8h + 4i .. +3 (scales16: <16 x i16>). high_bits(h, j0, j1): a <64 x i8> OR-ed into
    those fields (Q3_K's third bit), or None. weights, acts: (array type, array, byte/element index)."""
    wt, w_, base_ = weights
    at, aqs_, a_ = acts
    acc = None
    for h in range(2):
        qs = v.load(wt, w_, v.offset(base_, qs_at + 32 * h), 32)
        half_scales = v.shuffle(scales16, range(8 * h, 8 * h + 8))
        for i in range(2):
            j0, j1 = 2 * i, 2 * i + 1
            quants = v.bit_fields_wide(qs, {0: 2 * j0, 1: 2 * j0 + 1}, {0: 2 * j1, 1: 2 * j1 + 1})
            if high_bits is not None:
                quants = v.or_(quants, high_bits(h, j0, j1))
            activations = v.load(at, aqs_, v.offset(a_, 128 * h + 64 * i), 64)
            group_scales = v.pick_words(half_scales, [4 * i + k // 8 for k in range(32)])
            acc = v.add(acc, v.scale_pairs_wide(v.dot_pairs_wide(quants, activations), group_scales))
    return acc


@exact_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*84] weight row; aqs int8[n], ad float32[n/256], asum int32[n/16]: q8_k activation.

    Per super-block, in integers: sum_g scale_g * <q_g, a_g> and the mins through the activation's group
    sums; then the float step stated as fmas, fma(ad, fma(d, scaled, -(dmin * mins)), acc)
    (q4_k.accumulate: d and dmin are adjacent float16s there too), so that the tiles (q2_k_tiles) can
    compute each lane's bits (written `acc += ad * (d * scaled - dmin * mins)` under fast-math, LLVM
    was free to contract it differently per kernel).
    """
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        scaled, mins = block_sums(w, base, aqs, b * BLOCK, asum, b * N_GROUPS)
        acc = accumulate(acc, ad[b], w, base + _D, scaled, mins)
    return acc
