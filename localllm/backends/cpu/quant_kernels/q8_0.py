"""Q8_0's CPU kernels (format: localllm/quant/q8_0.py): the one-row dot product with a q8_0 activation,
the grid kernels (4 weight rows x 1 activation, 1 x 4) and the pair kernels of the batched decode."""

from __future__ import annotations

from ....jit import fast_kernel
from ....quant.q8_0 import BLOCK, BLOCK_BYTES
from .legacy import row_dot_kernel, signed_block_terms_kernel, signed_pair_terms_kernel
from .pairs import pair_grid_dots
from .vector import VectorCode, apart_dot_intrinsic, grid_dot_intrinsic


def _quants(v: VectorCode, w, base):
    """The 32 signed quants of the block at w[base:] (element pointer): the bytes after its scale."""
    return v.load(None, w, v.offset(base, 2), BLOCK)


# Per block the 32 int8 products in eight int32 lanes and the scale d_w * d_a (legacy.py); against
# activation pairs, the weights as unsigned bytes w + 128 in the spread layout (QUAD_ZERO).
block_terms = signed_block_terms_kernel(BLOCK_BYTES, _quants)
row_dot = row_dot_kernel(block_terms)
pair_terms = signed_pair_terms_kernel(BLOCK_BYTES, _quants)


ZERO_POINT = 0  # the weights are d * q: no activation-sum correction (pairs.pair_activations)
QUAD_ZERO = 128  # the batched decode's offset for unsigned weight bytes (pairs.py)


# From this size (beyond the 32 MiB L3 of the Zen 5 machine measured) the decode matvec takes dot_apart,
# four rows a quarter of the matrix apart, instead of dot_4x1's four neighbours: streamed from memory, one
# row at a time had run at 41 GB/s and dot_4x1 at 36 there; four runs side by side beat one row at a time
# by ~5% a token on a Zen 4 (docs/performance.md).
APART_MIN_BYTES = 32 << 20


# Several dot products at once (VectorCode.grid_sum), each equal to vec_dot's: four weight rows against
# one activation (the decode matvec), one weight row against four activation rows (batched decode).
dot_4x1 = grid_dot_intrinsic(block_terms, 4, 1)
dot_1x4 = grid_dot_intrinsic(block_terms, 1, 4)
dot_apart = apart_dot_intrinsic(block_terms, 4)


# Batched decode on activation pairs (pairs.pair_activations, compact or spread layout): four weight rows
# (pairs.PAIR_ROWS) against 8, 4 or 2 activation rows, by name (pairs.pair_kernel_names).
PAIR_KERNELS = pair_grid_dots(pair_terms)


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*34] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32]: q8_0 activation.

    llama.cpp's AVX2 scheme: per block, the 32 int8 products summed into eight int32 lanes (two
    multiply-adds, exact: activations lie in -127..127), converted and scaled by d_w * d_a as a vector and
    added to float vector accumulators; one horizontal sum per row (row_dot). The auto-vectorised loop it
    replaces summed every block horizontally and ran at 11 GB/s on one thread.
    """
    return row_dot(w, aqs, ad, asum, aqs.shape[0] // BLOCK)
