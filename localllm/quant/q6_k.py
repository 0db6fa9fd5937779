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
from numba import prange

from ..jit import exact_kernel, f16_to_f32, f32_to_f16_bits, read_f16
from . import QuantType
from .blocks import QK_K, as_blocks, as_float_blocks, f16_field, nearest_int
from .kquant_fit import GROUP_MAX_EPS, make_qx_quants

BLOCK = QK_K
BLOCK_BYTES = 210
GROUP = 16
N_GROUPS = QK_K // GROUP

_QL, _QH, _SCALES, _D = 0, 128, 192, 208


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


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*210] -> out: float32[nb*256]; each element (d * scale) * (q - 32), the product
    d * scale rounded to float32 first as in the NumPy reference."""
    scales = src.view(np.int8)
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        d = read_f16(src, base + _D)
        for h in range(2):
            ql = base + _QL + 64 * h
            qh = base + _QH + 32 * h
            for i in range(4):  # the four runs of 32 of the half (the docstring's l, l + 32, l + 64, l + 96)
                for l in range(32):
                    low_byte = np.int32(src[ql + l + 32 * (i & 1)])
                    low = (low_byte >> 4) if i >= 2 else (low_byte & 15)
                    q = (low | (((np.int32(src[qh + l]) >> (2 * i)) & 3) << 4)) - 32
                    step = d * np.float32(scales[base + _SCALES + 8 * h + 2 * i + l // 16])
                    out[b * BLOCK + 128 * h + 32 * i + l] = step * np.float32(q)


# ----- quantization (llama.cpp's quantize_row_q6_K_ref) -----


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
    quantize=quantize,
)
