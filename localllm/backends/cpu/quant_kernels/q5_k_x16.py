"""Q5_K weights re-laid 16 rows at a time, for products with the weight rows as vector lanes at any
number of activation rows (decode included): q4_k_x16 with a fifth bit.

Q5_K's block is Q4_K's (d and dmin, the 12 scale bytes: word 0, words 1..3) with 32 bytes of fifth bits
(qh, words 4..11) before the nibbles (words 12..43). The records are q4_k_x16's transpose of the block's
words (2816 bytes: word w of row i at 64w + 4i), so one 64-byte load holds a word of 16 rows. Quant word
12 + 8c + q (c < 4, q < 8) holds elements 64c + 4q..+3 of each row in its low nibbles and 64c + 32 + 4q..+3
in its high ones; their fifth bits are bits 2c and 2c + 1 of qh word 4 + q. The values (0..31) go to
vpdpbusd against the broadcast activation quads, and the scales, mins and float step are q4_k_x16's
(Q5_K's vec_dot is Q4_K's accumulate): every output equals q5_k.vec_dot's bit for bit, at every number
of activation rows. From UNPACK_ROWS activation rows each record is unpacked once into q4_k_tiles'
scratch (no transpose) for its tile_dots, as q5_k_tiles' transposed tiles are. Used on AVX-512 VNNI
targets only (its PackedKernel's narrow is False: the kernel record says why).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ....jit import exact_kernel
from ....quant.q5_k import BLOCK_BYTES
from .q2_k_tiles import store_vector
from .q3_k_x16 import record_pointer
from .q4_k_tiles import CHUNK, ROWS, TILE, _dot_quads_512, activation_quads, float_steps, sub_block_sum_pairs
from .q4_k_tiles import tile_dots_1, tile_dots_4
from .q4_k_x16 import unpacked_codes
from .vector import VectorCode

WORDS = BLOCK_BYTES // 4  # 44
RECORD_BYTES = TILE * BLOCK_BYTES  # 2816
_HIGH_WORDS, _QUANT_WORDS = 4, 12
# From this many activation rows the records go through q4_k_tiles' scratch (fewer: straight from the
# records, ROWS at a time). 14336 x 4096, one Zen 4 thread, against the row kernels on the file's rows
# (kquant_rows): within the run-to-run noise (+-20%) at T = 2..7, ahead from T = 8 (T = 16: 110 against 86
# GMAC/s; 128: 160 against the tiles' 139).
UNPACK_ROWS = 6
__all__ = ["CHUNK", "ROWS", "UNPACK_ROWS", "matvec_packed", "pack"]


@exact_kernel(parallel=True)
def interleave(weights, packed):
    """weights uint32[N, nb * 44] (Q5_K rows as words) -> packed uint32[N // 16 * nb, 704]: record
    tile * nb + b holds, at word 16 * w + i, word w of row 16 * tile + i's super-block b."""
    n_blocks = weights.shape[1] // WORDS
    for tile in prange(packed.shape[0] // max(n_blocks, 1)):
        for b in range(n_blocks):
            record = packed[tile * n_blocks + b]
            for i in range(TILE):
                row = weights[tile * TILE + i]
                for w in range(WORDS):
                    record[TILE * w + i] = row[b * WORDS + w]


def pack(weights: np.ndarray) -> np.ndarray:
    """uint8[N, nb * 176] Q5_K rows -> the records of their first N - N % 16 rows (interleave), as words."""
    n_tiles = weights.shape[0] // TILE
    n_blocks = weights.shape[1] // BLOCK_BYTES
    packed = np.empty((n_tiles * n_blocks, WORDS * TILE), dtype=np.uint32)
    interleave(np.ascontiguousarray(weights[: n_tiles * TILE]).view(np.uint32), packed)
    return packed


def _fifth_bit(v: VectorCode, high_word, bit: int):
    """Bit `bit` of each byte of a qh word vector, moved to bit 4 (16 or 0)."""
    moved = v.shl(high_word, 4 - bit) if bit <= 4 else v.shr(high_word, bit - 4)
    return v.and_(moved, 0x10)


def _chunk_values(v: VectorCode, record, c: int, q: int):
    """(low, high): the rows' 5-bit values at elements 64c + 4q..+3 and 64c + 32 + 4q..+3 (<64 x i8>)."""
    i64 = ir.IntType(64)
    quads = v.bitcast(v.load(None, record, i64(TILE * (_QUANT_WORDS + 8 * c + q)), TILE), 64, 8)
    high_bits = v.bitcast(v.load(None, record, i64(TILE * (_HIGH_WORDS + q)), TILE), 64, 8)
    low = v.or_(v.and_(quads, 0x0F), _fifth_bit(v, high_bits, 2 * c))
    high = v.or_(v.and_(v.shr(quads, 4), 0x0F), _fifth_bit(v, high_bits, 2 * c + 1))
    return low, high


def _d_dmin(v: VectorCode, record):
    builder = v.builder
    f32x16 = ir.VectorType(ir.FloatType(), TILE)
    halves = builder.bitcast(v.load(None, record, ir.IntType(64)(0), TILE), ir.VectorType(ir.HalfType(), 2 * TILE))
    return builder.fpext(v.shuffle(halves, range(0, 2 * TILE, 2)), f32x16), builder.fpext(v.shuffle(halves, range(1, 2 * TILE, 2)), f32x16)


def _record_dots(rows: int):
    @intrinsic
    def record_dots(typingctx, packed, n_blocks, tile, b, aqs, ad, pairs, acc, t, a):
        """For activation rows t..t+rows-1 and super-block b of the tile: acc[a + u] (16 floats, the
        tile's rows) takes the block's step, as q5_k.vec_dot takes it for each row."""
        sig = types.void(packed, n_blocks, tile, b, aqs, ad, pairs, acc, t, a)

        def codegen(context, builder, signature, args):
            packed_, n_blocks_, tile_, b_, aqs_, ad_, pairs_, acc_, t_, a_ = args
            st = signature.args
            v = VectorCode(context, builder)
            t_, a_, b_ = v.resize(t_, 64), v.resize(a_, 64), v.resize(b_, 64)
            record = record_pointer(v, st[0], packed_, n_blocks_, tile_, b_)
            scales, min_pairs = unpacked_codes(v, record)
            act_quad = activation_quads(v, st[4], aqs_, t_, b_, rows)
            scaled = [None] * rows
            for c in range(4):  # sub-blocks 2c (low nibbles) and 2c + 1 (high)
                low_sums, high_sums = [None] * rows, [None] * rows
                for q in range(8):
                    low, high = _chunk_values(v, record, c, q)
                    for u in range(rows):
                        low_sums[u] = _dot_quads_512(v, low_sums[u], low, act_quad(u, 64 * c + 4 * q))
                        high_sums[u] = _dot_quads_512(v, high_sums[u], high, act_quad(u, 64 * c + 32 + 4 * q))
                for u in range(rows):
                    part = builder.add(builder.mul(low_sums[u], scales[2 * c]), builder.mul(high_sums[u], scales[2 * c + 1]))
                    scaled[u] = v.add(scaled[u], part)
            d_vec, dmin_vec = _d_dmin(v, record)
            float_steps(v, scaled, d_vec, dmin_vec, min_pairs, (st[6], pairs_), (st[5], ad_), (st[7], acc_), t_, a_, b_)
            return context.get_dummy_value()

        return sig, codegen

    return record_dots


@intrinsic
def unpack_record(typingctx, packed, n_blocks, tile, b, quants, scales, mins, d, dmin):
    """Record (tile, b) into q4_k_tiles' scratch for its tile_dots: quants uint8[64, 64] (row i's value
    at position p in quants[p // 4, 4 * i + p % 4]), scales int32[8, 16], mins int32[4, 16] (sub-blocks
    2k and 2k + 1 as int16 halves), d and dmin float32[16]."""
    sig = types.void(packed, n_blocks, tile, b, quants, scales, mins, d, dmin)

    def codegen(context, builder, signature, args):
        packed_, n_blocks_, tile_, b_, quants_, scales_, mins_, d_, dmin_ = args
        st = signature.args
        v = VectorCode(context, builder)
        record = record_pointer(v, st[0], packed_, n_blocks_, tile_, b_)

        for c in range(4):
            for q in range(8):
                low, high = _chunk_values(v, record, c, q)
                store_vector(v, st[4], quants_, 64 * (16 * c + q), low)  # sub-block 2c: positions 64c + 4q..
                store_vector(v, st[4], quants_, 64 * (16 * c + 8 + q), high)  # 2c + 1: 64c + 32 + 4q..
        scale_vectors, min_pairs = unpacked_codes(v, record)
        for k in range(8):
            store_vector(v, st[5], scales_, TILE * k, scale_vectors[k])
        for k in range(4):
            store_vector(v, st[6], mins_, TILE * k, min_pairs[k])
        d_vec, dmin_vec = _d_dmin(v, record)
        store_vector(v, st[7], d_, 0, d_vec)
        store_vector(v, st[8], dmin_, 0, dmin_vec)
        return context.get_dummy_value()

    return sig, codegen


record_dots_4 = _record_dots(ROWS)
record_dots_1 = _record_dots(1)


@exact_kernel(parallel=True)
def matvec_packed(packed, n_blocks, n_parts, out, qs, d, s):
    """out[t, r] for r < 16 * n_tiles (the packed rows), every value equal to q5_k.vec_dot(row r, qs[t],
    d[t], s[t]): q4_k_x16.matvec_packed's loop for Q5_K's records."""
    n_rows = qs.shape[0]
    n_tiles = packed.shape[0] // n_blocks
    pairs = np.empty((n_rows, n_blocks * 4), dtype=np.int32)
    sub_block_sum_pairs(s, pairs)
    n_parts = max(1, min(n_parts, n_tiles))
    for part in prange(n_parts):
        acc = np.empty((min(CHUNK, n_rows), TILE), dtype=np.float32)
        quants = np.empty((64, 64), dtype=np.uint8)
        scales = np.empty((8, TILE), dtype=np.int32)
        mins = np.empty((4, TILE), dtype=np.int32)
        dd = np.empty(TILE, dtype=np.float32)
        dm = np.empty(TILE, dtype=np.float32)
        for tile in range(part * n_tiles // n_parts, (part + 1) * n_tiles // n_parts):
            for t0 in range(0, n_rows, CHUNK):
                t1 = min(t0 + CHUNK, n_rows)
                acc[: t1 - t0] = 0.0
                for b in range(n_blocks):
                    if n_rows >= UNPACK_ROWS:
                        unpack_record(packed, n_blocks, tile, b, quants, scales, mins, dd, dm)
                        t = t0
                        while t + ROWS <= t1:
                            tile_dots_4(quants, scales, mins, dd, dm, qs, d, pairs, acc, t, t - t0, b)
                            t += ROWS
                        while t < t1:
                            tile_dots_1(quants, scales, mins, dd, dm, qs, d, pairs, acc, t, t - t0, b)
                            t += 1
                    elif n_rows == 1:  # decode: no loop over rows (q4_k_x16.matvec_packed says why)
                        record_dots_1(packed, n_blocks, tile, b, qs, d, pairs, acc, 0, 0)
                    else:
                        t = t0
                        while t + ROWS <= t1:
                            record_dots_4(packed, n_blocks, tile, b, qs, d, pairs, acc, t, t - t0)
                            t += ROWS
                        while t < t1:
                            record_dots_1(packed, n_blocks, tile, b, qs, d, pairs, acc, t, t - t0)
                            t += 1
                for t in range(t0, t1):
                    for i in range(TILE):
                        out[t, tile * TILE + i] = acc[t - t0, i]
