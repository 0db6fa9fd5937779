"""Q5_K batched products with the weight rows as vector lanes (prefill): q4_k_tiles with a fifth bit.

Q5_K has Q4_K's scales, mins and float step (q5_k.vec_dot calls q4_k.accumulate); only the quants
differ: 5 bits (0..31, still an unsigned byte for vpdpbusd), the low nibbles at a later offset and the
fifth bits in qh. So the unpacking is this type's own and the per-block products are q4_k_tiles'
tile_dots as they are: every output equals q5_k.vec_dot's bit for bit.

Measured (one thread, 640 x 1024 and 640 x 2048): 0.92 ns per (weight row, activation row, super-block)
at T = 256, 1.55x faster than the row kernels (kquant_rows); 1.3x at T = 64.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ....jit import exact_kernel, read_f16
from ....quant.q5_k import BLOCK_BYTES, N_SUB, _D, _DMIN, _QH, _QS, _SCALES
from .q2_k_tiles import store_tile, store_vector
from .q4_k import emit_scale_min_codes
from .q4_k_tiles import CHUNK, ROWS, TILE, _transpose16, tile_dots_1, tile_dots_4
from .q4_k_tiles import sub_block_sum_pairs
from .vector import VectorCode

# Fewer activation rows: the row kernels (kquant_rows): even with them at T = 24, 0.87x at T = 16, 1.5x
# at T = 256 (640 x 1024 and 640 x 2048, one thread).
MIN_ROWS = 32
NARROW_MIN_ROWS = 16  # on AVX2 (q4_k_tiles.NARROW_MIN_ROWS has the figures)


def five_bit_chunks(v: VectorCode, row, base):
    """The 256 quants of the block at row[base:] as four <64 x i8> vectors: chunk c holds elements
    64c .. 64c + 63 (the nibbles of qs[32c .. 32c + 31], low then high, with bits 2c and 2c + 1 of qh)."""
    builder = v.builder
    i64 = ir.IntType(64)
    high = v.load(None, row, builder.add(base, i64(_QH)), 32)
    chunks = []
    for c in range(4):
        packed = v.load(None, row, builder.add(base, i64(_QS + 32 * c)), 32)
        low = v.or_(v.and_(packed, 15), v.shl(v.and_(v.shr(high, 2 * c), 1), 4))
        upper = v.or_(v.shr(packed, 4), v.shl(v.and_(v.shr(high, 2 * c + 1), 1), 4))
        chunks.append(v.join(low, upper))
    return chunks


@intrinsic
def unpack_tile_vectors(typingctx, weights, r0, b, tile, scales, mins):
    """Super-block b of weight rows r0..r0+15 into q4_k_tiles' scratch: tile uint8[64, 64] (the
    transposed 5-bit quants), scales int32[8, 16], mins int32[4, 16] (sub-blocks 2k and 2k + 1 as the
    low and high int16 of one lane)."""
    sig = types.void(weights, r0, b, tile, scales, mins)

    def codegen(context, builder, signature, args):
        weights_, r0_, b_, tile_, scales_, mins_ = args
        wt, _, _, tt, st, mt = signature.args
        v = VectorCode(context, builder)
        i64 = ir.IntType(64)
        r0_ = v.resize(r0_, 64)
        base = builder.mul(v.resize(b_, 64), i64(BLOCK_BYTES))
        chunks, codes = [], []
        for i in range(TILE):
            row = v.row_pointer(wt, weights_, builder.add(r0_, i64(i)))
            chunks.append(five_bit_chunks(v, row, base))
            codes.append(v.widen(emit_scale_min_codes(v, None, row, builder.add(base, i64(_SCALES))), 32, signed=False))
        store_tile(v, tt, tile_, chunks)
        by_code = _transpose16(v, codes)  # by_code[k]: scale k of each row (k < 8), min k - 8 (k >= 8)
        for k in range(N_SUB):
            store_vector(v, st, scales_, 16 * k, by_code[k])
        for k in range(N_SUB // 2):
            store_vector(v, mt, mins_, 16 * k, v.or_(by_code[8 + 2 * k], v.shl(by_code[9 + 2 * k], 16)))
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel(parallel=True)
def matvec_tiles(weights, out, qs, d, s):
    """q4_k_tiles.matvec_tiles for Q5_K: out[t, r] for the first N - N % 16 weight rows, each equal to
    q5_k.vec_dot(weights[r], qs[t], d[t], s[t])."""
    n_rows = qs.shape[0]
    n_blocks = d.shape[1]
    pairs = np.empty((n_rows, n_blocks * 4), dtype=np.int32)
    sub_block_sum_pairs(s, pairs)
    for tile_index in prange(weights.shape[0] // TILE):
        r0 = tile_index * TILE
        tile = np.empty((64, 64), dtype=np.uint8)
        scales = np.empty((N_SUB, TILE), dtype=np.int32)
        mins = np.empty((N_SUB // 2, TILE), dtype=np.int32)
        dd = np.empty(TILE, dtype=np.float32)
        dm = np.empty(TILE, dtype=np.float32)
        acc = np.empty((CHUNK, TILE), dtype=np.float32)
        for t0 in range(0, n_rows, CHUNK):
            t1 = min(t0 + CHUNK, n_rows)
            acc[:] = 0.0
            for b in range(n_blocks):
                unpack_tile_vectors(weights, r0, b, tile, scales, mins)
                for i in range(TILE):
                    dd[i] = read_f16(weights[r0 + i], b * BLOCK_BYTES + _D)
                    dm[i] = read_f16(weights[r0 + i], b * BLOCK_BYTES + _DMIN)
                t = t0
                while t + ROWS <= t1:
                    tile_dots_4(tile, scales, mins, dd, dm, qs, d, pairs, acc, t, t - t0, b)
                    t += ROWS
                while t < t1:
                    tile_dots_1(tile, scales, mins, dd, dm, qs, d, pairs, acc, t, t - t0, b)
                    t += 1
            for t in range(t0, t1):
                for i in range(TILE):
                    out[t, r0 + i] = acc[t - t0, i]
