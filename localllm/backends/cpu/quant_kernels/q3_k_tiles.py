"""Q3_K batched products with the weight rows as vector lanes (prefill): q4_k_tiles' scheme for Q3_K.

A tile of 16 weight rows is unpacked per super-block into the transposed scratch (row i's unsigned quant
u = q + 4 = low | high << 2, 0..7, at position p in tile[p // 4, 4 * i + p % 4]); per 16-element group
four vpdpbusd (16 rows at once) are scaled by the rows' signed 6-bit scales (q4_k_tiles.group_sums), and
the offset of u comes back as 4 * sum_g scale_g * asum_g (vpdpwssd on int16 pairs of scales and of the
activation's 16-element sums): the int32 total q3_k.block_sum computes, then q3_k.vec_dot's float step,
fma(ad * d, total, acc), on 16 lanes. Every output equals q3_k.vec_dot's bit for bit.

Measured (one thread, T = 256, 640 x 1024 and 640 x 2048, activation quantization included): 1.35 ns per
(weight row, activation row, super-block), Q4_K's tiles 1.1; 3.6x faster than dequantize + BLAS.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ....jit import exact_kernel, read_f16
from ....quant.q3_k import BLOCK_BYTES, N_GROUPS, _D, _HMASK, _QS
from .q2_k_tiles import N_PAIRS, paired_group_sums, store_group_pairs, store_tile, store_vector, two_bit_chunks
from .q3_k import emit_scales
from .q4_k_tiles import CHUNK, ROWS, TILE, _transpose16, fma_into_row, group_sums
from .q6_k_tiles import group_sum_pairs
from .vector import VectorCode

# From two activation rows the tiles beat the alternative, one vec_dot per weight and activation row (no
# row kernels for this type): 1.1-1.4x at T = 2, 2-3x at T = 6, 640 x 2048, one thread.
MIN_ROWS = 2
NARROW_MIN_ROWS = 4  # on AVX2 (q4_k_tiles.NARROW_MIN_ROWS has the figures)


def high_bit_chunks(v: VectorCode, row, hmask_at):
    """The 256 high bits at row[hmask_at:] (32 bytes: bit 4h + j of byte l is element 128h + 32j + l)
    as four <64 x i8> vectors of 0 or 4, in two_bit_chunks' order."""
    hmask = v.load(None, row, hmask_at, 32)
    chunks = []
    for c in range(4):
        bit = 4 * (c // 2) + 2 * (c % 2)
        chunks.append(v.shl(v.and_(v.join(v.shr(hmask, bit), v.shr(hmask, bit + 1)), 1), 2))
    return chunks


@intrinsic
def unpack_tile_vectors(typingctx, weights, r0, b, tile, scales, scale_pairs):
    """Super-block b of weight rows r0..r0+15: tile uint8[64, 64] (the transposed u = q + 4), scales
    int32[16, 16] (group g's scale of each row), scale_pairs int32[8, 16] (groups 2k and 2k + 1 as the
    low and high int16 of one lane)."""
    sig = types.void(weights, r0, b, tile, scales, scale_pairs)

    def codegen(context, builder, signature, args):
        weights_, r0_, b_, tile_, scales_, pairs_ = args
        wt, _, _, tt, st, pt = signature.args
        v = VectorCode(context, builder)
        i64 = ir.IntType(64)
        r0_ = v.resize(r0_, 64)
        base = builder.mul(v.resize(b_, 64), i64(BLOCK_BYTES))
        chunks, codes = [], []
        for i in range(TILE):
            row = v.row_pointer(wt, weights_, builder.add(r0_, i64(i)))
            low = two_bit_chunks(v, row, builder.add(base, i64(_QS)))
            high = high_bit_chunks(v, row, builder.add(base, i64(_HMASK)))
            chunks.append([v.or_(lo, hi) for lo, hi in zip(low, high)])
            codes.append(v.widen(emit_scales(v, None, row, base), 32))
        store_tile(v, tt, tile_, chunks)
        by_group = _transpose16(v, codes)
        for g in range(N_GROUPS):
            store_vector(v, st, scales_, 16 * g, by_group[g])
        store_group_pairs(v, pt, pairs_, by_group)
        return context.get_dummy_value()

    return sig, codegen


def _tile_dots(rows: int):
    @intrinsic
    def tile_dots(typingctx, tile, scales, scale_pairs, d, aqs, ad, pairs, acc, t, a, b):
        """For activation rows t..t+rows-1 and super-block b: acc[a + u] (16 floats: the tile's rows)
        takes the block's step, as q3_k.vec_dot does it for each row."""
        sig = types.void(tile, scales, scale_pairs, d, aqs, ad, pairs, acc, t, a, b)

        def codegen(context, builder, signature, args):
            tile_, scales_, spairs_, d_, aqs_, ad_, pairs_, acc_, t_, a_, b_ = args
            st = signature.args
            v = VectorCode(context, builder)
            i64 = ir.IntType(64)
            f32x16 = ir.VectorType(ir.FloatType(), 16)
            t_, a_, b_ = v.resize(t_, 64), v.resize(a_, 64), v.resize(b_, 64)
            scaled = group_sums(v, st[0], tile_, st[1], scales_, st[4], aqs_, t_, b_, rows, 4)
            d_vec = v.load(st[3], d_, i64(0), 16)
            scale_pairs = [v.load(st[2], spairs_, i64(16 * k), 16) for k in range(N_PAIRS)]
            for u in range(rows):
                row = builder.add(t_, i64(u))
                offsets = paired_group_sums(v, st[6], pairs_, row, b_, scale_pairs)
                total = builder.sub(scaled[u], v.shl(offsets, 2))
                a_scale = v.splat(builder.load(builder.gep(v.row_pointer(st[5], ad_, row), [b_])), 16)
                # vec_dot's float step, lane by lane: the product ad * d rounded, then one fma
                step_scale = builder.fmul(a_scale, d_vec, flags=("arcp",))
                fma_into_row(v, st[7], acc_, builder.add(a_, i64(u)), step_scale, builder.sitofp(total, f32x16))
            return context.get_dummy_value()

        return sig, codegen

    return tile_dots


tile_dots_4 = _tile_dots(ROWS)
tile_dots_1 = _tile_dots(1)


@exact_kernel(parallel=True)
def matvec_tiles(weights, out, qs, d, s):
    """q4_k_tiles.matvec_tiles for Q3_K: out[t, r] for the first N - N % 16 weight rows, each equal to
    q3_k.vec_dot(weights[r], qs[t], d[t], s[t])."""
    n_rows = qs.shape[0]
    n_blocks = d.shape[1]
    pairs = np.empty((n_rows, n_blocks * N_PAIRS), dtype=np.int32)
    group_sum_pairs(s, pairs)
    for tile_index in prange(weights.shape[0] // TILE):
        r0 = tile_index * TILE
        tile = np.empty((64, 64), dtype=np.uint8)
        scales = np.empty((N_GROUPS, TILE), dtype=np.int32)
        scale_pairs = np.empty((N_PAIRS, TILE), dtype=np.int32)
        dd = np.empty(TILE, dtype=np.float32)
        acc = np.empty((CHUNK, TILE), dtype=np.float32)
        for t0 in range(0, n_rows, CHUNK):
            t1 = min(t0 + CHUNK, n_rows)
            acc[:] = 0.0
            for b in range(n_blocks):
                unpack_tile_vectors(weights, r0, b, tile, scales, scale_pairs)
                for i in range(TILE):
                    dd[i] = read_f16(weights[r0 + i], b * BLOCK_BYTES + _D)
                t = t0
                while t + ROWS <= t1:
                    tile_dots_4(tile, scales, scale_pairs, dd, qs, d, pairs, acc, t, t - t0, b)
                    t += ROWS
                while t < t1:
                    tile_dots_1(tile, scales, scale_pairs, dd, qs, d, pairs, acc, t, t - t0, b)
                    t += 1
            for t in range(t0, t1):
                for i in range(TILE):
                    out[t, r0 + i] = acc[t - t0, i]
