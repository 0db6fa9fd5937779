"""Q4_K: 256 weights per 144-byte super-block, 4-bit quants with 6-bit scales and mins per 32.

Block layout (ggml `block_q4_K`), little-endian:
  bytes  0..1     d          float16   super-block scale of the sub-block scales
  bytes  2..3     dmin       float16   super-block scale of the sub-block mins
  bytes  4..15    scales[12]           8 (scale, min) pairs of 6 bits, packed as below
  bytes 16..143   qs[128]              4-bit quants, two per byte

The eight sub-blocks k = 0..7 hold elements 32k..32k+31. Sub-blocks 2c and 2c+1 share the 32 bytes
qs[32c .. 32c+31]: sub-block 2c in the low nibbles, 2c+1 in the high nibbles (element 64c+l is the low
nibble of qs[32c+l], element 64c+32+l its high nibble).

6-bit scale/min packing (ggml's get_scale_min_k4), s = scales[12]:
  k < 4:  scale = s[k] & 63                        min = s[k+4] & 63
  k >= 4: scale = (s[k+4] & 15) | (s[k-4] >> 6) << 4   min = (s[k+4] >> 4) | (s[k] >> 6) << 4
i.e. bytes 0..3 hold scales 0..3 and the top 2 bits of scales 4..7; bytes 4..7 the same for the mins;
bytes 8..11 the low 4 bits of scale (low nibble) and min (high nibble) 4..7.

Weight = (d * scale_k) * q - (dmin * min_k), each product rounded to float32 first (llama.cpp's order).
Q5_K uses the same scale packing (it imports the helpers here).

Pairs with q8_k activations. The quantizer is llama.cpp's quantize_row_q4_K_ref (no importance matrix).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import QuantType
from .jit import exact_kernel, f16_to_f32, f32_to_f16_bits, fast_kernel, read_f16
from .q8_k import QK_K, as_blocks, as_float_blocks, f16_field, nearest_int
from .vector import VectorCode

BLOCK = QK_K
BLOCK_BYTES = 144
SUB = 32  # elements per sub-block
N_SUB = QK_K // SUB

_D, _DMIN, _SCALES, _QS = 0, 2, 4, 16


# ----- scale / min packing (shared with Q5_K) -----


def unpack_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint8[blocks, 12] -> (scales, mins), each uint8[blocks, 8] (6-bit values)."""
    low, mid, high = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([low & 63, (high & 15) | ((low >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 63, (high >> 4) | ((mid >> 6) << 4)], axis=1)
    return scales, mins


@exact_kernel
def scale_min(w, offset, k):
    """(scale, min) of sub-block k from the 12 packed bytes at w[offset:offset+12], as int32."""
    if k < 4:
        return np.int32(w[offset + k] & 63), np.int32(w[offset + k + 4] & 63)
    packed = w[offset + k + 4]
    sc = (packed & 15) | ((w[offset + k - 4] >> 6) << 4)
    mn = (packed >> 4) | ((w[offset + k] >> 6) << 4)
    return np.int32(sc), np.int32(mn)


@exact_kernel
def pack_scales_mins(scales, mins, out, offset):
    """Inverse of scale_min: 8 six-bit scales and mins (uint8[8] each) -> out[offset:offset+12]."""
    for k in range(4):
        out[offset + k] = scales[k]
        out[offset + k + 4] = mins[k]
    for k in range(4, 8):
        out[offset + k + 4] = (scales[k] & 15) | ((mins[k] & 15) << 4)
        out[offset + k - 4] |= (scales[k] >> 4) << 6
        out[offset + k] |= (mins[k] >> 4) << 6


# ----- dequantization -----


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*144] -> float32[..., nb*256]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "Q4_K")
    scales, mins = unpack_scales_mins(blocks[:, _SCALES:_QS])
    step = f16_field(blocks, _D) * scales.astype(np.float32)  # [nb, 8]: d * scale_k, rounded to f32
    offset = f16_field(blocks, _DMIN) * mins.astype(np.float32)
    packed = blocks[:, _QS:].reshape(-1, N_SUB // 2, 1, SUB)
    q = np.concatenate([packed & 15, packed >> 4], axis=2).reshape(-1, N_SUB, SUB).astype(np.float32)
    out = step[:, :, None] * q - offset[:, :, None]
    return out.reshape(*np.shape(raw)[:-1], -1)


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


# ----- dot product with a q8_k activation -----


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


# ----- quantization (llama.cpp's quantize_row_q4_K_ref) -----


@exact_kernel
def fit_error(diff, use_mad):
    """ggml's error measure: |diff| (use_mad, Q2_K) or diff^2."""
    return abs(diff) if use_mad else diff * diff


@exact_kernel
def make_qkx2_quants(nmax, x, weights, levels, scratch, rmin, rdelta, nstep, use_mad):
    """ggml's make_qkx2_quants: fit x ~ scale*L - min (min >= 0), L in 0..nmax.

    Starts from the plain min/max fit, then tries nstep+1 stretched grids (iscale from
    (rmin + rdelta*is + nmax)/(max - min)), each refined by a weighted least-squares (scale, min), and
    keeps the one of least weighted error (squared, or absolute with use_mad). Writes levels (uint8)
    and returns (scale, min). Every operation is float32 in ggml's order so the chosen levels match
    llama.cpp's.
    """
    n = x.shape[0]
    lo = x[0]
    hi = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < lo:
            lo = x[i]
        if x[i] > hi:
            hi = x[i]
        sum_w += weights[i]
        sum_x += weights[i] * x[i]
    if lo > np.float32(0.0):
        lo = np.float32(0.0)
    if hi == lo:
        for i in range(n):
            levels[i] = 0
        return np.float32(0.0), -lo
    fmax = np.float32(nmax)
    iscale = fmax / (hi - lo)
    scale = np.float32(1.0) / iscale
    best_error = np.float32(0.0)
    for i in range(n):
        level = min(max(nearest_int(iscale * (x[i] - lo)), 0), nmax)
        levels[i] = level
        diff = scale * np.float32(level) + lo - x[i]
        best_error += weights[i] * fit_error(diff, use_mad)
    if nstep < 1:
        return scale, -lo
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * np.float32(step) + fmax) / (hi - lo)
        sum_l = np.float32(0.0)
        sum_l2 = np.float32(0.0)
        sum_xl = np.float32(0.0)
        for i in range(n):
            level = min(max(nearest_int(iscale * (x[i] - lo)), 0), nmax)
            scratch[i] = level
            fl = np.float32(level)
            wl = weights[i] * fl
            sum_l += wl
            sum_l2 += wl * fl
            sum_xl += wl * x[i]
        det = sum_w * sum_l2 - sum_l * sum_l
        if det > np.float32(0.0):
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            if this_min > np.float32(0.0):
                this_min = np.float32(0.0)
                this_scale = sum_xl / sum_l2
            error = np.float32(0.0)
            for i in range(n):
                diff = this_scale * np.float32(scratch[i]) + this_min - x[i]
                error += weights[i] * fit_error(diff, use_mad)
            if error < best_error:
                for i in range(n):
                    levels[i] = scratch[i]
                best_error = error
                scale = this_scale
                lo = this_min
    return scale, -lo


@exact_kernel
def quantize_scales_mins(sub_scales, sub_mins, block):
    """Shared by Q4_K/Q5_K: stores d, dmin and the packed 6-bit scale/min codes of the per-sub-block
    fits into block; returns d and dmin as stored (rounded through float16), as float32."""
    max_scale = np.float32(0.0)
    max_min = np.float32(0.0)
    for k in range(N_SUB):
        if sub_scales[k] > max_scale:
            max_scale = sub_scales[k]
        if sub_mins[k] > max_min:
            max_min = sub_mins[k]
    inv_scale = np.float32(63.0) / max_scale if max_scale > np.float32(0.0) else np.float32(0.0)
    inv_min = np.float32(63.0) / max_min if max_min > np.float32(0.0) else np.float32(0.0)
    scale_codes = np.empty(N_SUB, dtype=np.uint8)
    min_codes = np.empty(N_SUB, dtype=np.uint8)
    for k in range(N_SUB):
        # ggml stores nearest_int's result in a uint8_t before clamping to 63.
        scale_codes[k] = min(63, nearest_int(inv_scale * sub_scales[k]) & 255)
        min_codes[k] = min(63, nearest_int(inv_min * sub_mins[k]) & 255)
    d_bits = f32_to_f16_bits(max_scale / np.float32(63.0))
    dmin_bits = f32_to_f16_bits(max_min / np.float32(63.0))
    block[_D] = d_bits & 255
    block[_D + 1] = d_bits >> 8
    block[_DMIN] = dmin_bits & 255
    block[_DMIN + 1] = dmin_bits >> 8
    for i in range(_SCALES, _SCALES + 12):
        block[i] = 0
    pack_scales_mins(scale_codes, min_codes, block, _SCALES)
    return f16_to_f32(d_bits), f16_to_f32(dmin_bits)


@exact_kernel
def requantize_with_codes(x, block, d, dmin, levels, nmax):
    """Final levels for the stored (rounded) scales: round((x + dmin*min_k) / (d*scale_k)) in 0..nmax.

    Sub-blocks whose stored scale is zero keep the levels of their fit, as in ggml.
    """
    for k in range(N_SUB):
        sc, mn = scale_min(block, _SCALES, k)
        step = d * np.float32(sc)
        if step == np.float32(0.0):
            continue
        offset = dmin * np.float32(mn)
        for i in range(SUB * k, SUB * k + SUB):
            levels[i] = min(max(nearest_int((x[i] + offset) / step), 0), nmax)


@exact_kernel
def fit_sub_blocks(x, levels, sub_scales, sub_mins, nmax, rmin, rdelta, nstep):
    """Per 32-element sub-block: weights av_x + |x| (av_x = RMS of the sub-block), then make_qkx2_quants."""
    weights = np.empty(SUB, dtype=np.float32)
    scratch = np.empty(SUB, dtype=np.uint8)
    for k in range(N_SUB):
        xs = x[SUB * k : SUB * k + SUB]
        sum_x2 = np.float32(0.0)
        for i in range(SUB):
            sum_x2 += xs[i] * xs[i]
        av_x = np.sqrt(sum_x2 / np.float32(SUB))
        for i in range(SUB):
            weights[i] = av_x + abs(xs[i])
        sub_scales[k], sub_mins[k] = make_qkx2_quants(
            nmax,
            xs,
            weights,
            levels[SUB * k : SUB * k + SUB],
            scratch,
            rmin,
            rdelta,
            nstep,
            False,
        )


@exact_kernel(parallel=True)
def _quantize_blocks(x, out):
    """x: float32[nb, 256] -> out: uint8[nb, 144] (zeroed); blocks are independent, so in parallel."""
    for b in prange(x.shape[0]):
        levels = np.empty(QK_K, dtype=np.uint8)
        sub_scales = np.empty(N_SUB, dtype=np.float32)
        sub_mins = np.empty(N_SUB, dtype=np.float32)
        xb = x[b]
        block = out[b]
        fit_sub_blocks(xb, levels, sub_scales, sub_mins, 15, np.float32(-1.0), np.float32(0.1), 20)
        d, dmin = quantize_scales_mins(sub_scales, sub_mins, block)
        requantize_with_codes(xb, block, d, dmin, levels, 15)
        for c in range(N_SUB // 2):
            for l in range(SUB):
                lo = levels[2 * SUB * c + l]
                hi = levels[2 * SUB * c + SUB + l]
                block[_QS + SUB * c + l] = lo | (hi << 4)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/256*144], as llama.cpp's quantize_row_q4_K_ref."""
    blocks = as_float_blocks(x, BLOCK, "Q4_K")
    out = np.zeros((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    _quantize_blocks(blocks, out)
    return out.reshape(*np.shape(x)[:-1], -1)


QUANT = QuantType(
    name="Q4_K",
    act="q8_k",
    dequantize=dequantize,
    dequantize_row=dequantize_row,
    vec_dot=vec_dot,
    quantize=quantize,
)
