"""Q4_0: 32 weights per 18-byte block, symmetric 4-bit.

Block layout (ggml `block_q4_0`), little-endian:
  bytes 0..1   d       float16   scale
  bytes 2..17  qs[16]  uint8     byte j: element j in the low nibble, element j+16 in the high nibble
Weight = d * (q - 8). Pairs with q8_0 activations.
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
    quantize_symmetric,
    unpack_nibbles,
)

BLOCK = 32
BLOCK_BYTES = 18


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*18] -> float32[..., nb*32]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "Q4_0")
    q = unpack_nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)
    return (f16_column(blocks, 0) * q.astype(np.float32)).reshape(*np.shape(raw)[:-1], -1)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/32*18], as quantize_row_q4_0_ref."""
    d, q = quantize_symmetric(as_float_blocks(x, BLOCK, "Q4_0"), 8)
    out = np.concatenate([f16_bytes(d), pack_nibbles(q)], axis=1)
    return out.reshape(*np.shape(x)[:-1], -1)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*18] -> out: float32[nb*32]; each block d * (q - 8)."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        dequantize_small_block(src, -1, base + 2, 8, read_f16(src, base), np.float32(0.0), False, out, b * BLOCK)


QUANT = QuantType(name="Q4_0", act="q8_0", dequantize=dequantize, dequantize_row=dequantize_row, quantize=quantize)
