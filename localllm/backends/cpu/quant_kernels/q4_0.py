"""Q4_0's CPU kernels (format: localllm/quant/q4_0.py): the vector row dequantizer, the one-row dot
product with a q8_0 activation, the grid kernels (4 weight rows x 1 activation, 1 x 4) and the pair kernels
of the batched decode, all built from legacy.py's block code."""

from __future__ import annotations

import numpy as np

from ....jit import exact_kernel, fast_kernel, read_f16
from ....quant.q4_0 import BLOCK, BLOCK_BYTES
from .legacy import block_terms_kernel, dequantize_q4_block, pair_terms_kernel, row_dot_kernel
from .pairs import pair_grid_dots
from .vector import apart_dot_intrinsic, grid_dot_intrinsic


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*18] -> out: float32[nb*32]; each block d * (q - 8) (vector code: legacy.py)."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        dequantize_q4_block(src, 0, base + 2, 8, read_f16(src, base), np.float32(0.0), out, b * BLOCK)


# One float step per block (block_sums: the order of llama.cpp's re-laid Q4_0 kernels, which it runs on
# AVX2), so that the 16-row lane kernels (legacy_tiles, q4_0_x16) keep one accumulator per row.
block_terms = block_terms_kernel(BLOCK_BYTES, qs_offset=2, zero=8, block_sums=True)
row_dot = row_dot_kernel(block_terms)


# Four weight rows x one activation (the decode matvec) and one weight row x four activation rows
# (batched decode), each result equal to vec_dot's (vector.grid_dot_intrinsic).
dot_4x1 = grid_dot_intrinsic(block_terms, 4, 1)
dot_1x4 = grid_dot_intrinsic(block_terms, 1, 4)

# From this matrix size the decode matvec of rows left as in the file (LOCALLLM_REPACK=0) reads four
# rows a quarter of the matrix apart a step (dot_apart): on the 8B-shaped file (Zen 3, 2 threads) tg32
# 2.34-2.46 tok/s with dot_4x1 against 2.86-3.01 (docs/performance.md).
APART_MIN_BYTES = 8 << 20
dot_apart = apart_dot_intrinsic(block_terms, 4)


# Batched decode on activation pairs (pairs.pair_activations, compact or spread layout): four weight rows
# (pairs.PAIR_ROWS) against 8, 4 or 2 activation rows, by name (pairs.pair_kernel_names).
ZERO_POINT = 8
QUAD_ZERO = 0  # (Q8_0's per-lane starts: pairs.py)
pair_terms = pair_terms_kernel(BLOCK_BYTES, qs_offset=2, block_sums=True)
PAIR_KERNELS = pair_grid_dots(pair_terms)


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*18] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32]: q8_0 activation.
    Weights d * (q - 8): the offset folds into the activation's block sum (see legacy.row_dot_kernel).
    acc = fma(float(sum_j (q_j - 8) * a_j), d * ad[b], acc) over the blocks b in order (block_sums)."""
    return row_dot(w, aqs, ad, asum, aqs.shape[0] // BLOCK)
