"""NumPy helpers shared by the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1): nibble and high-bit
packing, and llama.cpp's reference quantization rules (quantize_row_q{4,5}_{0,1}_ref).

Element order inside a block: byte j of `qs` holds element j in its low nibble and element j+16 in its
high nibble; bit j of the little-endian uint32 `qh` is the fifth bit of element j.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32


def f16_column(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float16 field at byte `offset` of each block, widened: float32[nb, 1]."""
    return blocks[:, offset : offset + 2].copy().view(np.float16).astype(np.float32)


def unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8[nb, 16] -> uint8[nb, 32] (low nibbles are elements 0..15, high nibbles 16..31)."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8[nb, 32] values 0..15 -> uint8[nb, 16]."""
    return (q[:, :16] & np.uint8(0x0F)) | (q[:, 16:] << np.uint8(4))


def unpack_high_bits(qh: np.ndarray) -> np.ndarray:
    """uint8[nb, 4] (a little-endian uint32 per block) -> uint8[nb, 32] of 0/1."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def pack_high_bits(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of the 32 values -> uint8[nb, 4]."""
    return np.packbits((q >> np.uint8(4)) & np.uint8(1), axis=1, bitorder="little")


def quantize_symmetric(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 (levels 8) / Q5_0 (levels 16): the signed value of largest magnitude maps to -levels;
    d = max / -levels, q = trunc(x/d + levels + 0.5) clipped to [0, 2*levels-1]. Returns (d f32[nb,1],
    q uint8[nb,32])."""
    blocks = np.asarray(x, dtype=np.float32).reshape(-1, BLOCK)
    pick = np.abs(blocks).argmax(axis=1)[:, None]
    vmax = np.take_along_axis(blocks, pick, axis=1)
    d = vmax / np.float32(-levels)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.trunc(blocks * inv + np.float32(levels + 0.5)).astype(np.int32).clip(0, 2 * levels - 1)
    return d, q.astype(np.uint8)


def quantize_affine(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 (levels 15) / Q5_1 (levels 31): d = (max - min) / levels, q = trunc((x - min)/d + 0.5)
    clipped to [0, levels]. Returns (d, min, q)."""
    blocks = np.asarray(x, dtype=np.float32).reshape(-1, BLOCK)
    vmax = blocks.max(axis=1, keepdims=True)
    vmin = blocks.min(axis=1, keepdims=True)
    d = (vmax - vmin) / np.float32(levels)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.trunc((blocks - vmin) * inv + np.float32(0.5)).astype(np.int32).clip(0, levels)
    return d, vmin, q.astype(np.uint8)


def f16_bytes(values: np.ndarray) -> np.ndarray:
    """float32[nb, 1] -> uint8[nb, 2] (round to nearest even half)."""
    return values.astype(np.float16).view(np.uint8)
