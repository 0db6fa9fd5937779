"""Q4_0: 32 weights per 18-byte block, symmetric 4-bit.

Block layout (ggml `block_q4_0`), little-endian:
  bytes 0..1   d       float16   scale
  bytes 2..17  qs[16]  uint8     byte j: element j in the low nibble, element j+16 in the high nibble
Weight = d * (q - 8). Pairs with q8_0 activations.
"""

from __future__ import annotations

import numpy as np

from . import QuantType
from ._legacy import f16_bytes, f16_column, pack_nibbles, quantize_symmetric, unpack_nibbles
from .jit import exact_kernel, fast_kernel, read_f16

BLOCK = 32
BLOCK_BYTES = 18


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*18] -> float32[..., nb*32]."""
    blocks = raw.reshape(-1, BLOCK_BYTES)
    q = unpack_nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)
    return (f16_column(blocks, 0) * q.astype(np.float32)).reshape(*raw.shape[:-1], -1)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/32*18], as quantize_row_q4_0_ref."""
    d, q = quantize_symmetric(x, 8)
    out = np.concatenate([f16_bytes(d), pack_nibbles(q)], axis=1)
    return out.reshape(*np.shape(x)[:-1], -1)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*18] -> out: float32[nb*32]."""
    for b in range(out.shape[0] // BLOCK):
        d = read_f16(src, b * BLOCK_BYTES)
        base = b * BLOCK_BYTES + 2
        for j in range(16):
            byte = src[base + j]
            out[b * BLOCK + j] = d * np.float32(np.int32(byte & 0x0F) - 8)
            out[b * BLOCK + j + 16] = d * np.float32(np.int32(byte >> 4) - 8)


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*18] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32]: q8_0 activation.

    sum((q - 8) * a) = sum(q * a) - 8 * sum(a): the offset folds into the activation's block sum. The
    int16 products truncated to int32 let LLVM use vpmaddwd (see q8_0.vec_dot).
    """
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        base = b * BLOCK_BYTES + 2
        a0 = b * BLOCK
        total = np.int32(0)
        for j in range(16):
            byte = w[base + j]
            total = np.int32(total + np.int32(np.int16(byte & 0x0F) * np.int16(aqs[a0 + j])))
            total = np.int32(total + np.int32(np.int16(byte >> 4) * np.int16(aqs[a0 + 16 + j])))
        total = np.int32(total - 8 * asum[b])
        acc += np.float32(total) * (read_f16(w, b * BLOCK_BYTES) * ad[b])
    return acc


QUANT = QuantType(name="Q4_0", act="q8_0", dequantize=dequantize, dequantize_row=dequantize_row, vec_dot=vec_dot, quantize=quantize)
