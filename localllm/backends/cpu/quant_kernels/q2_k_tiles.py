"""Q2_K batched products with the weight rows as vector lanes (prefill): q4_k_tiles' scheme for Q2_K.

A tile of 16 weight rows is unpacked per super-block into the transposed scratch (row i's element p at
tile[p // 4, 4 * i + p % 4]), each 2-bit quant already multiplied by its group's 4-bit scale (q * scale
<= 45 fits the unsigned byte vpdpbusd takes), so vpdpbusd alone (two chains per activation row) gives
sum_g scale_g * <q_g, a_g> for 16 rows, with no multiply per group. The mins go through vpdpwssd: the
rows' min pairs (int16) against the activation's 16-element sums in pairs. Then q2_k.vec_dot's float
step, fma(ad, fma(d, scaled, -(dmin * mins)), acc) (q4_k.accumulate), on 16 lanes: every output equals
q2_k.vec_dot's bit for bit.

Measured (one thread, T = 256, 640 x 1024 and 640 x 2048, activation quantization included): 1.2 ns per
(weight row, activation row, super-block), Q4_K's tiles 1.1; 3.8x faster than dequantize + BLAS.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ....jit import exact_kernel, read_f16
from ....quant.q2_k import BLOCK_BYTES, N_GROUPS, _D, _DMIN, _QS, _SCALES
from .q4_k_tiles import CHUNK, ROWS, TILE, _dot_quads_512, _dot_word_pairs_512, _transpose16, activation_quads, fma_into_row
from .q6_k_tiles import group_sum_pairs
from .vector import VectorCode

# From two activation rows the tiles beat the alternative, one vec_dot per weight and activation row (no
# row kernels for this type): 1.1-1.4x at T = 2, 2-3x at T = 6, 640 x 2048, one thread.
MIN_ROWS = 2
NARROW_MIN_ROWS = 8  # on AVX2 (q4_k_tiles.NARROW_MIN_ROWS has the figures)
N_PAIRS = N_GROUPS // 2  # int16 pairs of groups (2k, 2k + 1) per super-block


def two_bit_chunks(v: VectorCode, row, quants_at):
    """The 256 2-bit quants at row[quants_at:] (64 bytes, Q2_K's and Q3_K's qs layout) as four <64 x i8>
    vectors: chunk c holds elements 64c .. 64c + 63 (half h = c // 2: bits 2j, 2j + 1 of its 32 bytes,
    then bits 2j + 2, 2j + 3, for j = 2 * (c % 2))."""
    builder = v.builder
    i64 = ir.IntType(64)
    halves = [v.load(None, row, builder.add(quants_at, i64(32 * h)), 32) for h in range(2)]
    chunks = []
    for c in range(4):
        j = 2 * (c % 2)
        packed = halves[c // 2]
        chunks.append(v.join(v.and_(v.shr(packed, 2 * j), 3), v.and_(v.shr(packed, 2 * j + 2), 3)))
    return chunks


def store_vector(v: VectorCode, array_type, array, index: int, vec):
    """array[index : index + lanes] = vec (array's data, unaligned)."""
    builder = v.builder
    pointer = builder.gep(v._data(array_type, array), [ir.IntType(64)(index)])
    builder.store(vec, builder.bitcast(pointer, vec.type.as_pointer()), align=1)


def store_tile(v: VectorCode, tile_type, tile, chunks):
    """chunks[i][c] (<64 x i8>: row i's elements 64c .. 64c + 63) transposed into tile uint8[64, 64]:
    element p of row i at tile[p // 4, 4 * i + p % 4] (per chunk a 16 x 16 transpose of 32-bit lanes)."""
    for c in range(4):
        lanes = [v.bitcast(chunks[i][c], 16, 32) for i in range(TILE)]
        for m, vec in enumerate(_transpose16(v, lanes)):
            store_vector(v, tile_type, tile, 64 * (16 * c + m), vec)


def store_group_pairs(v: VectorCode, pairs_type, pairs, by_group):
    """pairs int32[8, 16]: lane i of row k = by_group[2k] lane i (low int16) | by_group[2k + 1] (high)."""
    for k in range(N_PAIRS):
        store_vector(v, pairs_type, pairs, 16 * k, v.or_(v.and_(by_group[2 * k], 0xFFFF), v.shl(by_group[2 * k + 1], 16)))


@intrinsic
def unpack_tile_vectors(typingctx, weights, r0, b, tile, min_pairs):
    """Super-block b of weight rows r0..r0+15: tile uint8[64, 64] (the transposed products scale_g * q),
    min_pairs int32[8, 16] (the mins of groups 2k and 2k + 1 of each row as the low and high int16)."""
    sig = types.void(weights, r0, b, tile, min_pairs)

    def codegen(context, builder, signature, args):
        weights_, r0_, b_, tile_, pairs_ = args
        wt, _, _, tt, pt = signature.args
        v = VectorCode(context, builder)
        i64 = ir.IntType(64)
        r0_ = v.resize(r0_, 64)
        base = builder.mul(v.resize(b_, 64), i64(BLOCK_BYTES))
        chunks, mins = [], []
        for i in range(TILE):
            row = v.row_pointer(wt, weights_, builder.add(r0_, i64(i)))
            codes = v.load(None, row, builder.add(base, i64(_SCALES)), N_GROUPS)  # scale | min << 4
            scales = v.and_(codes, 15)
            quants = two_bit_chunks(v, row, builder.add(base, i64(_QS)))
            # chunk c spans groups 4c .. 4c + 3, 16 bytes each
            chunks.append([builder.mul(q, v.shuffle(scales, [4 * c + p // 16 for p in range(64)])) for c, q in enumerate(quants)])
            mins.append(v.widen(v.shr(codes, 4), 32, signed=False))
        store_tile(v, tt, tile_, chunks)
        store_group_pairs(v, pt, pairs_, _transpose16(v, mins))
        return context.get_dummy_value()

    return sig, codegen


def scaled_sums(v: VectorCode, tile_type, tile, aqs_type, aqs, t, b, rows: int):
    """Per activation row t + u (u < rows): <16 x i32>, lane i = sum over the block's 256 positions of
    tile (scale * q of weight row i) times the activation's byte; two vpdpbusd chains per row (the
    latency of one chain of 64 would bound the loop), each tile vector loaded once for the rows."""
    i64 = ir.IntType(64)
    act_quad = activation_quads(v, aqs_type, aqs, t, b, rows)
    sums = [[None, None] for _ in range(rows)]
    for quad in range(64):
        quads = v.load(tile_type, tile, i64(64 * quad), 64)
        for u in range(rows):
            sums[u][quad % 2] = _dot_quads_512(v, sums[u][quad % 2], quads, act_quad(u, 4 * quad))
    return [v.add(even, odd) for even, odd in sums]


def paired_group_sums(v: VectorCode, sums_type, sums, row, b, weight_pairs):
    """<16 x i32>: lane i = sum_g w_g(row i) * asum_g over the block's 16 groups, from the rows' int16
    pairs (weight_pairs: 8 vectors) and the activation row's pairs of 16-element sums (vpdpwssd)."""
    builder = v.builder
    i64 = ir.IntType(64)
    pair_row = v.row_pointer(sums_type, sums, row)
    total = None
    for k in range(N_PAIRS):
        group_pair = builder.load(builder.gep(pair_row, [builder.add(builder.mul(b, i64(N_PAIRS)), i64(k))]))
        total = _dot_word_pairs_512(v, total, weight_pairs[k], v.splat(group_pair, 16))
    return total


def _tile_dots(rows: int):
    @intrinsic
    def tile_dots(typingctx, tile, min_pairs, d, dmin, aqs, ad, pairs, acc, t, a, b):
        """For activation rows t..t+rows-1 and super-block b: acc[a + u] (16 floats: the tile's rows)
        takes the block's step, as q2_k.vec_dot does it for each row."""
        sig = types.void(tile, min_pairs, d, dmin, aqs, ad, pairs, acc, t, a, b)

        def codegen(context, builder, signature, args):
            tile_, mpairs_, d_, dmin_, aqs_, ad_, pairs_, acc_, t_, a_, b_ = args
            st = signature.args
            v = VectorCode(context, builder)
            i64 = ir.IntType(64)
            f32x16 = ir.VectorType(ir.FloatType(), 16)
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32x16, [f32x16] * 3), "llvm.fma.v16f32")
            t_, a_, b_ = v.resize(t_, 64), v.resize(a_, 64), v.resize(b_, 64)
            scaled = scaled_sums(v, st[0], tile_, st[4], aqs_, t_, b_, rows)
            d_vec = v.load(st[2], d_, i64(0), 16)
            dmin_vec = v.load(st[3], dmin_, i64(0), 16)
            mins_pairs = [v.load(st[1], mpairs_, i64(16 * k), 16) for k in range(N_PAIRS)]
            for u in range(rows):
                row = builder.add(t_, i64(u))
                mins = paired_group_sums(v, st[6], pairs_, row, b_, mins_pairs)
                # q4_k.accumulate's float step, lane by lane (no fast-math flags: each operation rounded as written)
                mins_term = builder.fmul(dmin_vec, builder.sitofp(mins, f32x16), flags=("arcp",))
                step = builder.call(fma, [d_vec, builder.sitofp(scaled[u], f32x16), builder.fneg(mins_term, flags=("arcp",))])
                a_scale = v.splat(builder.load(builder.gep(v.row_pointer(st[5], ad_, row), [b_])), 16)
                fma_into_row(v, st[7], acc_, builder.add(a_, i64(u)), a_scale, step)
            return context.get_dummy_value()

        return sig, codegen

    return tile_dots


tile_dots_4 = _tile_dots(ROWS)
tile_dots_1 = _tile_dots(1)


@exact_kernel(parallel=True)
def matvec_tiles(weights, out, qs, d, s):
    """q4_k_tiles.matvec_tiles for Q2_K: out[t, r] for the first N - N % 16 weight rows, each equal to
    q2_k.vec_dot(weights[r], qs[t], d[t], s[t])."""
    n_rows = qs.shape[0]
    n_blocks = d.shape[1]
    pairs = np.empty((n_rows, n_blocks * N_PAIRS), dtype=np.int32)
    group_sum_pairs(s, pairs)
    for tile_index in prange(weights.shape[0] // TILE):
        r0 = tile_index * TILE
        tile = np.empty((64, 64), dtype=np.uint8)
        min_pairs = np.empty((N_PAIRS, TILE), dtype=np.int32)
        dd = np.empty(TILE, dtype=np.float32)
        dm = np.empty(TILE, dtype=np.float32)
        acc = np.empty((CHUNK, TILE), dtype=np.float32)
        for t0 in range(0, n_rows, CHUNK):
            t1 = min(t0 + CHUNK, n_rows)
            acc[:] = 0.0
            for b in range(n_blocks):
                unpack_tile_vectors(weights, r0, b, tile, min_pairs)
                for i in range(TILE):
                    dd[i] = read_f16(weights[r0 + i], b * BLOCK_BYTES + _D)
                    dm[i] = read_f16(weights[r0 + i], b * BLOCK_BYTES + _DMIN)
                t = t0
                while t + ROWS <= t1:
                    tile_dots_4(tile, min_pairs, dd, dm, qs, d, pairs, acc, t, t - t0, b)
                    t += ROWS
                while t < t1:
                    tile_dots_1(tile, min_pairs, dd, dm, qs, d, pairs, acc, t, t - t0, b)
                    t += 1
            for t in range(t0, t1):
                for i in range(TILE):
                    out[t, r0 + i] = acc[t - t0, i]
