"""Q5_1: 32 weights per 24-byte block, 5-bit with a per-block minimum.

Block layout (ggml `block_q5_1`), little-endian:
  bytes 0..1   d       float16   scale
  bytes 2..3   m       float16   minimum
  bytes 4..7   qh      uint32    bit j = fifth bit of element j
  bytes 8..23  qs[16]  uint8     byte j: low 4 bits of element j (low nibble) and of element j+16 (high)
Weight = d * q + m. Pairs with the q8_0 activation and its block sums (llama.cpp's Q8_1).
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
    pack_high_bits,
    pack_nibbles,
    quantize_affine,
    unpack_high_bits,
    unpack_nibbles,
)

BLOCK = 32
BLOCK_BYTES = 24


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*24] -> float32[..., nb*32]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "Q5_1")
    q = unpack_nibbles(blocks[:, 8:]) | (unpack_high_bits(blocks[:, 4:8]) << np.uint8(4))
    return (f16_column(blocks, 0) * q.astype(np.float32) + f16_column(blocks, 2)).reshape(*np.shape(raw)[:-1], -1)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/32*24], as quantize_row_q5_1_ref."""
    d, vmin, q = quantize_affine(as_float_blocks(x, BLOCK, "Q5_1"), 31)
    out = np.concatenate([f16_bytes(d), f16_bytes(vmin), pack_high_bits(q), pack_nibbles(q)], axis=1)
    return out.reshape(*np.shape(x)[:-1], -1)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*24] -> out: float32[nb*32]; each block d * q + m."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        dequantize_small_block(src, base + 4, base + 8, 0, read_f16(src, base), read_f16(src, base + 2), True, out, b * BLOCK)


QUANT = QuantType(name="Q5_1", act="q8_0", dequantize=dequantize, dequantize_row=dequantize_row, quantize=quantize)
