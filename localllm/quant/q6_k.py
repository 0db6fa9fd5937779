"""Q6_K: 256 weights per 210-byte super-block, 6-bit quants with int8 scales per 16.

Block layout (ggml `block_q6_K`), little-endian:
  bytes   0..127   ql[128]      low 4 bits of the quants
  bytes 128..191   qh[64]       high 2 bits of the quants, four per byte
  bytes 192..207   scales[16]   int8 scale of each 16-element group
  bytes 208..209   d            float16 super-block scale

The block is two halves h = 0, 1 of 128 elements, each with ql[64h .. 64h+63] and qh[32h .. 32h+31].
For l in 0..31, with L = ql[64h + l], L' = ql[64h + 32 + l], H = qh[32h + l], half element
  l      = (L  & 15) | ((H >> 0) & 3) << 4
  l + 32 = (L' & 15) | ((H >> 2) & 3) << 4
  l + 64 = (L  >> 4) | ((H >> 4) & 3) << 4
  l + 96 = (L' >> 4) | ((H >> 6) & 3) << 4
are unsigned 6-bit u in 0..63 and the quant is q = u - 32. Element e of the block (e = 128h + ...)
belongs to group e // 16 and weighs (d * scales[e // 16]) * q, the product d*scale rounded to float32
first (llama.cpp's order).

Pairs with q8_k activations. The quantizer is llama.cpp's quantize_row_q6_K_ref (no importance matrix).
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
BLOCK_BYTES = 210
GROUP = 16
N_GROUPS = QK_K // GROUP

_QL, _QH, _SCALES, _D = 0, 128, 192, 208
GROUP_MAX_EPS = np.float32(1e-15)  # ggml: below this a group (or block) counts as all zero


# ----- dequantization -----


def unpack_quants(blocks: np.ndarray) -> np.ndarray:
    """uint8[nb, 210] -> the unsigned 6-bit quants uint8[nb, 256] in element order."""
    ql = blocks[:, _QL:_QH].reshape(-1, 2, 1, 2, 32)  # [block, half, nibble, ql column, l]
    qh = blocks[:, _QH:_SCALES].reshape(-1, 2, 1, 1, 32)  # [block, half, -, -, l]
    low = np.concatenate([ql & 15, ql >> 4], axis=2)  # [block, half, nibble, column, l]
    # the 2-bit field of element 32*(2*nibble + column) + l sits at bit 2*(2*nibble + column) of qh
    shifts = np.array([[0, 2], [4, 6]], dtype=np.uint8).reshape(1, 1, 2, 2, 1)
    high = (qh >> shifts) & 3
    return (low | (high << 4)).reshape(-1, QK_K)


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*210] -> float32[..., nb*256]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "Q6_K")
    scales = blocks[:, _SCALES:_D].view(np.int8).astype(np.float32)
    step = f16_field(blocks, _D) * scales  # [nb, 16]
    q = (unpack_quants(blocks).astype(np.int8) - np.int8(32)).astype(np.float32)
    out = step[:, :, None] * q.reshape(-1, N_GROUPS, GROUP)
    return out.reshape(*np.shape(raw)[:-1], -1)


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


# ----- dot product with a q8_k activation -----


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


# ----- quantization (llama.cpp's quantize_row_q6_K_ref) -----


@exact_kernel
def make_qx_quants(nmax, x, levels):
    """ggml's make_qx_quants with rmse_type=1 and no importance: symmetric fit x ~ scale*(L - nmax).

    Weights x^2. Starts from iscale = -nmax/max (max = the value of largest magnitude), takes the
    least-squares scale for those levels, then tries 18 nearby grids -(nmax + 0.1*is)/max and keeps
    whichever maximises sumlx^2/suml2. Writes levels L in 0..2*nmax-1; returns the float32 scale.
    """
    n = x.shape[0]
    amax = np.float32(0.0)
    vmax = np.float32(0.0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            vmax = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            levels[i] = 0
        return np.float32(0.0)
    fmax = np.float32(nmax)
    iscale = -fmax / vmax
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        level = min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1)
        levels[i] = level + nmax
        fl = np.float32(level)
        w = x[i] * x[i]
        sumlx += w * x[i] * fl
        suml2 += w * fl * fl
    scale = sumlx / suml2 if suml2 != np.float32(0.0) else np.float32(0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fmax + np.float32(0.1) * np.float32(step)) / vmax
        sumlx = np.float32(0.0)
        suml2 = np.float32(0.0)
        for i in range(n):
            fl = np.float32(min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1))
            w = x[i] * x[i]
            sumlx += w * x[i] * fl
            suml2 += w * fl * fl
        if suml2 > np.float32(0.0) and sumlx * sumlx > best * suml2:
            for i in range(n):
                levels[i] = min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1) + nmax
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@exact_kernel
def _quantize_block(x, levels, group_scales, block):
    """x: float32[256] -> block: uint8[210] (block arrives zeroed)."""
    max_scale = np.float32(0.0)
    max_abs_scale = np.float32(0.0)
    for g in range(N_GROUPS):
        scale = make_qx_quants(32, x[GROUP * g : GROUP * g + GROUP], levels[GROUP * g : GROUP * g + GROUP])
        group_scales[g] = scale
        if abs(scale) > max_abs_scale:
            max_abs_scale = abs(scale)
            max_scale = scale
    if max_abs_scale < GROUP_MAX_EPS:
        return  # an all-zero block: every byte 0, d = +0
    iscale = np.float32(-128.0) / max_scale
    d_bits = f32_to_f16_bits(np.float32(1.0) / iscale)
    block[_D] = d_bits & 255
    block[_D + 1] = d_bits >> 8
    d = f16_to_f32(d_bits)
    for g in range(N_GROUPS):
        # ggml stores MIN(127, nearest_int(...)) in an int8_t (>= -128 by construction; wrapped as C would)
        code = ((min(127, nearest_int(iscale * group_scales[g])) + 128) & 255) - 128
        block[_SCALES + g] = code & 255
        step = d * np.float32(code)
        if step == np.float32(0.0):
            continue
        for i in range(GROUP * g, GROUP * g + GROUP):
            levels[i] = min(max(nearest_int(x[i] / step), -32), 31) + 32
    for h in range(2):
        for l in range(32):
            e = 128 * h + l
            u1, u2, u3, u4 = levels[e], levels[e + 32], levels[e + 64], levels[e + 96]
            block[_QL + 64 * h + l] = (u1 & 15) | ((u3 & 15) << 4)
            block[_QL + 64 * h + 32 + l] = (u2 & 15) | ((u4 & 15) << 4)
            block[_QH + 32 * h + l] = (u1 >> 4) | ((u2 >> 4) << 2) | ((u3 >> 4) << 4) | ((u4 >> 4) << 6)


@exact_kernel(parallel=True)
def _quantize_blocks(x, out):
    """x: float32[nb, 256] -> out: uint8[nb, 210] (zeroed); blocks are independent, so in parallel."""
    for b in prange(x.shape[0]):
        levels = np.empty(QK_K, dtype=np.uint8)
        group_scales = np.empty(N_GROUPS, dtype=np.float32)
        _quantize_block(x[b], levels, group_scales, out[b])


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/256*210], as llama.cpp's quantize_row_q6_K_ref."""
    blocks = as_float_blocks(x, BLOCK, "Q6_K")
    out = np.zeros((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    _quantize_blocks(blocks, out)
    return out.reshape(*np.shape(x)[:-1], -1)


QUANT = QuantType(
    name="Q6_K",
    act="q8_k",
    dequantize=dequantize,
    dequantize_row=dequantize_row,
    vec_dot=vec_dot,
    quantize=quantize,
)
