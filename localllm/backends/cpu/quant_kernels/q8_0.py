"""Q8_0's CPU kernels (format: localllm/quant/q8_0.py): the one-row dot product with a q8_0 activation,
the grid kernels (4 weight rows x 1 activation, 1 x 4) and the pair kernels of the batched decode."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ....jit import fast_kernel
from ....quant.q8_0 import BLOCK, BLOCK_BYTES
from .pairs import dot_quads_offset_wide, dot_quads_signed_wide, pair_grid_dots, pair_lane, pair_lanes
from .vector import VectorCode, grid_dot_intrinsic


def block_terms(v: VectorCode, w, aqs, ad, asum, b, prefetch):
    """Block b of the weight row w against the q8_0 activation (aqs, ad) (element pointers): the 32
    products in eight int32 lanes and the scale d_w * d_a as a vector (asum unused: no zero point).
    prefetch: None, or the row pointer to prefetch PREFETCH_BYTES past block b of."""
    builder = v.builder
    base = builder.mul(b, ir.Constant(b.type, BLOCK_BYTES))
    quants = v.load(None, w, v.offset(base, 2), BLOCK)
    if prefetch is not None:
        v.prefetch(None, prefetch, base)
    acts = v.load(None, aqs, builder.mul(b, ir.Constant(b.type, BLOCK)), BLOCK)
    ints = v.dot_quads_signed(quants, acts)
    scale = builder.fmul(v.load_f16_splat(None, w, base), v.splat(v.load_scalar(None, ad, b), 8), flags=v.PINNED)
    return ints, scale


@intrinsic
def row_dot(typingctx, w, aqs, ad, n_blocks):
    """sum_b d_b * ad[b] * <w block b, aqs block b> over n_blocks blocks, float32 (see vec_dot)."""
    sig = types.float32(w, aqs, ad, n_blocks)

    def codegen(context, builder, signature, args):
        w_, aqs_, ad_, n_blocks_ = args
        w_type, aqs_type, ad_type, _ = signature.args
        v = VectorCode(context, builder)
        pointers = [v._data(t, a) for t, a in ((w_type, w_), (aqs_type, aqs_), (ad_type, ad_))]
        return v.row_sum(n_blocks_, lambda b: block_terms(v, *pointers, None, b, pointers[0]))

    return sig, codegen


def pair_terms(v: VectorCode, w, pq, pd, ps, b, half, prefetch, spread):
    """block_terms against an activation pair (pairs.pair_activations): both rows in 512-bit vectors for
    half None, else row half (ps unused). Both rows: in the spread layout the weights as unsigned bytes
    w + 128 from ps's per-lane starts (QUAD_ZERO, see pairs.py); in the compact one, which has no room for
    those, the activations take the weights' signs by a masked negation (AVX-512 has no vpsignb)."""
    builder = v.builder
    base = builder.mul(b, ir.Constant(b.type, BLOCK_BYTES))
    quants = v.load(None, w, v.offset(base, 2), BLOCK)
    if prefetch is not None:
        v.prefetch(None, prefetch, base)
    if half is None:
        acts = v.load(None, pq, builder.mul(b, ir.Constant(b.type, 2 * BLOCK)), 2 * BLOCK)
        if spread:
            ints = dot_quads_offset_wide(v, v.join(quants, quants), acts, pair_lanes(v, ps, b, spread))
        else:
            ints = dot_quads_signed_wide(v, v.join(quants, quants), acts)
        return ints, builder.fmul(v.load_f16_splat(None, w, base, 16), pair_lanes(v, pd, b, spread), flags=v.PINNED)
    acts = v.load(None, pq, v.offset(builder.mul(b, ir.Constant(b.type, 2 * BLOCK)), BLOCK * half), BLOCK)
    ints = v.dot_quads_signed(quants, acts)
    act_scale = pair_lane(v, pd, b, half, spread)
    return ints, builder.fmul(v.load_f16_splat(None, w, base), v.splat(act_scale, 8), flags=v.PINNED)


ZERO_POINT = 0  # the weights are d * q: no activation-sum correction (pairs.pair_activations)
QUAD_ZERO = 128  # the batched decode's offset for unsigned weight bytes (pairs.py)


# From this size (beyond the 32 MiB L3 of the Zen 5 machine measured) the decode matvec goes row by row
# (vec_dot): streamed from memory, one row at a time ran at 41 GB/s, dot_4x1 at 36 (backends/cpu/drivers).
ONE_ROW_MIN_BYTES = 32 << 20


# Several dot products at once (VectorCode.grid_sum), each equal to vec_dot's: four weight rows against
# one activation (the decode matvec), one weight row against four activation rows (batched decode).
dot_4x1 = grid_dot_intrinsic(block_terms, 4, 1)
dot_1x4 = grid_dot_intrinsic(block_terms, 1, 4)


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
    return row_dot(w, aqs, ad, aqs.shape[0] // BLOCK)
