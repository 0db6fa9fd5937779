"""Q6_K batched products with the weight rows as vector lanes (prefill): q4_k_tiles' scheme for Q6_K.

A tile of 16 weight rows is unpacked per super-block into the transposed scratch (row i's unsigned 6-bit
quant u = q + 32 at position p in tile[p // 4, 4 * i + p % 4]); per 16-element group the four vpdpbusd
products (16 rows at once) are scaled by the rows' int8 group scales, and the offset comes back as
32 * sum_g scale_g * asum_g (vpdpwssd on int16 pairs of scales and of the activation's 16-element sums):
the int32 total q6_k.block_sum computes, then q6_k.accumulate's float step, fma(ad * d, total, acc), on
16 lanes. Every output equals q6_k.vec_dot's bit for bit.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ....jit import exact_kernel, read_f16
from .q4_k_tiles import CHUNK, ROWS, TILE, _dot_word_pairs_512, _transpose16, fma_into_row, group_sums
from .q6_k import BLOCK_BYTES
from .vector import VectorCode

_QL, _QH, _SCALES, _D = 0, 128, 192, 208
N_GROUPS = 16


@intrinsic
def unpack_tile_vectors(typingctx, weights, r0, b, tile, scales, scale_pairs):
    """Super-block b of weight rows r0..r0+15: tile uint8[64, 64] (transposed unsigned quants),
    scales int32[16, 16] (group g's scale of each row), scale_pairs int32[8, 16] (groups 2k and 2k+1 as
    the low and high int16 of one lane)."""
    sig = types.void(weights, r0, b, tile, scales, scale_pairs)

    def codegen(context, builder, signature, args):
        weights_, r0_, b_, tile_, scales_, pairs_ = args
        wt, _, _, tt, st, pt = signature.args
        v = VectorCode(context, builder)
        i64 = ir.IntType(64)
        r0_ = v.resize(r0_, 64)
        base = builder.mul(v.resize(b_, 64), i64(BLOCK_BYTES))
        rows, codes = [], []
        for i in range(TILE):
            row = v.row_pointer(wt, weights_, builder.add(r0_, i64(i)))
            chunks = []
            for h in range(2):
                low = v.load(None, row, builder.add(base, i64(_QL + 64 * h)), 32)
                low2 = v.load(None, row, builder.add(base, i64(_QL + 64 * h + 32)), 32)
                high = v.load(None, row, builder.add(base, i64(_QH + 32 * h)), 32)
                quants = (  # elements 128h + 32i + l for i = 0..3 (q6_k's layout)
                    v.or_(v.and_(low, 15), v.shl(v.and_(high, 3), 4)),
                    v.or_(v.and_(low2, 15), v.shl(v.and_(high, 12), 2)),
                    v.or_(v.shr(low, 4), v.and_(high, 48)),
                    v.or_(v.shr(low2, 4), v.and_(v.shr(high, 2), 48)),
                )
                for j in range(2):
                    chunks.append(v.bitcast(v.join(quants[2 * j], quants[2 * j + 1]), 16, 32))
            rows.append(chunks)
            codes.append(v.widen(v.load(None, row, builder.add(base, i64(_SCALES)), N_GROUPS), 32))

        def store(array_type, array, index, vec):
            pointer = builder.gep(v._data(array_type, array), [i64(index)])
            builder.store(vec, builder.bitcast(pointer, vec.type.as_pointer()), align=1)

        for c in range(4):
            for m, vec in enumerate(_transpose16(v, [rows[i][c] for i in range(TILE)])):
                store(tt, tile_, 64 * (16 * c + m), vec)
        by_group = _transpose16(v, codes)
        for g in range(N_GROUPS):
            store(st, scales_, 16 * g, by_group[g])
        for k in range(N_GROUPS // 2):
            store(pt, pairs_, 16 * k, v.or_(v.and_(by_group[2 * k], 0xFFFF), v.shl(by_group[2 * k + 1], 16)))
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel
def group_sum_pairs(asum, out):
    """out int32[T, nb * 8]: the 16-element sums of groups 2k and 2k+1 as the low and high int16."""
    for t in range(asum.shape[0]):
        for g in range(out.shape[1]):
            out[t, g] = (asum[t, 2 * g] & 0xFFFF) | (asum[t, 2 * g + 1] << 16)


def _tile_dots(rows: int):
    @intrinsic
    def tile_dots(typingctx, tile, scales, scale_pairs, d, aqs, ad, pairs, acc, t, a, b):
        """For activation rows t..t+rows-1 and super-block b: acc[a + u] takes the block's step."""
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
            scale_pairs = [v.load(st[2], spairs_, i64(16 * k), 16) for k in range(N_GROUPS // 2)]
            for u in range(rows):
                row = builder.add(t_, i64(u))
                pair_row = v.row_pointer(st[6], pairs_, row)
                offsets = None
                for k in range(N_GROUPS // 2):
                    sums = builder.load(builder.gep(pair_row, [builder.add(builder.mul(b_, i64(8)), i64(k))]))
                    offsets = _dot_word_pairs_512(v, offsets, scale_pairs[k], v.splat(sums, 16))
                total = builder.sub(scaled[u], v.shl(offsets, 5))
                a_scale = v.splat(builder.load(builder.gep(v.row_pointer(st[5], ad_, row), [b_])), 16)
                # accumulate's float step, lane by lane: the product ad * d rounded, then one fma
                step_scale = builder.fmul(a_scale, d_vec, flags=("arcp",))
                fma_into_row(v, st[7], acc_, builder.add(a_, i64(u)), step_scale, builder.sitofp(total, f32x16))
            return context.get_dummy_value()

        return sig, codegen

    return tile_dots


tile_dots_4 = _tile_dots(ROWS)
tile_dots_1 = _tile_dots(1)


@exact_kernel(parallel=True)
def matvec_tiles(weights, out, qs, d, s):
    """q4_k_tiles.matvec_tiles for Q6_K: out[t, r] for the first N - N % 16 weight rows, each equal to
    q6_k.vec_dot(weights[r], qs[t], d[t], s[t])."""
    n_rows = qs.shape[0]
    n_blocks = d.shape[1]
    pairs = np.empty((n_rows, n_blocks * 8), dtype=np.int32)
    group_sum_pairs(s, pairs)
    for tile_index in prange(weights.shape[0] // TILE):
        r0 = tile_index * TILE
        tile = np.empty((64, 64), dtype=np.uint8)
        scales = np.empty((N_GROUPS, TILE), dtype=np.int32)
        scale_pairs = np.empty((N_GROUPS // 2, TILE), dtype=np.int32)
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


