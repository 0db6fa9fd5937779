"""IQ4_NL's CPU kernels (format: localllm/quant/iq4_nl.py): the one-row dot product with a q8_0 activation,
the grid kernels (4 weight rows x 1 activation, 1 x 4), the pair kernels of the batched decode and the row
dequantizer in vector code."""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic

from ....jit import exact_kernel, fast_kernel, read_f16
from ....quant.iq4_nl import BLOCK, BLOCK_BYTES, KVALUES
from .legacy import level_nibbles, row_dot_kernel, signed_block_terms_kernel, signed_pair_terms_kernel
from .pairs import pair_grid_dots
from .vector import VectorCode, grid_dot_intrinsic


# The 16 levels as signed bytes (|level| <= 127: dot_quads_signed is exact on them).
_quants = level_nibbles([int(level) for level in KVALUES])
_QUANT_BYTES = 2  # each block: float16 d, then the 16 bytes of packed level indices


def _block_quants(v: VectorCode, w, base):
    """The 32 levels of the block at w[base:] (element pointer), <32 x i8>, in element order."""
    return _quants(v, w, v.offset(base, _QUANT_BYTES))


# IQ4_NL is Q8_0 with a looked-up block: weights d * level, signed, no zero point. So its one-row, grid
# and pair kernels are Q8_0's (legacy.signed_block_terms_kernel), in the block-sums order: per block the
# 32 products summed in integers, then one float step, acc = fma(float(sum), d * ad, acc), block after
# block. That is the order of llama.cpp's re-laid IQ4_NL kernels, which it runs on AVX2 for every matrix
# of N % 8 == 0 (repack.cpp: iq4_nl_8x8_q8_0, gemv/gemm_q4_b32_8x8_q8_0_lut_avx), and it lets the 16-row
# tiles keep one accumulator per row (legacy_tiles, tile_sums.py).
block_terms = signed_block_terms_kernel(BLOCK_BYTES, _block_quants, block_sums=True)
row_dot = row_dot_kernel(block_terms)
dot_4x1 = grid_dot_intrinsic(block_terms, 4, 1)
dot_1x4 = grid_dot_intrinsic(block_terms, 1, 4)

ZERO_POINT = 0
QUAD_ZERO = 128  # the batched decode's offset for unsigned weight bytes (pairs.py), as Q8_0's
pair_terms = signed_pair_terms_kernel(BLOCK_BYTES, _block_quants, block_sums=True)
PAIR_KERNELS = pair_grid_dots(pair_terms)


@intrinsic
def dequantize_indices(typingctx, src, qs, step, out, o):
    """out[o : o+32] = step * KVALUES[index] for the 32 indices packed at src[qs : qs+16] (low nibbles
    first), each lane one IEEE float32 product (what the NumPy reference computes)."""
    sig = types.void(src, qs, step, out, o)

    def codegen(context, builder, signature, args):
        src_, qs_, step_, out_, o_ = args
        v = VectorCode(context, builder)
        packed = v.load(signature.args[0], src_, qs_, 16)
        values = v.lookup16(KVALUES, v.join(v.and_(packed, 15), v.shr(packed, 4)))
        step32 = context.cast(builder, step_, signature.args[2], types.float32)
        v.store_dequantized(signature.args[3], out_, o_, values, True, (step32, step32))
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*18] -> out: float32[nb*32], d * KVALUES[index] (quant.iq4_nl.dequantize_row's bits)."""
    for b in range(out.shape[0] // BLOCK):
        dequantize_indices(src, b * BLOCK_BYTES + 2, read_f16(src, b * BLOCK_BYTES), out, b * BLOCK)


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*18] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32]: q8_0 activation.
    acc = fma(float(sum_j level_j * a_j), d * ad[b], acc) over the blocks b in order (block_sums)."""
    return row_dot(w, aqs, ad, asum, aqs.shape[0] // BLOCK)
