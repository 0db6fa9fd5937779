"""MXFP4's CPU kernels (format: localllm/quant/mxfp4.py): the one-row dot product with a q8_0 activation,
the grid kernels (4 weight rows x 1 activation, 1 x 4) and the pair kernels of the batched decode, as
IQ4_NL's: a block is a 16-level table looked up by nibbles under one scale, here an E8M0 power of two
(VectorCode.load_e8m0_half_splat) ahead of the 16 code bytes. The row dequantizer is the format's."""

from __future__ import annotations

from ....jit import fast_kernel
from ....quant.mxfp4 import BLOCK, BLOCK_BYTES, KVALUES, dequantize_row
from .legacy import level_nibbles, row_dot_kernel, signed_block_terms_kernel, signed_pair_terms_kernel
from .pairs import pair_grid_dots
from .vector import VectorCode, grid_dot_intrinsic

__all__ = ["vec_dot", "dequantize_row", "dot_4x1", "dot_1x4", "PAIR_KERNELS", "ZERO_POINT", "QUAD_ZERO"]

# The 16 levels as signed bytes (|level| <= 12: dot_quads_signed is exact on them).
_quants = level_nibbles([int(level) for level in KVALUES])
_QUANT_BYTES = 1  # each block: the E8M0 exponent, then the 16 bytes of packed codes


def _block_quants(v: VectorCode, w, base):
    """The 32 levels of the block at w[base:] (element pointer), <32 x i8>, in element order."""
    return _quants(v, w, v.offset(base, _QUANT_BYTES))


def _e8m0_scale(v: VectorCode, w, base, lanes: int = 8):
    """The block's scale 2^(e - 128) from its exponent byte, on `lanes` float lanes."""
    return v.load_e8m0_half_splat(None, w, base, lanes)


# Per block the 32 products in eight int32 lanes, scaled by the block's power of two times the
# activation's scale, as Q8_0's and IQ4_NL's (legacy.signed_block_terms_kernel).
block_terms = signed_block_terms_kernel(BLOCK_BYTES, _block_quants, _e8m0_scale)
row_dot = row_dot_kernel(block_terms)
dot_4x1 = grid_dot_intrinsic(block_terms, 4, 1)
dot_1x4 = grid_dot_intrinsic(block_terms, 1, 4)

ZERO_POINT = 0
QUAD_ZERO = 128  # the batched decode's offset for unsigned weight bytes (pairs.py), as Q8_0's
pair_terms = signed_pair_terms_kernel(BLOCK_BYTES, _block_quants, _e8m0_scale)
PAIR_KERNELS = pair_grid_dots(pair_terms)


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*17] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32]: q8_0 activation."""
    return row_dot(w, aqs, ad, asum, aqs.shape[0] // BLOCK)
