"""Q5_0's CPU kernels (format: localllm/quant/q5_0.py): the vector row dequantizer, the one-row dot
product with a q8_0 activation, the grid kernels and the pair kernels of the batched decode."""

from __future__ import annotations

import numpy as np

from ....jit import exact_kernel, fast_kernel, read_f16
from ....quant.q5_0 import BLOCK, BLOCK_BYTES
from .legacy import block_terms_kernel, dequantize_q5_block, pair_terms_kernel, row_dot_kernel
from .pairs import pair_grid_dots
from .vector import grid_dot_intrinsic


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*22] -> out: float32[nb*32]; each block d * (q - 16) (vector code: legacy.py)."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        dequantize_q5_block(src, base + 2, base + 6, 16, read_f16(src, base), np.float32(0.0), out, b * BLOCK)


block_terms = block_terms_kernel(BLOCK_BYTES, qs_offset=6, qh_offset=2, zero=16)
row_dot = row_dot_kernel(block_terms)


# Four weight rows x one activation (the decode matvec) and one weight row x four activation rows
# (batched decode), each result equal to vec_dot's (vector.grid_dot_intrinsic).
dot_4x1 = grid_dot_intrinsic(block_terms, 4, 1)
dot_1x4 = grid_dot_intrinsic(block_terms, 1, 4)


# Batched decode on activation pairs (pairs.pair_activations, compact or spread layout): four weight rows
# (pairs.PAIR_ROWS) against 8, 4 or 2 activation rows, by name (pairs.pair_kernel_names).
ZERO_POINT = 16
QUAD_ZERO = 0  # (Q8_0's per-lane starts: pairs.py)
pair_terms = pair_terms_kernel(BLOCK_BYTES, qs_offset=6, qh_offset=2)
PAIR_KERNELS = pair_grid_dots(pair_terms)


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*22] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32]: q8_0 activation.
    Weights d * (q - 16): the offset folds into the activation's block sum (see legacy.row_dot_kernel)."""
    return row_dot(w, aqs, ad, asum, aqs.shape[0] // BLOCK)
