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
Q5_K uses the same scale packing (both take it from kquant_fit.py).

Pairs with q8_k activations. The quantizer is llama.cpp's quantize_row_q4_K_ref (no importance matrix).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..jit import exact_kernel, read_f16
from . import QuantType
from .blocks import QK_K, as_blocks, as_float_blocks, f16_field
from .kquant_fit import fit_sub_blocks, quantize_scales_mins, requantize_with_codes, scale_min, unpack_scales_mins

BLOCK = QK_K
BLOCK_BYTES = 144
SUB = 32  # elements per sub-block
N_SUB = QK_K // SUB

_D, _DMIN, _SCALES, _QS = 0, 2, 4, 16


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


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*144] -> out: float32[nb*256]. Each element step * q - offset, with step = d * scale and
    offset = dmin * min rounded to float32 first, as the NumPy reference (and gguf-py) compute it."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        d = read_f16(src, base + _D)
        dmin = read_f16(src, base + _DMIN)
        for c in range(N_SUB // 2):  # sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles) share 32 bytes
            sc_lo, mn_lo = scale_min(src, base + _SCALES, 2 * c)
            sc_hi, mn_hi = scale_min(src, base + _SCALES, 2 * c + 1)
            step_lo, off_lo = d * np.float32(sc_lo), dmin * np.float32(mn_lo)
            step_hi, off_hi = d * np.float32(sc_hi), dmin * np.float32(mn_hi)
            qs = base + _QS + SUB * c
            o = b * BLOCK + 2 * SUB * c
            for j in range(SUB):
                byte = np.int32(src[qs + j])
                out[o + j] = step_lo * np.float32(byte & 15) - off_lo
                out[o + SUB + j] = step_hi * np.float32(byte >> 4) - off_hi


# ----- quantization (llama.cpp's quantize_row_q4_K_ref) -----


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
    quantize=quantize,
)
