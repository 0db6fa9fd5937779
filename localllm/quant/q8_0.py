"""Q8_0: 32 weights per 34-byte block, symmetric 8-bit.

Block layout (ggml `block_q8_0`), little-endian:
  bytes 0..1   d      float16   scale
  bytes 2..33  qs[32] int8      quants; weight j = d * qs[j]

Pairs with q8_0 activations (llama.cpp's vec_dot_type Q8_0).
"""

from __future__ import annotations

import numpy as np

from ..jit import exact_kernel, read_f16
from . import QuantType
from .blocks import as_blocks, as_float_blocks

BLOCK = 32
BLOCK_BYTES = 34


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*34] -> float32[..., nb*32]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "Q8_0")
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 2:].view(np.int8).astype(np.float32)
    return (d * qs).reshape(*raw.shape[:-1], -1)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/32*34], as llama.cpp's quantize_row_q8_0_ref (roundf: half away from 0)."""
    blocks = as_float_blocks(x, BLOCK, "Q8_0")
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    scaled = blocks * inv
    qs = (np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))).astype(np.int8)
    out = np.empty((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = qs.view(np.uint8)
    return out.reshape(*np.shape(x)[:-1], -1)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*34] -> out: float32[nb*32]."""
    qs = src.view(np.int8)
    for b in range(out.shape[0] // BLOCK):
        d = read_f16(src, b * BLOCK_BYTES)
        base = b * BLOCK_BYTES + 2
        for j in range(BLOCK):
            out[b * BLOCK + j] = d * np.float32(qs[base + j])


QUANT = QuantType(
    name="Q8_0",
    act="q8_0",
    dequantize=dequantize,
    dequantize_row=dequantize_row,
    quantize=quantize,
)
