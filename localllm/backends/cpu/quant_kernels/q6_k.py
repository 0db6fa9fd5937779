"""Q6_K's CPU kernels (format: localllm/quant/q6_k.py): the vector row dequantizer and the one-row dot
product with a q8_k activation (its block sum and float step are those of q6_k_tiles too)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....jit import exact_kernel, fast_kernel, read_f16
from ....quant.q6_k import BLOCK, BLOCK_BYTES, N_GROUPS, _D, _QH, _QL, _SCALES
from .vector import VectorCode


@intrinsic
def dequantize_half(typingctx, src, ql, qh, out, o, steps):
    """128 elements (half a block): low bits in the 64 bytes at src[ql:], high bits in the 32 at src[qh:];
    out[o + 32*i + l] = steps[2*i + l // 16] * (q - 32) for i < 4, l < 32 (steps: 8 float32)."""
    sig = types.void(src, ql, qh, out, o, steps)

    def codegen(context, builder, signature, args):
        src_, ql_, qh_, out_, o_, steps_ = args
        v = VectorCode(context, builder)
        src_type, out_type = signature.args[0], signature.args[3]
        first = v.load(src_type, src_, ql_, 32)
        second = v.load(src_type, src_, v.offset(ql_, 32), 32)
        high = v.load(src_type, src_, qh_, 32)
        lows = (
            v.and_(first, 15),
            v.and_(second, 15),
            v.shr(first, 4),
            v.shr(second, 4),
        )
        step = [builder.extract_value(steps_, k) for k in range(8)]
        for i, low in enumerate(lows):
            quants = v.or_(low, v.shl(v.and_(v.shr(high, 2 * i), 3), 4))
            signed = builder.sub(quants, v.constant(32, 32, 8))
            v.store_dequantized(
                out_type,
                out_,
                v.offset(o_, 32 * i),
                signed,
                True,
                (step[2 * i], step[2 * i + 1]),
            )
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*210] -> out: float32[nb*256]; each element (d * scale) * (q - 32), the product
    d * scale rounded to float32 first as in the NumPy reference; 128 elements a vector step."""
    scales = src.view(np.int8)
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        d = read_f16(src, base + _D)
        for h in range(2):
            sc = base + _SCALES + 8 * h
            steps = (
                d * np.float32(scales[sc]),
                d * np.float32(scales[sc + 1]),
                d * np.float32(scales[sc + 2]),
                d * np.float32(scales[sc + 3]),
                d * np.float32(scales[sc + 4]),
                d * np.float32(scales[sc + 5]),
                d * np.float32(scales[sc + 6]),
                d * np.float32(scales[sc + 7]),
            )
            dequantize_half(
                src,
                base + _QL + 64 * h,
                base + _QH + 32 * h,
                out,
                b * BLOCK + 128 * h,
                steps,
            )


@intrinsic
def block_sum(typingctx, w, base, aqs, a, asum, group):
    """sum_g scale_g * <q_g, a_g> over the 16 groups of the block at w[base:], against aqs[a : a+256]
    and its group sums asum[group : group+16], as int32.

    Works on the unsigned quants u = q + 32 (two multiply-adds per 32 weights); the offset comes back
    once per block as -32 * sum_g scale_g * asum[g]. Where the target has AVX-512 BW, 64 weights a step
    (512-bit vectors). Each block asks for its cache lines PREFETCH_BYTES further on (one prefetch per 60
    bytes, none skipped): one thread streamed 32 -> 40 GB/s (bench_quant.py), Llama-3-8B's Q6_K decode
    matvecs at 2 threads ~29 -> ~41 GB/s (profile_ops.py).
    """
    sig = types.int32(w, base, aqs, a, asum, group)

    def codegen(context, builder, signature, args):
        w_, base_, aqs_, a_, asum_, group_ = args
        wt, at, st = signature.args[0], signature.args[2], signature.args[4]
        v = VectorCode(context, builder)
        scales = v.load(wt, w_, v.offset(base_, _SCALES), N_GROUPS)  # int8 scales
        for line in range(0, BLOCK_BYTES, 60):  # every cache line of the block PREFETCH_BYTES further on
            v.prefetch(wt, w_, v.offset(base_, line))
        scales16 = v.widen(scales, 16)
        sums = v.load(st, asum_, group_, N_GROUPS)
        offsets = v.mul(v.widen(scales, 32), sums)
        if v.avx512_bw:
            # 64 weights a step: ql[64h : 64h + 64] holds the low bits of elements 128h .. 128h + 63 in its
            # low nibbles and of 128h + 64 .. 128h + 127 in its high nibbles; their high bits are bit
            # pairs 0, 1, 2, 3 of qh[32h : 32h + 32], moved to bits 4-5 (bit_fields_wide).
            acc = None
            for h in range(2):
                low = v.load(wt, w_, v.offset(base_, _QL + 64 * h), 64)
                high = v.load(wt, w_, v.offset(base_, _QH + 32 * h), 32)
                quants = (
                    v.or_(v.and_(low, 15), v.bit_fields_wide(high, {4: 0, 5: 1}, {4: 2, 5: 3})),
                    v.or_(v.shr(low, 4), v.bit_fields_wide(high, {4: 4, 5: 5}, {4: 6, 5: 7})),
                )
                for j, u in enumerate(quants):
                    g = 8 * h + 4 * j  # the 64 elements are groups g .. g+3
                    acts = v.load(at, aqs_, v.offset(a_, 128 * h + 64 * j), 64)
                    group_scales = v.pick_words(v.shuffle(scales16, range(8 * h, 8 * h + 8)), [4 * j + i // 8 for i in range(32)])
                    acc = v.add(acc, v.scale_pairs_wide(v.dot_pairs_wide(u, acts), group_scales))
            # sum(acc) - 32 * sum(offsets), lane by lane: the same wrapping int32 total
            return v.sum(builder.sub(acc, v.shl(offsets, 5)))
        acc = None
        for h in range(2):
            low = v.load(wt, w_, v.offset(base_, _QL + 64 * h), 32)
            low2 = v.load(wt, w_, v.offset(base_, _QL + 64 * h + 32), 32)
            high = v.load(wt, w_, v.offset(base_, _QH + 32 * h), 32)
            quants = (  # elements 128h + 32i + l for i = 0..3 (see the layout above)
                v.or_(v.and_(low, 15), v.shl(v.and_(high, 3), 4)),
                v.or_(v.and_(low2, 15), v.shl(v.and_(high, 12), 2)),
                v.or_(v.shr(low, 4), v.and_(high, 48)),
                v.or_(v.shr(low2, 4), v.and_(v.shr(high, 2), 48)),
            )
            for i, u in enumerate(quants):
                g = 8 * h + 2 * i  # the 32 elements are groups g and g+1
                acts = v.load(at, aqs_, v.offset(a_, 128 * h + 32 * i), 32)
                group_scales = v.shuffle(scales16, [g] * 8 + [g + 1] * 8)
                acc = v.add(acc, v.scale_pairs(v.dot_pairs(u, acts), group_scales))
        offset = v.sum(offsets)
        return builder.sub(v.sum(acc), builder.mul(offset, ir.Constant(offset.type, 32)))

    return sig, codegen


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*210] weight row; aqs int8[n], ad float32[n/256], asum int32[n/16]: q8_k activation.

    All integer work of a super-block is one block_sum; the floats once per block: fma(ad * d, sum, acc).
    """
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        total = block_sum(w, base, aqs, b * BLOCK, asum, b * N_GROUPS)
        acc = accumulate(acc, ad[b], w, base, total)
    return acc


@intrinsic
def accumulate(typingctx, acc, a_scale, w, base, total):
    """fma(ad * d, total, acc), d the float16 field of the block at w[base:]: a super-block's float
    step, the fma rounded once, stated as such. (Written as acc + ad * d * total it had compiled to this
    fma, by LLVM's choice; the results stay those bit for bit, now in every kernel that inlines it.)"""
    sig = types.float32(acc, a_scale, w, base, total)

    def codegen(context, builder, signature, args):
        acc_, ad_, w_, base_, total_ = args
        v = VectorCode(context, builder)
        f32 = ir.FloatType()
        d = builder.extract_element(v.load_f16_splat(signature.args[2], w_, v.offset(base_, _D), 4), ir.Constant(ir.IntType(32), 0))
        # (LLVM still loads the half with vpinsrw into the accumulator's register, whatever form the load
        # takes here: a dependency on the previous block's step, shorter than a block's integer work.)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32")
        scale = builder.fmul(ad_, d, flags=("arcp",))  # a flag that permits nothing here: no fast-math
        return builder.call(fma, [scale, builder.sitofp(total_, f32), acc_])

    return sig, codegen
