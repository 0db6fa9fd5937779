"""IQ4_XS weights re-laid 16 rows at a time, for products with the weight rows as vector lanes at any
number of activation rows (decode included): q2_k_x16's layout, iq4_tiles' arithmetic.

IQ4_XS's one-row kernel looks its indices up and sums each 256-element block horizontally before a scalar
float step; on two threads it read 21.8 GB/s where the K-quants' kernels reach the memory's speed
(docs/performance.md, thirty-fourth session). Here, done once when a weight is first multiplied
(matmul.PackedWeights), each tile of 16 rows and super-block b becomes one record of 2176 bytes, the same
bytes as the rows' blocks, word w of row i (block bytes 4w..4w+3) at bytes 64w + 4i: word 0 d and scales_h,
word 1 scales_l, words 2..33 the indices. Index word 2 + 4k + s (sub-block k, s < 4) holds, in its low
nibbles, elements 32k + 4s..+3 of each row, in its high nibbles elements 32k + 16 + 4s..+3: one 512-bit
vpshufb each gives the rows' table values as iq4_tiles' tile holds them (KVALUES + 128, or KVALUES signed on
AVX2), multiplied by the activation's broadcast quads (vpdpbusd), eight quads to a sub-block, each
sub-block's sums times the rows' scales; the offset of the unsigned values comes back as 128 * sum_k
scale_k * asum32_k (vpdpwssd), and the float step is iq4_xs.vec_dot's, fma(ad * d, total, acc), on 16
lanes. Every output equals iq4_xs.vec_dot's bit for bit. Two or more activation rows unpack each record
once into iq4_tiles' scratch (no transpose) for its tile_dots. Decode asks for nothing ahead (Q3_K's
prefetch four records ahead: 8B shapes, one / two threads from memory, 23.0-23.5 / 32.3-32.6 GB/s
against 23.5-23.7 / 33.8-36.0 without).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ....jit import exact_kernel
from ....quant.iq4_xs import BLOCK_BYTES, N_SUB
from . import iq4_tiles
from .iq4_tiles import SIGNED_TABLE, UNSIGNED_TABLE, _offsets, table_values, tile_dots_xs_1, tile_dots_xs_4
from .q2_k_tiles import store_vector
from .q3_k_x16 import record_pointer
from .q4_k_tiles import CHUNK, ROWS, TILE, _dot_quads_512, activation_quads, fma_into_row, narrow, sub_block_sum_pairs
from .vector import VectorCode

WORDS = BLOCK_BYTES // 4  # 34
RECORD_BYTES = TILE * BLOCK_BYTES  # 2176
_D_WORD, _SCALES_L_WORD, _INDEX_WORDS = 0, 1, 2
UNPACK_ROWS = iq4_tiles.MIN_ROWS  # from two activation rows the records go through the tiles' scratch
__all__ = ["CHUNK", "ROWS", "UNPACK_ROWS", "matvec_packed", "pack"]


@exact_kernel(parallel=True)
def interleave(weights, packed):
    """weights uint32[N, nb * 34] (IQ4_XS rows as words) -> packed uint32[N // 16 * nb, 544]: record
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
    """uint8[N, nb * 136] IQ4_XS rows -> the records of their first N - N % 16 rows (interleave), as bytes."""
    n_tiles = weights.shape[0] // TILE
    n_blocks = weights.shape[1] // BLOCK_BYTES
    packed = np.empty((n_tiles * n_blocks, WORDS * TILE), dtype=np.uint32)
    interleave(np.ascontiguousarray(weights[: n_tiles * TILE]).view(np.uint32), packed)
    return packed.view(np.uint8)


def _word(v: VectorCode, record, w: int):
    return v.load(None, record, ir.IntType(64)(64 * w), 64)


def _record_codes(v: VectorCode, record):
    """The rows' signed scales [sub-block k's as <16 x i32>, k < 8], their pairs (sub-blocks 2k, 2k + 1
    as the low and high int16 of one lane) and d as <16 x float>."""
    builder = v.builder
    first = v.bitcast(_word(v, record, _D_WORD), TILE, 32)  # d | scales_h << 16
    low = v.bitcast(_word(v, record, _SCALES_L_WORD), TILE, 32)
    high = v.shr(first, 16)
    scales = []
    for k in range(N_SUB):
        code = v.or_(v.and_(v.shr(low, 4 * k), 15), v.shl(v.and_(v.shr(high, 2 * k), 3), 4))
        scales.append(builder.sub(code, v.constant(32, TILE, 32)))
    pairs = [v.or_(v.and_(scales[2 * k], 0xFFFF), v.shl(scales[2 * k + 1], 16)) for k in range(N_SUB // 2)]
    halves = builder.bitcast(first, ir.VectorType(ir.HalfType(), 2 * TILE))
    d = builder.fpext(v.shuffle(halves, range(0, 2 * TILE, 2)), ir.VectorType(ir.FloatType(), TILE))
    return scales, pairs, d


def _values(v: VectorCode, indices):
    """<64 x i8> indices 0..15 -> their table values as iq4_tiles' tile holds them (tile_values)."""
    return table_values(v, SIGNED_TABLE if narrow(v) else UNSIGNED_TABLE, indices)


def _index_values(v: VectorCode, record, k: int, s: int):
    """(low, high): the rows' values at elements 32k + 4s..+3 and 32k + 16 + 4s..+3 (<64 x i8> each)."""
    word = _word(v, record, _INDEX_WORDS + 4 * k + s)
    return _values(v, v.and_(word, 15)), _values(v, v.and_(v.shr(word, 4), 15))


@intrinsic
def record_dots_1(typingctx, packed, n_blocks, tile, b, aqs, ad, pairs, acc, t, a):
    """acc[a] (16 floats, the tile's rows) takes super-block b's step for activation row t, as
    iq4_xs.vec_dot takes it for each row, straight from the record."""
    sig = types.void(packed, n_blocks, tile, b, aqs, ad, pairs, acc, t, a)

    def codegen(context, builder, signature, args):
        packed_, n_blocks_, tile_, b_, aqs_, ad_, pairs_, acc_, t_, a_ = args
        st = signature.args
        v = VectorCode(context, builder)
        t_, a_, b_ = v.resize(t_, 64), v.resize(a_, 64), v.resize(b_, 64)
        record = record_pointer(v, st[0], packed_, n_blocks_, tile_, b_)
        signed = narrow(v)  # the values are KVALUES themselves: no offset to take back
        scales, scale_pairs, d_vec = _record_codes(v, record)
        act_quad = activation_quads(v, st[4], aqs_, t_, b_, 1)
        scaled = None
        for k in range(N_SUB):
            sums = None
            for s in range(4):
                low, high = _index_values(v, record, k, s)
                sums = _dot_quads_512(v, sums, low, act_quad(0, 32 * k + 4 * s), signed)
                sums = _dot_quads_512(v, sums, high, act_quad(0, 32 * k + 16 + 4 * s), signed)
            scaled = v.add(scaled, builder.mul(sums, scales[k]))
        total = scaled if signed else builder.sub(scaled, v.shl(_offsets(v, st[6], pairs_, t_, b_, scale_pairs), 7))
        a_scale = v.splat(builder.load(builder.gep(v.row_pointer(st[5], ad_, t_), [b_])), TILE)
        # vec_dot's float step, lane by lane: the product ad * d rounded, then one fma
        step_scale = builder.fmul(a_scale, d_vec, flags=("arcp",))
        fma_into_row(v, st[7], acc_, a_, step_scale, builder.sitofp(total, ir.VectorType(ir.FloatType(), TILE)))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def unpack_record(typingctx, packed, n_blocks, tile, b, values, scales, scale_pairs, d):
    """Record (tile, b) into iq4_tiles' scratch for its tile_dots: values uint8[64, 64] (row i's value
    at position p in values[p // 4, 4 * i + p % 4]), scales int32[8, 16], scale_pairs int32[4, 16], d
    float32[16]."""
    sig = types.void(packed, n_blocks, tile, b, values, scales, scale_pairs, d)

    def codegen(context, builder, signature, args):
        packed_, n_blocks_, tile_, b_, values_, scales_, pairs_, d_ = args
        st = signature.args
        v = VectorCode(context, builder)
        record = record_pointer(v, st[0], packed_, n_blocks_, tile_, b_)

        for k in range(N_SUB):
            for s in range(4):
                low, high = _index_values(v, record, k, s)
                store_vector(v, st[4], values_, 64 * (8 * k + s), low)  # positions 32k + 4s..: quad 8k + s
                store_vector(v, st[4], values_, 64 * (8 * k + 4 + s), high)  # 32k + 16 + 4s..
        scale_vectors, scale_pairs, d_vec = _record_codes(v, record)
        for k in range(N_SUB):
            store_vector(v, st[5], scales_, TILE * k, scale_vectors[k])
        for k in range(N_SUB // 2):
            store_vector(v, st[6], pairs_, TILE * k, scale_pairs[k])
        store_vector(v, st[7], d_, 0, d_vec)
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel(parallel=True)
def matvec_packed(packed, n_blocks, n_parts, out, qs, d, s):
    """out[t, r] for r < 16 * n_tiles (the packed rows), every value equal to iq4_xs.vec_dot(row r, qs[t],
    d[t], s[t]): the tiles split in n_parts contiguous runs (q4_k_x16.matvec_packed's loop), one
    activation row straight from the records, more through iq4_tiles' scratch."""
    n_rows = qs.shape[0]
    n_tiles = packed.shape[0] // n_blocks
    pairs = np.empty((n_rows, n_blocks * 4), dtype=np.int32)
    sub_block_sum_pairs(s, pairs)
    n_parts = max(1, min(n_parts, n_tiles))
    for part in prange(n_parts):
        acc = np.empty((min(CHUNK, n_rows), TILE), dtype=np.float32)
        values = np.empty((64, 64), dtype=np.uint8)
        scales = np.empty((N_SUB, TILE), dtype=np.int32)
        scale_pairs = np.empty((N_SUB // 2, TILE), dtype=np.int32)
        dd = np.empty(TILE, dtype=np.float32)
        for tile in range(part * n_tiles // n_parts, (part + 1) * n_tiles // n_parts):
            for t0 in range(0, n_rows, CHUNK):
                t1 = min(t0 + CHUNK, n_rows)
                acc[: t1 - t0] = 0.0
                for b in range(n_blocks):
                    if n_rows >= UNPACK_ROWS:
                        unpack_record(packed, n_blocks, tile, b, values, scales, scale_pairs, dd)
                        t = t0
                        while t + ROWS <= t1:
                            tile_dots_xs_4(values, scales, scale_pairs, dd, qs, d, pairs, acc, t, t - t0, b)
                            t += ROWS
                        while t < t1:
                            tile_dots_xs_1(values, scales, scale_pairs, dd, qs, d, pairs, acc, t, t - t0, b)
                            t += 1
                    elif n_rows == 1:  # decode: no loop over rows (q4_k_x16.matvec_packed says why)
                        record_dots_1(packed, n_blocks, tile, b, qs, d, pairs, acc, 0, 0)
                    else:
                        for t in range(t0, t1):
                            record_dots_1(packed, n_blocks, tile, b, qs, d, pairs, acc, t, t - t0)
                for t in range(t0, t1):
                    for i in range(TILE):
                        out[t, tile * TILE + i] = acc[t - t0, i]
