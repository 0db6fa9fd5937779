"""Q5_0: 32 weights per 22-byte block, symmetric 5-bit.

Block layout (ggml `block_q5_0`), little-endian:
  bytes 0..1   d       float16   scale
  bytes 2..5   qh      uint32    bit j = fifth bit of element j
  bytes 6..21  qs[16]  uint8     byte j: low 4 bits of element j (low nibble) and of element j+16 (high)
Weight = d * (q - 16). Pairs with q8_0 activations.
"""

from __future__ import annotations

import numpy as np

from . import QuantType
from ._legacy import f16_bytes, f16_column, pack_high_bits, pack_nibbles, quantize_symmetric, unpack_high_bits, unpack_nibbles
from .jit import exact_kernel, fast_kernel, read_f16

BLOCK = 32
BLOCK_BYTES = 22


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*22] -> float32[..., nb*32]."""
    blocks = raw.reshape(-1, BLOCK_BYTES)
    q = unpack_nibbles(blocks[:, 6:]) | (unpack_high_bits(blocks[:, 2:6]) << np.uint8(4))
    q = q.astype(np.int8) - np.int8(16)
    return (f16_column(blocks, 0) * q.astype(np.float32)).reshape(*raw.shape[:-1], -1)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/32*22], as quantize_row_q5_0_ref."""
    d, q = quantize_symmetric(x, 16)
    out = np.concatenate([f16_bytes(d), pack_high_bits(q), pack_nibbles(q)], axis=1)
    return out.reshape(*np.shape(x)[:-1], -1)


@exact_kernel
def _high_bits(src, offset):
    return (
        np.uint32(src[offset])
        | (np.uint32(src[offset + 1]) << np.uint32(8))
        | (np.uint32(src[offset + 2]) << np.uint32(16))
        | (np.uint32(src[offset + 3]) << np.uint32(24))
    )


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*22] -> out: float32[nb*32]."""
    for b in range(out.shape[0] // BLOCK):
        d = read_f16(src, b * BLOCK_BYTES)
        qh = _high_bits(src, b * BLOCK_BYTES + 2)
        base = b * BLOCK_BYTES + 6
        for j in range(16):
            byte = src[base + j]
            lo = np.int32(byte & 0x0F) | np.int32(((qh >> np.uint32(j)) & np.uint32(1)) << np.uint32(4))
            hi = np.int32(byte >> 4) | np.int32(((qh >> np.uint32(j + 16)) & np.uint32(1)) << np.uint32(4))
            out[b * BLOCK + j] = d * np.float32(lo - 16)
            out[b * BLOCK + j + 16] = d * np.float32(hi - 16)


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*22] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32]: q8_0 activation.
    The -16 offset folds into the activation's block sum."""
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        qh = _high_bits(w, b * BLOCK_BYTES + 2)
        base = b * BLOCK_BYTES + 6
        a0 = b * BLOCK
        total = np.int32(0)
        for j in range(16):
            byte = w[base + j]
            lo = np.int16(byte & 0x0F) | np.int16(((qh >> np.uint32(j)) & np.uint32(1)) << np.uint32(4))
            hi = np.int16(byte >> 4) | np.int16(((qh >> np.uint32(j + 16)) & np.uint32(1)) << np.uint32(4))
            total = np.int32(total + np.int32(lo * np.int16(aqs[a0 + j])))
            total = np.int32(total + np.int32(hi * np.int16(aqs[a0 + 16 + j])))
        total = np.int32(total - 16 * asum[b])
        acc += np.float32(total) * (read_f16(w, b * BLOCK_BYTES) * ad[b])
    return acc


QUANT = QuantType(name="Q5_0", act="q8_0", dequantize=dequantize, dequantize_row=dequantize_row, vec_dot=vec_dot, quantize=quantize)
