"""Q5_0: 32 weights per 22-byte block, symmetric 5-bit.

Block layout (ggml `block_q5_0`), little-endian:
  bytes 0..1   d       float16   scale
  bytes 2..5   qh      uint32    bit j = fifth bit of element j
  bytes 6..21  qs[16]  uint8     byte j: low 4 bits of element j (low nibble) and of element j+16 (high)
Weight = d * (q - 16). Pairs with q8_0 activations.
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
    quantize_symmetric,
    unpack_high_bits,
    unpack_nibbles,
)

BLOCK = 32
BLOCK_BYTES = 22


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*22] -> float32[..., nb*32]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "Q5_0")
    q = unpack_nibbles(blocks[:, 6:]) | (unpack_high_bits(blocks[:, 2:6]) << np.uint8(4))
    q = q.astype(np.int8) - np.int8(16)
    return (f16_column(blocks, 0) * q.astype(np.float32)).reshape(*np.shape(raw)[:-1], -1)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/32*22], as quantize_row_q5_0_ref."""
    d, q = quantize_symmetric(as_float_blocks(x, BLOCK, "Q5_0"), 16)
    out = np.concatenate([f16_bytes(d), pack_high_bits(q), pack_nibbles(q)], axis=1)
    return out.reshape(*np.shape(x)[:-1], -1)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*22] -> out: float32[nb*32]; each block d * (q - 16)."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        dequantize_small_block(src, base + 2, base + 6, 16, read_f16(src, base), np.float32(0.0), False, out, b * BLOCK)


QUANT = QuantType(name="Q5_0", act="q8_0", dequantize=dequantize, dequantize_row=dequantize_row, quantize=quantize)
