"""What the block formats share: the block checks of every type (`as_blocks`, `as_float_blocks`), the
float16 fields, the nibble and high-bit packing of the 32-element types (Q4_0, Q4_1, Q5_0, Q5_1), llama.cpp's
reference quantization rules for them (quantize_row_q{4,5}_{0,1}_ref), and the quantizers' rounding
(`nearest_int`).

Element order inside a 32-element block: byte j of `qs` holds element j in its low nibble and element
j+16 in its high nibble; bit j of the little-endian uint32 `qh` is the fifth bit of element j.
"""

from __future__ import annotations

import numpy as np

from ..errors import TensorError
from ..jit import exact_kernel, f32_bits

QK_K = 256  # elements per super-block (the K-quants, Q8_K, IQ4_XS)


def as_blocks(raw: np.ndarray, block_bytes: int, type_name: str) -> np.ndarray:
    """View uint8[..., k*block_bytes] as uint8[blocks, block_bytes]; TensorError if the rows do not split."""
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise TensorError(f"{type_name} data must be uint8 bytes, got {raw.dtype}")
    if raw.ndim == 0 or raw.shape[-1] % block_bytes:
        raise TensorError(
            f"{type_name} row of {raw.shape[-1] if raw.ndim else 0} bytes is not a whole number of"
            f" {block_bytes}-byte blocks"
        )
    return np.ascontiguousarray(raw).reshape(-1, block_bytes)


def as_float_blocks(x: np.ndarray, block: int, type_name: str) -> np.ndarray:
    """float32 C-contiguous [blocks, block] view of x[..., n]; TensorError if n is not a multiple of block."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % block:
        raise TensorError(
            f"cannot quantize rows of {x.shape[-1] if x.ndim else 0} values to {type_name}:"
            f" the row length must be a multiple of {block}"
        )
    return x.reshape(-1, block)


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float16 field at byte `offset` of every block, as float32 [blocks, 1] (exact conversion)."""
    return blocks[:, offset : offset + 2].copy().view(np.float16).astype(np.float32)


@exact_kernel
def nearest_int(value):
    """ggml's nearest_int: adding 1.5*2**23 leaves round(value) in the low mantissa bits.

    That is round-half-to-even for |value| <= 4194303 (ggml asserts this range); emulated bit for bit,
    so that the rare out-of-range argument gives the same (clamped-away) garbage as llama.cpp.
    """
    shifted = np.float32(value) + np.float32(12582912.0)
    return np.int32((f32_bits(shifted) & np.int32(0x007FFFFF)) - np.int32(0x00400000))


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


def quantize_symmetric(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 (levels 8) / Q5_0 (levels 16): the signed value of largest magnitude maps to -levels;
    d = max / -levels, q = trunc(x/d + levels + 0.5) clipped to [0, 2*levels-1]. Returns (d f32[nb,1],
    q uint8[nb,32]) for blocks: float32[nb, 32]."""
    pick = np.abs(blocks).argmax(axis=1)[:, None]
    vmax = np.take_along_axis(blocks, pick, axis=1)
    d = vmax / np.float32(-levels)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.trunc(blocks * inv + np.float32(levels + 0.5)).astype(np.int32).clip(0, 2 * levels - 1)
    return d, q.astype(np.uint8)


def quantize_affine(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 (levels 15) / Q5_1 (levels 31): d = (max - min) / levels, q = trunc((x - min)/d + 0.5)
    clipped to [0, levels]. Returns (d, min, q) for blocks: float32[nb, 32]."""
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


@exact_kernel
def dequantize_small_block(src, qh, qs, zero, d, m, with_min, out, o):
    """out[o + j] = d * float(q_j - zero), plus m if with_min, for the 32 elements of a 32-element block
    (src: uint8[row_bytes], out: float32[n]): q_j the nibble of byte qs + j % 16 (low for j < 16), plus 16
    where bit j of the little-endian uint32 at src[qh:] is set (qh >= 0: the five-bit types). The product,
    then the sum, as separate IEEE float32 operations: the NumPy reference's order, bit for bit."""
    high = np.uint32(0)
    if qh >= 0:
        high = (np.uint32(src[qh]) | (np.uint32(src[qh + 1]) << np.uint32(8))
                | (np.uint32(src[qh + 2]) << np.uint32(16)) | (np.uint32(src[qh + 3]) << np.uint32(24)))
    for j in range(32):
        byte = np.int32(src[qs + (j & 15)])
        q = (byte >> 4) if j >= 16 else (byte & 15)
        q |= np.int32((high >> np.uint32(j)) & np.uint32(1)) << 4
        value = d * np.float32(q - zero)
        out[o + j] = value + m if with_min else value
