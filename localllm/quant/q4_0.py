"""Q4_0: 32 weights per 18-byte block, symmetric 4-bit.

Block layout (ggml `block_q4_0`), little-endian:
  bytes 0..1   d       float16   scale
  bytes 2..17  qs[16]  uint8     byte j: element j in the low nibble, element j+16 in the high nibble
Weight = d * (q - 8). Pairs with q8_0 activations.
"""

from __future__ import annotations

import numpy as np

from . import QuantType
from ._legacy import (
    block_terms_kernel,
    dequantize_q4_block,
    f16_bytes,
    f16_column,
    grid_dot_intrinsic,
    pair_grid_dots,
    pair_terms_kernel,
    pack_nibbles,
    quantize_symmetric,
    row_dot_kernel,
    unpack_nibbles,
)
from .jit import exact_kernel, fast_kernel, read_f16
from .q8_k import as_blocks, as_float_blocks

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
    """src: uint8[nb*18] -> out: float32[nb*32]; each block d * (q - 8) (vector code: see _legacy)."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        dequantize_q4_block(src, 0, base + 2, 8, read_f16(src, base), np.float32(0.0), out, b * BLOCK)


block_terms = block_terms_kernel(BLOCK_BYTES, qs_offset=2, zero=8)
row_dot = row_dot_kernel(block_terms)
# Four weight rows x one activation (the decode matvec) and one weight row x four activation rows
# (batched decode), each result equal to vec_dot's (vector.grid_dot_intrinsic).
dot_4x1 = grid_dot_intrinsic(block_terms, 4, 1)
dot_1x4 = grid_dot_intrinsic(block_terms, 1, 4)
# Batched decode on activation pairs (pairs.pair_activations, compact or spread layout): four weight rows
# (pairs.PAIR_ROWS) against 8, 4 or 2 activation rows, by name (pairs.pair_kernel_names).
ZERO_POINT = 8
QUAD_ZERO = 0  # (Q8_0's per-lane starts: pairs.py)
pair_terms = pair_terms_kernel(BLOCK_BYTES, qs_offset=2)
PAIR_KERNELS = pair_grid_dots(pair_terms)


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*18] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32]: q8_0 activation.
    Weights d * (q - 8): the offset folds into the activation's block sum (see _legacy.row_dot_kernel)."""
    return row_dot(w, aqs, ad, asum, aqs.shape[0] // BLOCK)


QUANT = QuantType(name="Q4_0", act="q8_0", dequantize=dequantize, dequantize_row=dequantize_row, vec_dot=vec_dot, quantize=quantize)
