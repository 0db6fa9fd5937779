"""Q5_K: 256 weights per 176-byte super-block, 5-bit quants with 6-bit scales and mins per 32.

Block layout (ggml `block_q5_K`), little-endian:
  bytes  0..1     d          float16   super-block scale of the sub-block scales
  bytes  2..3     dmin       float16   super-block scale of the sub-block mins
  bytes  4..15    scales[12]           8 (scale, min) pairs of 6 bits, packed exactly as in Q4_K
  bytes 16..47    qh[32]               5th bits: bit k of qh[l] belongs to element 32k + l
  bytes 48..175   qs[128]              low 4 bits, laid out exactly as Q4_K's qs

The eight sub-blocks k = 0..7 hold elements 32k..32k+31. Element 64c + l (l < 32) is the low nibble of
qs[32c + l] plus 16 * bit 2c of qh[l]; element 64c + 32 + l the high nibble plus 16 * bit 2c+1.
Weight = (d * scale_k) * q - (dmin * min_k), q in 0..31, each product rounded to float32 first.

Pairs with q8_k activations. The quantizer is llama.cpp's quantize_row_q5_K_ref (no importance matrix).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..jit import exact_kernel, read_f16
from . import QuantType

from .blocks import QK_K, as_blocks, as_float_blocks, f16_field
from .kquant_fit import fit_sub_blocks, quantize_scales_mins, requantize_with_codes, scale_min, unpack_scales_mins

BLOCK = QK_K
BLOCK_BYTES = 176
SUB = 32
N_SUB = QK_K // SUB

_D, _DMIN, _SCALES, _QH, _QS = 0, 2, 4, 16, 48


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*176] -> float32[..., nb*256]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "Q5_K")
    scales, mins = unpack_scales_mins(blocks[:, _SCALES:_QH])
    step = f16_field(blocks, _D) * scales.astype(np.float32)  # [nb, 8]
    offset = f16_field(blocks, _DMIN) * mins.astype(np.float32)
    packed = blocks[:, _QS:].reshape(-1, N_SUB // 2, 1, SUB)
    low = np.concatenate([packed & 15, packed >> 4], axis=2).reshape(-1, N_SUB, SUB)
    bit_of_sub = np.arange(N_SUB, dtype=np.uint8).reshape(1, N_SUB, 1)
    high = (blocks[:, _QH:_QS].reshape(-1, 1, SUB) >> bit_of_sub) & 1
    q = (low | (high << 4)).astype(np.float32)
    out = step[:, :, None] * q - offset[:, :, None]
    return out.reshape(*np.shape(raw)[:-1], -1)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*176] -> out: float32[nb*256]; as Q4_K's, each quant with its fifth bit from qh."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        d = read_f16(src, base + _D)
        dmin = read_f16(src, base + _DMIN)
        for c in range(N_SUB // 2):  # sub-blocks 2c (low nibbles, qh bit 2c) and 2c + 1 (high, bit 2c + 1)
            sc_lo, mn_lo = scale_min(src, base + _SCALES, 2 * c)
            sc_hi, mn_hi = scale_min(src, base + _SCALES, 2 * c + 1)
            step_lo, off_lo = d * np.float32(sc_lo), dmin * np.float32(mn_lo)
            step_hi, off_hi = d * np.float32(sc_hi), dmin * np.float32(mn_hi)
            qs = base + _QS + SUB * c
            o = b * BLOCK + 2 * SUB * c
            for j in range(SUB):
                byte = np.int32(src[qs + j])
                high = np.int32(src[base + _QH + j]) >> (2 * c)
                out[o + j] = step_lo * np.float32((byte & 15) | ((high & 1) << 4)) - off_lo
                out[o + SUB + j] = step_hi * np.float32((byte >> 4) | ((high & 2) << 3)) - off_hi


# ----- quantization (llama.cpp's quantize_row_q5_K_ref: Q4_K's fit with 31 levels) -----


@exact_kernel(parallel=True)
def _quantize_blocks(x, out):
    """x: float32[nb, 256] -> out: uint8[nb, 176] (zeroed); blocks are independent, so in parallel."""
    for b in prange(x.shape[0]):
        levels = np.empty(QK_K, dtype=np.uint8)
        sub_scales = np.empty(N_SUB, dtype=np.float32)
        sub_mins = np.empty(N_SUB, dtype=np.float32)
        xb = x[b]
        block = out[b]
        fit_sub_blocks(xb, levels, sub_scales, sub_mins, 31, np.float32(-0.5), np.float32(0.1), 15)
        d, dmin = quantize_scales_mins(sub_scales, sub_mins, block)
        requantize_with_codes(xb, block, d, dmin, levels, 31)
        for c in range(N_SUB // 2):
            for l in range(SUB):
                lo = levels[2 * SUB * c + l]
                hi = levels[2 * SUB * c + SUB + l]
                block[_QS + SUB * c + l] = (lo & 15) | ((hi & 15) << 4)
                block[_QH + l] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1))


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/256*176], as llama.cpp's quantize_row_q5_K_ref."""
    blocks = as_float_blocks(x, BLOCK, "Q5_K")
    out = np.zeros((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    _quantize_blocks(blocks, out)
    return out.reshape(*np.shape(x)[:-1], -1)


QUANT = QuantType(
    name="Q5_K",
    act="q8_k",
    dequantize=dequantize,
    dequantize_row=dequantize_row,
    quantize=quantize,
)
