"""Q2_K: 256 weights per 84-byte super-block, 2-bit quants with 4-bit scales and mins per 16.

Block layout (ggml `block_q2_K`), little-endian:
  bytes  0..15   scales[16]   group g: scale = scales[g] & 15, min = scales[g] >> 4
  bytes 16..79   qs[64]       2-bit quants, four per byte
  bytes 80..81   d            float16   super-block scale of the scales
  bytes 82..83   dmin         float16   super-block scale of the mins

The block is two halves h = 0, 1 of 128 elements, each with the 32 bytes qs[32h .. 32h+31]: element
128h + 32j + l (j = 0..3, l = 0..31) is bits 2j..2j+1 of qs[32h + l]. Element e belongs to group
e // 16 and weighs (d * scale_g) * q - (dmin * min_g), each product rounded to float32 first.

Pairs with q8_k activations. The quantizer is llama.cpp's quantize_row_q2_K_ref (no importance matrix).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..jit import exact_kernel, f16_to_f32, f32_to_f16_bits, read_f16
from . import QuantType
from .blocks import QK_K, as_blocks, as_float_blocks, f16_field, nearest_int
from .kquant_fit import make_qkx2_quants

BLOCK = QK_K
BLOCK_BYTES = 84
GROUP = 16
N_GROUPS = QK_K // GROUP

_SCALES, _QS, _D, _DMIN = 0, 16, 80, 82


def unpack_2bit(qs: np.ndarray) -> np.ndarray:
    """The 64 qs bytes of each block, uint8[nb, 64] -> the 2-bit values uint8[nb, 256] in element order."""
    qs = qs.reshape(-1, 2, 1, 32)  # [block, half, -, l]
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return ((qs >> shifts) & 3).reshape(-1, QK_K)


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*84] -> float32[..., nb*256]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "Q2_K")
    packed = blocks[:, _SCALES:_QS]
    step = f16_field(blocks, _D) * (packed & 15).astype(np.float32)  # [nb, 16]
    offset = f16_field(blocks, _DMIN) * (packed >> 4).astype(np.float32)
    q = unpack_2bit(blocks[:, _QS:_D]).astype(np.float32).reshape(-1, N_GROUPS, GROUP)
    out = step[:, :, None] * q - offset[:, :, None]
    return out.reshape(*np.shape(raw)[:-1], -1)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*84] -> out: float32[nb*256]."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        d = read_f16(src, base + _D)
        dmin = read_f16(src, base + _DMIN)
        for g in range(N_GROUPS):
            packed = src[base + _SCALES + g]
            step = d * np.float32(packed & 15)
            offset = dmin * np.float32(packed >> 4)
            # group g = 8h + 2j + part covers half h, shift 2j, bytes 16*part .. 16*part+15
            h, j, part = g // 8, (g // 2) % 4, g % 2
            qbase = base + _QS + 32 * h + GROUP * part
            for l in range(GROUP):
                q = (np.int32(src[qbase + l]) >> (2 * j)) & 3
                out[b * BLOCK + GROUP * g + l] = step * np.float32(q) - offset


# ----- quantization (llama.cpp's quantize_row_q2_K_ref) -----


@exact_kernel
def store_f16(block, offset, value):
    """Round value to float16, store its bits at block[offset:offset+2]; return it as float32."""
    bits = f32_to_f16_bits(value)
    block[offset] = bits & 255
    block[offset + 1] = bits >> 8
    return f16_to_f32(bits)


@exact_kernel
def _quantize_block(x, levels, group_scales, group_mins, weights, scratch, block):
    """x: float32[256] -> block: uint8[84] (zeroed)."""
    max_scale = np.float32(0.0)
    max_min = np.float32(0.0)
    for g in range(N_GROUPS):
        xs = x[GROUP * g : GROUP * g + GROUP]
        for i in range(GROUP):
            weights[i] = abs(xs[i])
        scale, the_min = make_qkx2_quants(
            3, xs, weights, levels[GROUP * g : GROUP * g + GROUP], scratch,
            np.float32(-0.5), np.float32(0.1), 15, True,
        )
        group_scales[g] = scale
        group_mins[g] = the_min
        max_scale = max(max_scale, scale)
        max_min = max(max_min, the_min)
    # 4-bit codes of the scales and mins relative to their maxima (ggml stores nearest_int in a uint8)
    d = np.float32(0.0)
    if max_scale > np.float32(0.0):
        iscale = np.float32(15.0) / max_scale
        for g in range(N_GROUPS):
            block[_SCALES + g] = nearest_int(iscale * group_scales[g]) & 255
        d = store_f16(block, _D, max_scale / np.float32(15.0))
    dmin = np.float32(0.0)
    if max_min > np.float32(0.0):
        iscale = np.float32(15.0) / max_min
        for g in range(N_GROUPS):
            block[_SCALES + g] |= (nearest_int(iscale * group_mins[g]) << 4) & 255
        dmin = store_f16(block, _DMIN, max_min / np.float32(15.0))
    # final levels for the stored scales (groups whose scale code is 0 keep their fit's levels)
    for g in range(N_GROUPS):
        step = d * np.float32(block[_SCALES + g] & 15)
        if step == np.float32(0.0):
            continue
        offset = dmin * np.float32(block[_SCALES + g] >> 4)
        for i in range(GROUP * g, GROUP * g + GROUP):
            levels[i] = min(max(nearest_int((x[i] + offset) / step), 0), 3)
    for h in range(2):
        for l in range(32):
            e = 128 * h + l
            packed = levels[e] | (levels[e + 32] << 2) | (levels[e + 64] << 4) | (levels[e + 96] << 6)
            block[_QS + 32 * h + l] = packed


@exact_kernel(parallel=True)
def _quantize_blocks(x, out):
    """x: float32[nb, 256] -> out: uint8[nb, 84] (zeroed); blocks are independent, so in parallel."""
    for b in prange(x.shape[0]):
        levels = np.empty(QK_K, dtype=np.uint8)
        group_scales = np.empty(N_GROUPS, dtype=np.float32)
        group_mins = np.empty(N_GROUPS, dtype=np.float32)
        weights = np.empty(GROUP, dtype=np.float32)
        scratch = np.empty(GROUP, dtype=np.uint8)
        _quantize_block(x[b], levels, group_scales, group_mins, weights, scratch, out[b])


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/256*84], as llama.cpp's quantize_row_q2_K_ref."""
    blocks = as_float_blocks(x, BLOCK, "Q2_K")
    out = np.zeros((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    _quantize_blocks(blocks, out)
    return out.reshape(*np.shape(x)[:-1], -1)


QUANT = QuantType(
    name="Q2_K",
    act="q8_k",
    dequantize=dequantize,
    dequantize_row=dequantize_row,
    quantize=quantize,
)
