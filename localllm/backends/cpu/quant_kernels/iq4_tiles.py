"""IQ4_XS batched products with the weight rows as vector lanes (prefill): q4_k_tiles' scheme. (IQ4_NL,
a 32-element block type, has legacy_tiles' kernels.)

IQ4_XS stores 4-bit indices into the signed table KVALUES (-127..113). vpdpbusd multiplies unsigned
by signed bytes, so a tile of 16 weight rows is unpacked into the transposed scratch as the unsigned
bytes U = KVALUES[index] + 128 (1..241; row i's value at position p in tile[p // 4, 4 * i + p % 4], one
64-byte table look-up per row and 64 positions), and the offset comes back in integers per 32-element
group: <KVALUES, a> = <U, a> - 128 * (sum of a), exactly. On AVX2 targets (q4_k_tiles.narrow:
vpmaddubsw, whose pair sums 241 x 127 would saturate) the tile holds KVALUES itself, signed, and the
products take |value| and its sign per quad (VectorCode.dot_quads_signed), with no offset.

- IQ4_XS (q8_k activation; 8 groups of 32 per 256-element super-block, signed 6-bit scales): the
  int32 total sum_k scale_k * (<U, a_k> - 128 * asum32_k), the offsets through vpdpwssd on int16 pairs
  of scales and of the activation's 32-element sums, then iq4_xs.vec_dot's float step on 16 lanes,
  fma(ad * d, total, acc).

Each lane computes what vec_dot computes for its row, so every output equals the one-row kernel's bit
for bit.

Measured (2026-11-25, Zen 4, one thread, Gemma 3 270M's shapes at T = 256, best of 7 on a loaded
machine): IQ4_XS 1024 -> 640 / 2048 -> 640 in 0.64-0.76 / 1.48-1.61 ms (Q4_K's tiles 0.71 / 1.33),
dequantize + BLAS 2.3-6x slower.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ....jit import exact_kernel, read_f16
from ....quant import iq4_nl as nl_format
from ....quant import iq4_xs as xs_format
from .iq4_xs import emit_scales
from .q4_k_tiles import (
    CHUNK, ROWS, TILE, _dot_word_pairs_512, _transpose16, fma_into_row, group_sums, narrow,
    sub_block_sum_pairs,
)
from .vector import VectorCode

__all__ = ["MIN_ROWS", "NARROW_MIN_ROWS", "matvec_tiles_xs"]

# Fewer activation rows: vec_dot per (weight row, activation row) (these types have no row kernels).
# From two rows the tiles are ahead: 1.5x at T = 2, 3x at 4, 6-7x at 16 (one thread, 2048 x 640 IQ4_XS);
# a single row goes through the decode matvec.
MIN_ROWS = 2
NARROW_MIN_ROWS = 4  # on AVX2 (q4_k_tiles.NARROW_MIN_ROWS has the figures)
OFFSET = 128  # added to every table value so that it is an unsigned byte
# KVALUES + 128 as the int8 bit patterns of unsigned bytes 1..241 (what a byte look-up table holds)
UNSIGNED_TABLE = [int(value) for value in (nl_format.KVALUES.astype(np.int32) + OFFSET).astype(np.uint8).view(np.int8)]
SIGNED_TABLE = [int(value) for value in nl_format.KVALUES]
N_SUB = xs_format.N_SUB  # IQ4_XS: 32-element groups per super-block
# elements in order from join(low nibbles, high nibbles) of 32 packed bytes (two 16-byte runs, each a
# 32-element group whose elements 0..15 are the low nibbles and 16..31 the high ones)
_GROUP_ORDER = list(range(0, 16)) + list(range(32, 48)) + list(range(16, 32)) + list(range(48, 64))


def tile_values(v: VectorCode, packed):
    """32 packed index bytes (<32 x i8>: two 32-element groups) -> their 64 table values in element
    order (<64 x i8>), as the tile holds them: unsigned (KVALUES + 128), or on narrow targets the
    signed KVALUES (q4_k_tiles.narrow: 241 x 127 would saturate vpmaddubsw). One 512-bit vpshufb where
    the target has AVX-512 BW, else VectorCode's 32-lane look-up on each half."""
    table = SIGNED_TABLE if narrow(v) else UNSIGNED_TABLE
    indices = v.builder.shuffle_vector(v.and_(packed, 15), v.shr(packed, 4), v._lane_list(_GROUP_ORDER))
    return table_values(v, table, indices)


def table_values(v: VectorCode, table, indices):
    """<64 x i8> indices 0..15 -> table[indices] (16 int8 values): one 512-bit vpshufb where the target
    has AVX-512 BW, else VectorCode's 32-lane look-up on each half."""
    if v.avx512_bw:  # vpshufb looks up within each 128-bit lane: the table in all four
        return v._x86("llvm.x86.avx512.pshuf.b.512", [ir.Constant(indices.type, table * 4), indices], indices.type)
    return v.join(*[v.lookup16(table, v.shuffle(indices, range(32 * h, 32 * h + 32))) for h in range(2)])


def store_vector(v: VectorCode, array_type, array, index, vec):
    """array[index : index + lanes] = vec (no alignment assumed); index an int or an i64 value."""
    builder = v.builder
    i64 = ir.IntType(64)
    position = i64(index) if isinstance(index, int) else index
    pointer = builder.gep(v._data(array_type, array), [position])
    builder.store(vec, builder.bitcast(pointer, vec.type.as_pointer()), align=1)


def store_transposed(v: VectorCode, tile_type, tile, chunk, rows):
    """rows[i]: row i's 64 unsigned bytes of 64 consecutive positions (<64 x i8>) -> tile chunk
    `chunk` (an i64 value): tile[16 * chunk + m, 4 * i + j] = rows[i][4m + j]."""
    builder = v.builder
    i64 = ir.IntType(64)
    words = [v.bitcast(row, 16, 32) for row in rows]
    for m, vec in enumerate(_transpose16(v, words)):
        store_vector(v, tile_type, tile, builder.mul(builder.add(builder.mul(chunk, i64(16)), i64(m)), i64(64)), vec)


# ----- IQ4_XS -----


@intrinsic
def unpack_tile_xs(typingctx, weights, r0, b, tile, scales, scale_pairs):
    """Super-block b of weight rows r0..r0+15: tile uint8[64, 64] (transposed unsigned values),
    scales int32[8, 16] (sub-block k's scale of each row), scale_pairs int32[4, 16] (sub-blocks 2k
    and 2k+1 as the low and high int16 of one lane)."""
    sig = types.void(weights, r0, b, tile, scales, scale_pairs)

    def codegen(context, builder, signature, args):
        weights_, r0_, b_, tile_, scales_, pairs_ = args
        wt, _, _, tt, st, pt = signature.args
        v = VectorCode(context, builder)
        i64 = ir.IntType(64)
        r0_ = v.resize(r0_, 64)
        base = builder.mul(v.resize(b_, 64), i64(xs_format.BLOCK_BYTES))
        rows, codes = [], []  # rows[i][c]: row i's values at positions 64c..64c+63 (sub-blocks 2c, 2c+1)
        for i in range(TILE):
            row = v.row_pointer(wt, weights_, builder.add(r0_, i64(i)))
            rows.append([tile_values(v, v.load(None, row, v.offset(base, xs_format._QS + 32 * c), 32)) for c in range(4)])
            scales8 = v.widen(emit_scales(v, None, row, base), 32)
            codes.append(v.join(scales8, v.constant(0, N_SUB, 32)))  # 16 lanes for the transpose
        for c in range(4):
            store_transposed(v, tt, tile_, i64(c), [rows[i][c] for i in range(TILE)])
        by_sub = _transpose16(v, codes)  # by_sub[k] (k < 8): scale k of each row
        for k in range(N_SUB):
            store_vector(v, st, scales_, 16 * k, by_sub[k])
        for k in range(N_SUB // 2):
            store_vector(v, pt, pairs_, 16 * k, v.or_(v.and_(by_sub[2 * k], 0xFFFF), v.shl(by_sub[2 * k + 1], 16)))
        return context.get_dummy_value()

    return sig, codegen


def _tile_dots_xs(rows: int):
    @intrinsic
    def tile_dots(typingctx, tile, scales, scale_pairs, d, aqs, ad, pairs, acc, t, a, b):
        """For activation rows t..t+rows-1 and super-block b: acc[a + u] (16 floats: the tile's rows)
        takes the block's step, as iq4_xs.vec_dot does it for each row."""
        sig = types.void(tile, scales, scale_pairs, d, aqs, ad, pairs, acc, t, a, b)

        def codegen(context, builder, signature, args):
            tile_, scales_, spairs_, d_, aqs_, ad_, pairs_, acc_, t_, a_, b_ = args
            st = signature.args
            v = VectorCode(context, builder)
            i64 = ir.IntType(64)
            f32x16 = ir.VectorType(ir.FloatType(), 16)
            t_, a_, b_ = v.resize(t_, 64), v.resize(a_, 64), v.resize(b_, 64)
            signed = narrow(v)  # the tile holds KVALUES itself (tile_values), no offset to take back
            # sum_k scale_k <U, a_k> (or <KVALUES, a_k>)
            scaled = group_sums(v, st[0], tile_, st[1], scales_, st[4], aqs_, t_, b_, rows, 8, signed)
            d_vec = v.load(st[3], d_, i64(0), 16)
            scale_pairs = [v.load(st[2], spairs_, i64(16 * k), 16) for k in range(N_SUB // 2)]
            for u in range(rows):
                row = builder.add(t_, i64(u))
                total = scaled[u] if signed else builder.sub(scaled[u], v.shl(_offsets(v, st[6], pairs_, row, b_, scale_pairs), 7))
                a_scale = v.splat(builder.load(builder.gep(v.row_pointer(st[5], ad_, row), [b_])), 16)
                # vec_dot's float step, lane by lane: the product ad * d rounded, then one fma
                step_scale = builder.fmul(a_scale, d_vec, flags=("arcp",))
                fma_into_row(v, st[7], acc_, builder.add(a_, i64(u)), step_scale, builder.sitofp(total, f32x16))
            return context.get_dummy_value()

        return sig, codegen

    return tile_dots


def _offsets(v: VectorCode, pairs_type, pairs, row, b, scale_pairs):
    """<16 x i32>: sum_k scale_k * asum32_k for activation row `row` and super-block b (vpdpwssd on the
    rows' scale pairs and the activation's pairs of 32-element sums)."""
    builder = v.builder
    i64 = ir.IntType(64)
    pair_row = v.row_pointer(pairs_type, pairs, row)
    offsets = None
    for k in range(N_SUB // 2):
        sums = builder.load(builder.gep(pair_row, [builder.add(builder.mul(b, i64(4)), i64(k))]))
        offsets = _dot_word_pairs_512(v, offsets, scale_pairs[k], v.splat(sums, 16))
    return offsets


tile_dots_xs_4 = _tile_dots_xs(ROWS)
tile_dots_xs_1 = _tile_dots_xs(1)


@exact_kernel(parallel=True)
def matvec_tiles_xs(weights, out, qs, d, s):
    """q4_k_tiles.matvec_tiles for IQ4_XS: out[t, r] for the first N - N % 16 weight rows, each equal to
    iq4_xs.vec_dot(weights[r], qs[t], d[t], s[t]); the caller computes the rest."""
    n_rows = qs.shape[0]
    n_blocks = d.shape[1]
    pairs = np.empty((n_rows, n_blocks * 4), dtype=np.int32)
    sub_block_sum_pairs(s, pairs)
    for tile_index in prange(weights.shape[0] // TILE):
        r0 = tile_index * TILE
        tile = np.empty((64, 64), dtype=np.uint8)
        scales = np.empty((N_SUB, TILE), dtype=np.int32)
        scale_pairs = np.empty((N_SUB // 2, TILE), dtype=np.int32)
        dd = np.empty(TILE, dtype=np.float32)
        acc = np.empty((CHUNK, TILE), dtype=np.float32)
        for t0 in range(0, n_rows, CHUNK):
            t1 = min(t0 + CHUNK, n_rows)
            acc[:] = 0.0
            for b in range(n_blocks):
                unpack_tile_xs(weights, r0, b, tile, scales, scale_pairs)
                for i in range(TILE):
                    dd[i] = read_f16(weights[r0 + i], b * xs_format.BLOCK_BYTES + xs_format._D)
                t = t0
                while t + ROWS <= t1:
                    tile_dots_xs_4(tile, scales, scale_pairs, dd, qs, d, pairs, acc, t, t - t0, b)
                    t += ROWS
                while t < t1:
                    tile_dots_xs_1(tile, scales, scale_pairs, dd, qs, d, pairs, acc, t, t - t0, b)
                    t += 1
            for t in range(t0, t1):
                for i in range(TILE):
                    out[t, r0 + i] = acc[t - t0, i]
