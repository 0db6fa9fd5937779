"""Q4_K's CPU kernels (format: localllm/quant/q4_k.py): the vector row dequantizer and the one-row dot
product with a q8_k activation, with the scale/min unpacking in vector registers that Q5_K's kernels and
the multi-row kernels (kquant_rows, q4_k_tiles, q4_k_x16) share."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....jit import exact_kernel, fast_kernel, read_f16
from ....quant.q4_k import BLOCK, BLOCK_BYTES, N_SUB, SUB, _D, _DMIN, _QS, _SCALES, scale_min
from .vector import VectorCode


@intrinsic
def dequantize_pair(typingctx, src, qs, out, o, step_lo, off_lo, step_hi, off_hi):
    """out[o : o + 32] = step_lo * low nibbles - off_lo and out[o + 32 : o + 64] = step_hi * high nibbles
    - off_hi, for the 32 bytes at src[qs:] (one pair of sub-blocks)."""
    sig = types.void(src, qs, out, o, step_lo, off_lo, step_hi, off_hi)

    def codegen(context, builder, signature, args):
        src_, qs_, out_, o_, step_lo_, off_lo_, step_hi_, off_hi_ = args
        v = VectorCode(context, builder)
        packed = v.load(signature.args[0], src_, qs_, SUB)
        out_type = signature.args[2]
        v.store_dequantized(
            out_type,
            out_,
            o_,
            v.and_(packed, 15),
            False,
            (step_lo_, step_lo_),
            (off_lo_, off_lo_),
        )
        v.store_dequantized(
            out_type,
            out_,
            v.offset(o_, SUB),
            v.shr(packed, 4),
            False,
            (step_hi_, step_hi_),
            (off_hi_, off_hi_),
        )
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*144] -> out: float32[nb*256]. Each lane step * q - offset, with step = d * scale and
    offset = dmin * min rounded to float32 first, as the NumPy reference (and gguf-py) compute it; the
    64 elements of a sub-block pair in one vector step (dequantize_pair): the scalar loop ran at 0.4 GB/s."""
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
                out,
                b * BLOCK + 2 * SUB * c,
                d * np.float32(sc_lo),
                dmin * np.float32(mn_lo),
                d * np.float32(sc_hi),
                dmin * np.float32(mn_hi),
            )


@exact_kernel
def read_u32(w, offset):
    return (
        np.uint32(w[offset])
        | (np.uint32(w[offset + 1]) << np.uint32(8))
        | (np.uint32(w[offset + 2]) << np.uint32(16))
        | (np.uint32(w[offset + 3]) << np.uint32(24))
    )


@exact_kernel
def scale_min_words(w, offset):
    """The 12 packed bytes at w[offset:] -> 4 little-endian words holding the 8 scales then the 8 mins,
    one byte each, unpacked 4 at a time with byte masks (ggml's kmask trick)."""
    low = read_u32(w, offset)  # scales 0..3 and the top bits of scales 4..7
    mid = read_u32(w, offset + 4)  # mins 0..3 and the top bits of mins 4..7
    high = read_u32(w, offset + 8)  # low 4 bits of scales 4..7 | mins 4..7 << 4
    six_bits, four_bits, two_bits = (
        np.uint32(0x3F3F3F3F),
        np.uint32(0x0F0F0F0F),
        np.uint32(0x03030303),
    )
    scales_0_3 = low & six_bits
    scales_4_7 = (high & four_bits) | (((low >> np.uint32(6)) & two_bits) << np.uint32(4))
    mins_0_3 = mid & six_bits
    mins_4_7 = ((high >> np.uint32(4)) & four_bits) | (((mid >> np.uint32(6)) & two_bits) << np.uint32(4))
    return scales_0_3, scales_4_7, mins_0_3, mins_4_7


def emit_scales_and_mins(v: VectorCode, words):
    """(per-sub-block scale vectors <16 x i16> for k = 0..7, mins <8 x i32>) from scale_min_words."""
    codes = v.bitcast(v.from_scalars(words, 32), 16, 8)  # bytes: scales 0..7, mins 0..7
    codes16 = v.widen(codes, 16, signed=False)
    scale_vectors = [v.shuffle(codes16, [k] * 16) for k in range(N_SUB)]
    mins = v.widen(v.shuffle(codes, range(8, 16)), 32, signed=False)
    return scale_vectors, mins


def emit_mins_sum(v: VectorCode, mins, asum_type, asum, group):
    """sum_k mins[k] * (asum[group + 2k] + asum[group + 2k + 1]): the mins' share of the dot product."""
    sums = v.load(asum_type, asum, group, 16)
    pair_sums = v.builder.add(v.shuffle(sums, range(0, 16, 2)), v.shuffle(sums, range(1, 16, 2)))
    return v.sum(v.mul(mins, pair_sums))


def emit_scale_min_codes(v: VectorCode, w_type, w, offset):
    """The 12 packed bytes at w[offset:] -> <16 x i8>: the 8 scales then the 8 mins (what
    scale_min_words returns, as one vector): the kmask unpacking on the four 32-bit words [low, mid,
    high, -] at once (the 16-byte load reads 4 bytes past the scales, inside the block)."""
    builder = v.builder
    raw = v.bitcast(v.load(w_type, w, offset, 16), 4, 32)  # low, mid, high, (the first quants)
    fields = v.shuffle(raw, [0, 2, 1, 2])  # low, high, mid, high
    tops = v.shuffle(raw, [0, 0, 1, 1])  # -, low, -, mid
    i32x4 = v.vector_type(4, 32)
    bottom = builder.and_(v.shr(fields, [0, 0, 0, 4]), ir.Constant(i32x4, [0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F]))
    top = builder.and_(v.shr(tops, [0, 6, 0, 6]), ir.Constant(i32x4, [0, 0x03030303, 0, 0x03030303]))
    return v.bitcast(v.or_(bottom, v.shl(top, 4)), 16, 8)


@intrinsic
def block_sums(typingctx, w, base, aqs, a, asum, group):
    """(sum_k scale_k * <q_k, a_k>, sum_k min_k * <1, a_k>) for the block at w[base:], against
    aqs[a : a+256] and the 16-element sums asum[group : group+16]; both int32.

    Where the target has AVX-512 BW, a pair of sub-blocks (32 packed bytes, 64 weights) is one 512-bit
    step: the nibbles split (one gf2p8affineqb with GFNI), vpmaddubsw against the 64 activation bytes,
    vpmaddwd by the two sub-blocks' scales (vpshufb picks them) — with AVX-512 VNNI two pairs at a time
    by scaled_quads_wide (vpdpbusd, vpackssdw, vpmaddwd: 3-5% faster in cache on Zen 4); then the
    accumulator's halves are added,
    the mins multiply the pair sums asum[2k] + asum[2k+1] on 8 lanes, and both sums come out of one
    halving tree (measured: 4-6% faster than the mins on 16 lanes). Elsewhere 256-bit steps per
    sub-block. The integers are the same either way (wrapping int32 sums, in any order).

    Each block asks for its cache lines PREFETCH_BYTES further on (one prefetch per 48 bytes, so no line
    of a 144-byte block is skipped): the decode matvec of Llama-3-8B's Q4_K matrices at 2 threads went from
    ~31 to ~41 GB/s of weights (scripts/profile_ops.py), the hardware prefetcher alone not keeping up."""
    sig = types.UniTuple(types.int32, 2)(w, base, aqs, a, asum, group)

    def codegen(context, builder, signature, args):
        w_, base_, aqs_, a_, asum_, group_ = args
        wt, at, st = signature.args[0], signature.args[2], signature.args[4]
        v = VectorCode(context, builder)
        codes = emit_scale_min_codes(v, wt, w_, v.offset(base_, _SCALES))
        for line in range(0, BLOCK_BYTES, 48):  # every cache line of the block PREFETCH_BYTES further on
            v.prefetch(wt, w_, v.offset(base_, line))
        codes16 = v.widen(codes, 16, signed=False)
        sums = v.load(st, asum_, group_, 16)
        if v.avx512_bw:
            low8 = v.shuffle(codes16, range(8))
            quants, acts = [], []
            for c in range(N_SUB // 2):
                packed = v.load(wt, w_, v.offset(base_, _QS + SUB * c), SUB)
                quants.append(v.bit_fields_wide(packed, {j: j for j in range(4)}, {j: j + 4 for j in range(4)}))
                acts.append(v.load(at, aqs_, v.offset(a_, 2 * SUB * c), 2 * SUB))
            acc = None
            if v.avx512_vnni:  # pairs c = 2j, 2j + 1 together: sub-block 2c + (element >= 32)
                for j in range(2):
                    scales = v.quad_scales(low8, lambda which, element, j=j: 2 * (2 * j + which) + element // 32)
                    acc = v.add(acc, v.scaled_quads_wide([(quants[c], acts[c]) for c in (2 * j, 2 * j + 1)], scales))
            else:
                for c in range(N_SUB // 2):
                    scales = v.pick_words(low8, [2 * c] * 16 + [2 * c + 1] * 16)
                    acc = v.add(acc, v.scale_pairs_wide(v.dot_pairs_wide(quants[c], acts[c]), scales))
            # both sums from 8 lanes: acc's halves added, the mins against the pairs of sums (256-bit work)
            acc = builder.add(v.shuffle(acc, range(8)), v.shuffle(acc, range(8, 16)))
            pair_sums = builder.add(v.shuffle(sums, range(0, 16, 2)), v.shuffle(sums, range(1, 16, 2)))
            mins = v.widen(v.shuffle(codes, range(8, 16)), 32, signed=False)
            scaled, mins_sum = v.sum_two(acc, v.mul(mins, pair_sums))
            return context.make_tuple(builder, signature.return_type, [scaled, mins_sum])
        acc = None
        for c in range(N_SUB // 2):
            packed = v.load(wt, w_, v.offset(base_, _QS + SUB * c), SUB)
            for half, quants in enumerate((v.and_(packed, 15), v.shr(packed, 4))):
                k = 2 * c + half
                acts = v.load(at, aqs_, v.offset(a_, SUB * k), SUB)
                acc = v.add(acc, v.scale_pairs(v.dot_pairs(quants, acts), v.shuffle(codes16, [k] * 16)))
        mins = v.widen(v.shuffle(codes, range(8, 16)), 32, signed=False)
        pair_sums = builder.add(v.shuffle(sums, range(0, 16, 2)), v.shuffle(sums, range(1, 16, 2)))
        return context.make_tuple(builder, signature.return_type, [v.sum(acc), v.sum(v.mul(mins, pair_sums))])

    return sig, codegen


# Flags of the float step's multiply: a flag that permits nothing here (no division), so that Numba's
# fast-math pass, which flags every unflagged float operation of a fast kernel, leaves it alone.
NO_FAST_MATH = ("arcp",)


@intrinsic
def accumulate(typingctx, acc, a_scale, w, base, scaled, mins):
    """fma(ad, fma(d, scaled, -(dmin * mins)), acc), d and dmin the float16 fields of the block at
    w[base:]: a super-block's float step, each fma rounded once, stated as such. (Written as
    acc + ad * (d * scaled - dmin * mins) it had compiled to these two fmas, by LLVM's choice; the
    results stay those bit for bit, now in every kernel that inlines it.) d and dmin come from one
    4-byte load converted as a vector (a lone half was loaded with vpinsrw, merging into the register
    of the float accumulator: a false dependency on the previous block's step)."""
    sig = types.float32(acc, a_scale, w, base, scaled, mins)

    def codegen(context, builder, signature, args):
        acc_, ad_, w_, base_, scaled_, mins_ = args
        v = VectorCode(context, builder)
        f32 = ir.FloatType()
        data = v._data(signature.args[2], w_)
        pointer = builder.bitcast(builder.gep(data, [v.offset(base_, _D)]), ir.VectorType(ir.IntType(16), 2).as_pointer())
        halves = builder.bitcast(builder.load(pointer, align=1), ir.VectorType(ir.HalfType(), 2))
        d_dmin = builder.fpext(halves, ir.VectorType(f32, 2))
        d = builder.extract_element(d_dmin, ir.Constant(ir.IntType(32), 0))
        dmin = builder.extract_element(d_dmin, ir.Constant(ir.IntType(32), 1))
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32")
        mins_term = builder.fmul(dmin, builder.sitofp(mins_, f32), flags=NO_FAST_MATH)
        step = builder.call(fma, [d, builder.sitofp(scaled_, f32), builder.fneg(mins_term, flags=NO_FAST_MATH)])
        return builder.call(fma, [ad_, step, acc_])

    return sig, codegen


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*144] weight row; aqs int8[n], ad float32[n/256], asum int32[n/16]: q8_k activation.

    Per super-block, in integers: sum_k scale_k * <q_k, a_k> (block_sums: two multiply-adds per 32
    weights), and the mins through the activation's 16-element sums: sum_k min_k * (asum[2k] +
    asum[2k+1]). Only then the floats: fma(ad, fma(d, scaled, -(dmin * mins)), acc) (accumulate).
    """
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        scaled, mins = block_sums(w, base, aqs, b * BLOCK, asum, b * (BLOCK // 16))
        acc = accumulate(acc, ad[b], w, base, scaled, mins)
    return acc
