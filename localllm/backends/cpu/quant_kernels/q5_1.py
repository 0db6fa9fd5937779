"""Q5_1's CPU kernels (format: localllm/quant/q5_1.py): the vector row dequantizer, the one-row dot
product with a q8_0 activation (its minimum through the activation's block sums) and the grid kernels."""

from __future__ import annotations

from ....jit import exact_kernel, fast_kernel, read_f16
from ....quant.q5_1 import BLOCK, BLOCK_BYTES
from .legacy import block_terms_kernel, dequantize_q5_min_block, row_dot_kernel
from .vector import grid_dot_intrinsic


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*24] -> out: float32[nb*32]; each block d * q + m (vector code: legacy.py)."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        d = read_f16(src, base)
        m = read_f16(src, base + 2)
        dequantize_q5_min_block(src, base + 4, base + 8, 0, d, m, out, b * BLOCK)


block_terms = block_terms_kernel(BLOCK_BYTES, qs_offset=8, qh_offset=4, min_offset=2)
row_dot = row_dot_kernel(block_terms)


# Four weight rows x one activation (the decode matvec) and one weight row x four activation rows
# (batched decode), each result equal to vec_dot's (vector.grid_dot_intrinsic).
dot_4x1 = grid_dot_intrinsic(block_terms, 4, 1)
dot_1x4 = grid_dot_intrinsic(block_terms, 1, 4)


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*24] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32]: q8_0 activation.
    Weights d * q + m: the minimum goes through the activation's block sum (see legacy.row_dot_kernel)."""
    return row_dot(w, aqs, ad, asum, aqs.shape[0] // BLOCK)
