"""Q4_1: 32 weights per 20-byte block, 4-bit with a per-block minimum.

Block layout (ggml `block_q4_1`), little-endian:
  bytes 0..1   d       float16   scale
  bytes 2..3   m       float16   minimum
  bytes 4..19  qs[16]  uint8     byte j: element j in the low nibble, element j+16 in the high nibble
Weight = d * q + m. Pairs with llama.cpp's Q8_1 activation, which in our unpacked form is the q8_0
activation plus its per-block sums `asum` (the min term is m * d_a * sum(a)).
"""

from __future__ import annotations

import numpy as np

from ..jit import exact_kernel, read_f16
from . import QuantType
from .blocks import (
    as_blocks,
    as_float_blocks,
    dequantize_small_block,
    f16_bytes,
    f16_column,
    pack_nibbles,
    quantize_affine,
    unpack_nibbles,
)

BLOCK = 32
BLOCK_BYTES = 20


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*20] -> float32[..., nb*32]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "Q4_1")
    q = unpack_nibbles(blocks[:, 4:]).astype(np.float32)
    return (f16_column(blocks, 0) * q + f16_column(blocks, 2)).reshape(*np.shape(raw)[:-1], -1)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/32*20], as quantize_row_q4_1_ref."""
    d, vmin, q = quantize_affine(as_float_blocks(x, BLOCK, "Q4_1"), 15)
    out = np.concatenate([f16_bytes(d), f16_bytes(vmin), pack_nibbles(q)], axis=1)
    return out.reshape(*np.shape(x)[:-1], -1)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*20] -> out: float32[nb*32]; each block d * q + m."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        dequantize_small_block(src, -1, base + 4, 0, read_f16(src, base), read_f16(src, base + 2), True, out, b * BLOCK)


QUANT = QuantType(name="Q4_1", act="q8_0", dequantize=dequantize, dequantize_row=dequantize_row, quantize=quantize)
