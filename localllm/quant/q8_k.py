"""Q8_K: 256 weights per 292-byte super-block, symmetric 8-bit with a float32 scale.

Block layout (ggml `block_q8_K`), little-endian:
  bytes   0..3     d          float32   scale; weight j = d * qs[j]
  bytes   4..259   qs[256]    int8      quants
  bytes 260..291   bsums[16]  int16     sum of qs[16g .. 16g+15] for each group g of 16

ggml uses Q8_K as the activation format (`vec_dot_type`) of every K-quant; as a weight type it pairs
with q8_k activations too (a dot product of two Q8_K rows). localllm keeps q8_k activations unpacked
(activation.py), so `quantize` here packs the same numbers into ggml's 292-byte blocks.
"""

from __future__ import annotations

import numpy as np

from ..jit import exact_kernel, read_f32
from . import QuantType
from .activation import quantize_q8_k
from .blocks import QK_K, as_blocks, as_float_blocks

BLOCK = QK_K
BLOCK_BYTES = 292
GROUPS = QK_K // 16  # bsums per block

_QS = 4
_BSUMS = 260


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*292] -> float32[..., nb*256]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "Q8_K")
    d = blocks[:, :_QS].copy().view(np.float32)
    qs = blocks[:, _QS:_BSUMS].view(np.int8).astype(np.float32)
    return (d * qs).reshape(*np.shape(raw)[:-1], -1)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/256*292], as llama.cpp's quantize_row_q8_K (via activation.py)."""
    blocks = as_float_blocks(x, BLOCK, "Q8_K")
    flat = blocks.reshape(-1)
    qs = np.empty(flat.shape[0], dtype=np.int8)
    d = np.empty(blocks.shape[0], dtype=np.float32)
    bsums = np.empty(blocks.shape[0] * GROUPS, dtype=np.int32)
    quantize_q8_k(flat, qs, d, bsums)
    out = np.empty((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    out[:, :_QS] = d.reshape(-1, 1).view(np.uint8)
    out[:, _QS:_BSUMS] = qs.reshape(-1, BLOCK).view(np.uint8)
    # |bsum| <= 16*128, so int16 holds it exactly, as in ggml.
    out[:, _BSUMS:] = bsums.astype("<i2").reshape(-1, GROUPS).view(np.uint8)
    return out.reshape(*np.shape(x)[:-1], -1)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*292] -> out: float32[nb*256]."""
    qs = src.view(np.int8)
    for b in range(out.shape[0] // BLOCK):
        d = read_f32(src, b * BLOCK_BYTES)
        base = b * BLOCK_BYTES + _QS
        for j in range(BLOCK):
            out[b * BLOCK + j] = d * np.float32(qs[base + j])


QUANT = QuantType(
    name="Q8_K",
    act="q8_k",
    dequantize=dequantize,
    dequantize_row=dequantize_row,
    quantize=quantize,
)
