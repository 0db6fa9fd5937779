"""Q3_K: 256 weights per 110-byte super-block, 3-bit quants with 6-bit signed scales per 16.

Block layout (ggml `block_q3_K`), little-endian:
  bytes   0..31    hmask[32]    high bits: bit 4h+j of hmask[l] belongs to element 128h + 32j + l
  bytes  32..95    qs[64]       low 2 bits, laid out exactly as Q2_K's qs
  bytes  96..107   scales[12]   16 six-bit scales, packed as below
  bytes 108..109   d            float16 super-block scale

Element 128h + 32j + l (h = 0, 1; j = 0..3; l = 0..31) has low bits (qs[32h + l] >> 2j) & 3 and
high bit H = bit 4h+j of hmask[l]; its quant is low - 4 when H is 0 and low when H is 1 (q in -4..3).

Scale of group g (elements 16g..16g+15), s = scales[12]:
  low 4 bits: s[g] & 15 for g < 8, s[g-8] >> 4 for g >= 8;  high 2 bits: (s[8 + g%4] >> 2*(g//4)) & 3;
  scale = that 6-bit value - 32.
Weight = (d * scale_g) * q, the product d*scale rounded to float32 first.

Pairs with q8_k activations. The quantizer is llama.cpp's quantize_row_q3_K_ref (no importance matrix).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..jit import exact_kernel, read_f16
from . import QuantType
from .q2_k import store_f16, unpack_2bit
from .kquant_fit import GROUP_MAX_EPS, make_q3_quants
from .blocks import QK_K, as_blocks, as_float_blocks, f16_field, nearest_int

BLOCK = QK_K
BLOCK_BYTES = 110
GROUP = 16
N_GROUPS = QK_K // GROUP

_HMASK, _QS, _SCALES, _D = 0, 32, 96, 108


def unpack_scales(packed: np.ndarray) -> np.ndarray:
    """uint8[nb, 12] -> the signed scales int8[nb, 16] (6-bit value - 32)."""
    low = np.concatenate([packed[:, 0:8] & 15, packed[:, 0:8] >> 4], axis=1)  # groups 0..7, 8..15
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)
    high = ((packed[:, 8:12].reshape(-1, 1, 4) >> shifts) & 3).reshape(-1, N_GROUPS)  # g = 4*(g//4) + g%4
    return (low | (high << 4)).astype(np.int8) - np.int8(32)


def unpack_quants(blocks: np.ndarray) -> np.ndarray:
    """uint8[nb, 110] -> the signed quants int8[nb, 256] in element order."""
    low = unpack_2bit(blocks[:, _QS:_SCALES])
    bit = np.arange(8, dtype=np.uint8).reshape(1, 2, 4, 1)  # bit 4h + j
    high = (blocks[:, _HMASK:_QS].reshape(-1, 1, 1, 32) >> bit) & 1
    return low.astype(np.int8) - ((high.reshape(-1, QK_K) ^ 1) << 2).astype(np.int8)


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*110] -> float32[..., nb*256]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "Q3_K")
    step = f16_field(blocks, _D) * unpack_scales(blocks[:, _SCALES:_D]).astype(np.float32)  # [nb, 16]
    q = unpack_quants(blocks).astype(np.float32).reshape(-1, N_GROUPS, GROUP)
    out = step[:, :, None] * q
    return out.reshape(*np.shape(raw)[:-1], -1)


@exact_kernel
def group_scale(w, offset, g):
    """Signed scale of group g from the 12 packed bytes at w[offset:offset+12], as int32."""
    if g < 8:
        low = np.int32(w[offset + g]) & 15
    else:
        low = np.int32(w[offset + g - 8]) >> 4
    high = (np.int32(w[offset + 8 + g % 4]) >> (2 * (g // 4))) & 3
    return np.int32(low | (high << 4)) - 32


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*110] -> out: float32[nb*256]."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        d = read_f16(src, base + _D)
        for g in range(N_GROUPS):
            step = d * np.float32(group_scale(src, base + _SCALES, g))
            h, j, part = g // 8, (g // 2) % 4, g % 2
            qbase = base + _QS + 32 * h + GROUP * part
            mbase = base + _HMASK + GROUP * part
            for l in range(GROUP):
                low = (np.int32(src[qbase + l]) >> (2 * j)) & 3
                high = (np.int32(src[mbase + l]) >> (4 * h + j)) & 1
                out[b * BLOCK + GROUP * g + l] = step * np.float32(low - 4 + 4 * high)


# ----- quantization (llama.cpp's quantize_row_q3_K_ref) -----


@exact_kernel
def _quantize_block(x, levels, group_scales, block):
    """x: float32[256] -> block: uint8[110] (zeroed). levels: int8[256] scratch."""
    max_scale = np.float32(0.0)
    amax = np.float32(0.0)
    for g in range(N_GROUPS):
        scale = make_q3_quants(4, x[GROUP * g : GROUP * g + GROUP], levels[GROUP * g : GROUP * g + GROUP])
        group_scales[g] = scale
        if abs(scale) > amax:
            amax = abs(scale)
            max_scale = scale
    d = np.float32(0.0)
    if max_scale != np.float32(0.0):
        iscale = np.float32(-32.0) / max_scale
        for g in range(N_GROUPS):
            # ggml keeps nearest_int's result in an int8_t, then clamps to -32..31 and adds 32
            code = min(max(((nearest_int(iscale * group_scales[g]) + 128) & 255) - 128, -32), 31) + 32
            if g < 8:
                block[_SCALES + g] = code & 15
            else:
                block[_SCALES + g - 8] |= (code & 15) << 4
            block[_SCALES + 8 + g % 4] |= (code >> 4) << (2 * (g // 4))
        d = store_f16(block, _D, np.float32(1.0) / iscale)
    # final levels for the stored scales (groups whose scale is 0 keep their fit's levels)
    for g in range(N_GROUPS):
        step = d * np.float32(group_scale(block, _SCALES, g))
        if step == np.float32(0.0):
            continue
        for i in range(GROUP * g, GROUP * g + GROUP):
            levels[i] = min(max(nearest_int(x[i] / step), -4), 3) + 4
    # element 128h + 32j + l: high bit into bit 4h+j of hmask[l], low 2 bits into qs[32h + l] bits 2j
    for e in range(QK_K):
        if levels[e] > 3:
            block[_HMASK + e % 32] |= 1 << (e // 32)
            levels[e] -= 4
    for h in range(2):
        for l in range(32):
            e = 128 * h + l
            packed = levels[e] | (levels[e + 32] << 2) | (levels[e + 64] << 4) | (levels[e + 96] << 6)
            block[_QS + 32 * h + l] = packed


@exact_kernel(parallel=True)
def _quantize_blocks(x, out):
    """x: float32[nb, 256] -> out: uint8[nb, 110] (zeroed); blocks are independent, so in parallel."""
    for b in prange(x.shape[0]):
        levels = np.empty(QK_K, dtype=np.int8)
        group_scales = np.empty(N_GROUPS, dtype=np.float32)
        _quantize_block(x[b], levels, group_scales, out[b])


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/256*110], as llama.cpp's quantize_row_q3_K_ref."""
    blocks = as_float_blocks(x, BLOCK, "Q3_K")
    out = np.zeros((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    _quantize_blocks(blocks, out)
    return out.reshape(*np.shape(x)[:-1], -1)


QUANT = QuantType(
    name="Q3_K",
    act="q8_k",
    dequantize=dequantize,
    dequantize_row=dequantize_row,
    quantize=quantize,
)
