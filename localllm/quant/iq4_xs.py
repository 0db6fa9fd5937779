"""IQ4_XS: 256 weights per 136-byte super-block, IQ4_NL's table with 6-bit scales per 32.

Block layout (ggml `block_iq4_xs`), little-endian:
  bytes  0..1     d           float16   super-block scale
  bytes  2..3     scales_h    uint16    high 2 bits of the 8 sub-block scales: bits 2k..2k+1 for k
  bytes  4..7     scales_l[4]           low 4 bits: sub-block k in the low (k even) / high (k odd)
                                        nibble of scales_l[k // 2]
  bytes  8..135   qs[128]               4-bit indices, 16 bytes per sub-block, as IQ4_NL's qs

Sub-block k = 0..7 holds elements 32k..32k+31; its scale is the 6-bit value above minus 32. Element
32k + l (l < 16) is KVALUES[low nibble of qs[16k + l]], 32k + 16 + l the high nibble.
Weight = (d * scale_k) * KVALUES[index], the product d*scale rounded to float32 first.

Pairs with q8_k activations.

The quantizer is ggml's `quantize_iq4_xs` without an importance matrix: each sub-block's float scale
fitted as IQ4_NL does (`iq4_nl.fit_scale`), the super-block scale d = -(the scale of largest magnitude)/32,
the sub-block scales rounded to d * (-32..31), and the levels chosen again for the rounded scales.
Checked bit for bit against ggml's C function (tests/data/quantize/iq4_reference.npz).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..jit import exact_kernel, f32_to_f16_bits, read_f16
from . import QuantType
from .iq4_nl import KVALUES, fit_scale, lookup_nibbles, pack_levels
from .blocks import QK_K, as_blocks, as_float_blocks, f16_field, nearest_int

BLOCK = QK_K
BLOCK_BYTES = 136
SUB = 32
N_SUB = QK_K // SUB

_D, _SCALES_H, _SCALES_L, _QS = 0, 2, 4, 8


def unpack_scales(blocks: np.ndarray) -> np.ndarray:
    """uint8[nb, 136] -> the signed sub-block scales int8[nb, 8]."""
    low = blocks[:, _SCALES_L:_QS].reshape(-1, 4, 1) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2)
    low = low.reshape(-1, N_SUB) & 15
    high_bits = blocks[:, _SCALES_H:_SCALES_L].copy().view("<u2")  # [nb, 1]
    high = (high_bits >> (2 * np.arange(N_SUB, dtype=np.uint16))).astype(np.uint8) & 3
    return (low | (high << 4)).astype(np.int8) - np.int8(32)


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*136] -> float32[..., nb*256]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "IQ4_XS")
    step = f16_field(blocks, _D) * unpack_scales(blocks).astype(np.float32)  # [nb, 8]
    values = lookup_nibbles(blocks[:, _QS:].reshape(-1, N_SUB, 16)).astype(np.float32)  # [nb, 8, 32]
    return (step[:, :, None] * values).reshape(*np.shape(raw)[:-1], -1)


@exact_kernel
def sub_scale(w, base, k):
    """Signed scale of sub-block k of the block at w[base:], as int32."""
    low = (np.int32(w[base + _SCALES_L + k // 2]) >> (4 * (k % 2))) & 15
    high_bits = np.int32(w[base + _SCALES_H]) | (np.int32(w[base + _SCALES_H + 1]) << 8)
    high = (high_bits >> (2 * k)) & 3
    return np.int32(low | (high << 4)) - 32


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*136] -> out: float32[nb*256]."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        d = read_f16(src, base + _D)
        for k in range(N_SUB):
            step = d * np.float32(sub_scale(src, base, k))
            qbase = base + _QS + 16 * k
            obase = b * BLOCK + SUB * k
            for l in range(16):
                q = src[qbase + l]
                out[obase + l] = step * np.float32(KVALUES[q & 15])
                out[obase + 16 + l] = step * np.float32(KVALUES[q >> 4])


# ----- quantization (ggml's quantize_iq4_xs, no importance matrix) -----


@exact_kernel
def quantize_block(xb, block):
    """xb: float32[256] -> block: uint8[136]."""
    scales = np.empty(N_SUB, dtype=np.float32)
    max_scale = np.float32(0.0)  # the sub-block scale of largest magnitude, with its sign
    for k in range(N_SUB):
        scales[k] = fit_scale(xb[SUB * k : SUB * k + SUB])
        if abs(scales[k]) > abs(max_scale):
            max_scale = scales[k]
    d = -max_scale / np.float32(32.0)  # -0.0 for an all-zero block, stored as such (ggml does too)
    bits = f32_to_f16_bits(d)
    block[_D] = bits & 255
    block[_D + 1] = bits >> 8
    inv_d = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
    scales_h = 0
    for k in range(N_SUB):
        code = min(max(nearest_int(inv_d * scales[k]), -32), 31)
        # levels for the rounded sub-block scale, taken with the float32 d (not its float16 rounding)
        step = d * np.float32(code)
        pack_levels(xb[SUB * k : SUB * k + SUB], np.float32(1.0) / step if step != np.float32(0.0) else np.float32(0.0), block, _QS + 16 * k)
        code += 32
        if k % 2 == 0:
            block[_SCALES_L + k // 2] = code & 15
        else:
            block[_SCALES_L + k // 2] |= (code & 15) << 4
        scales_h |= (code >> 4) << (2 * k)
    block[_SCALES_H] = scales_h & 255
    block[_SCALES_H + 1] = scales_h >> 8


@exact_kernel(parallel=True)
def _quantize_blocks(x, out):
    """x: float32[nb, 256] -> out: uint8[nb, 136]; blocks are independent, so in parallel."""
    for b in prange(x.shape[0]):
        quantize_block(x[b], out[b])


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/256*136], as ggml's quantize_iq4_xs without an importance matrix."""
    blocks = as_float_blocks(x, BLOCK, "IQ4_XS")
    out = np.empty((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    _quantize_blocks(blocks, out)
    return out.reshape(*np.shape(x)[:-1], -1)


QUANT = QuantType(
    name="IQ4_XS",
    act="q8_k",
    dequantize=dequantize,
    dequantize_row=dequantize_row,
    quantize=quantize,
)
