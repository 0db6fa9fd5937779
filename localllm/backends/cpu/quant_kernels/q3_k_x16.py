"""Q3_K weights re-laid 16 rows at a time, for products with the weight rows as vector lanes at any
number of activation rows (decode included), on AVX-512 VNNI and AVX2 targets (q4_k_x16's scheme for
Q3_K).

Q3_K's one-row kernel ends every 256-element block in horizontal sums and a scalar float step, and
unpacks each row's 6-bit scales on its own; q3_k_tiles does both on 16 lanes but transposes 16 rows per
product, which pays back only over several activation rows. Here the transpose is done once, when a
weight is first multiplied (matmul.PackedWeights), into records of 1760 bytes, one per tile of 16 rows
and super-block b, the same bytes as the rows' blocks:
  bytes 0..31                 the 16 rows' float16 d (row i at 2i)
  bytes 32 + 64w + 4i + k     byte 4w + k of row i's 110-byte block (word w < 27: the hmask words
                              0..7, the quant words 8..23, the scale words 24..26)
so one 64-byte load holds a word of each of 16 rows. Quant word 8 + s (s < 16; half h = s // 8, bytes
l = 4(s % 8)..+3 of the half) holds, in its bits 2j, 2j + 1, elements 128h + 32j + l of each row: a quad
of neighbours, whose third bits are bit 4h + j of hmask word s % 8. u = q + 4 = low | high << 2 is
multiplied by the activation's quad (broadcast) with vpdpbusd (two vpmaddubsw halves on AVX2), four quads
to a 16-element group, each group's sums times the rows' scales; the offset of u comes back as 4 *
sum_g scale_g * asum_g (vpdpwssd), and the float step is q3_k.vec_dot's, fma(ad * d, total, acc), on 16
lanes (q3_k_tiles'). Every output equals q3_k.vec_dot's bit for bit, at every number of activation rows.
From UNPACK_ROWS activation rows (NARROW_UNPACK_ROWS on AVX2) each record is unpacked once into
q3_k_tiles' scratch (no transpose: the record's lanes are already the rows) for its tile_dots. Decode
asks for the records PREFETCH_RECORDS ahead.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ....jit import exact_kernel
from ....quant.q3_k import BLOCK_BYTES, N_GROUPS
from .q2_k_tiles import N_PAIRS, store_vector
from .q4_k_tiles import CHUNK, ROWS, TILE, _dot_quads_512, _dot_word_pairs_512, narrow
from .q3_k_tiles import tile_dots_1, tile_dots_4
from .q6_k_tiles import group_sum_pairs
from .vector import VectorCode

WORDS = 27  # whole words of a 110-byte block (bytes 0..107); the float16 d (bytes 108, 109) leads the record
RECORD_BYTES = TILE * BLOCK_BYTES  # 1760
WORDS_AT = 2 * TILE  # the record's first word
_HMASK_WORDS, _QUANT_WORDS, _SCALE_WORDS = 0, 8, 24
# From this many activation rows each record goes through q3_k_tiles' scratch (once for all the rows),
# fewer go straight from the record one row at a time. 14336 x 4096, one Zen 4 thread, GMAC/s, from the
# record / through the scratch: T = 2: 64.8 / 54.4, 3: 75.9 / 65.3, 4: 69.9 (four rows a pass) / 83.5, 7:
# 63.1 / 89.9; compiled for Haswell (NARROW_UNPACK_ROWS) T = 2: 29.7 / 41.4, 3: 35.6 / 49.6.
UNPACK_ROWS = 4
NARROW_UNPACK_ROWS = 2
# Records read ahead by software prefetch. Without it a record's arithmetic and its wait for memory did
# not overlap (one thread, 14336 x 4096 from memory: 12 GB/s against 22 in cache); 8B shapes, one / two
# Zen 4 threads, GB/s from memory, a session script: 0 records 12.1 / 21.1, 2: 14.5 / -, 3: - / 29.0-31.4,
# 4: 22.1 / 23.4-30, 5: - / 28.0-32.9, 8: 18.6 / 29.8-30.9; the row kernel 11.7 / 22.3-23.9.
PREFETCH_RECORDS = 4


@exact_kernel(parallel=True)
def interleave(weights, packed):
    """weights uint8[N, nb * 110] -> packed uint8[N // 16 * nb, 1760]: record tile * nb + b as above."""
    n_blocks = weights.shape[1] // BLOCK_BYTES
    for tile in prange(packed.shape[0] // max(n_blocks, 1)):
        for b in range(n_blocks):
            record = packed[tile * n_blocks + b]
            for i in range(TILE):
                row = weights[tile * TILE + i]
                at = b * BLOCK_BYTES
                record[2 * i] = row[at + 108]
                record[2 * i + 1] = row[at + 109]
                for w in range(WORDS):
                    for k in range(4):
                        record[WORDS_AT + 64 * w + 4 * i + k] = row[at + 4 * w + k]


def pack(weights: np.ndarray) -> np.ndarray:
    """uint8[N, nb * 110] Q3_K rows -> the records of their first N - N % 16 rows (interleave)."""
    n_tiles = weights.shape[0] // TILE
    n_blocks = weights.shape[1] // BLOCK_BYTES
    packed = np.empty((n_tiles * n_blocks, RECORD_BYTES), dtype=np.uint8)
    interleave(np.ascontiguousarray(weights[: n_tiles * TILE]), packed)
    return packed


def word_vector(v: VectorCode, record, at: int, half: int | None = None):
    """The 16 rows' words at byte `at` of a record (row i's four bytes at at + 4i): <64 x i8>; or, for
    half 0 or 1, the rows 8 * half .. 8 * half + 7 only (<32 x i8>)."""
    if half is None:
        return v.load(None, record, ir.IntType(64)(at), 64)
    return v.load(None, record, ir.IntType(64)(at + 32 * half), 32)


def _word(v: VectorCode, record, w: int, half: int | None = None):
    """Word w of the 16 rows' blocks (word_vector)."""
    return word_vector(v, record, WORDS_AT + 64 * w, half)


def _quad_bytes(v: VectorCode, quant_word, hmask_word, h: int, j: int):
    """u = q + 4 of the rows' quad in bits 2j, 2j + 1 of a quant word of half h (its third bit: bit
    4h + j of the matching hmask word, moved to bit 2)."""
    low = v.and_(v.shr(quant_word, 2 * j), 3)
    bit = 4 * h + j
    moved = v.shl(hmask_word, 2 - bit) if bit <= 2 else v.shr(hmask_word, bit - 2)
    return v.or_(low, v.and_(moved, 4))


def _record_quads(v: VectorCode, record):
    """quads(q): u = q + 4 of the 16 rows at the block's elements 4q..4q+3 (q < 64), <64 x i8>."""

    def quads(q: int):
        h, j, s8 = q // 32, (q // 8) % 4, q % 8  # elements 128h + 32j + 4 * s8 ..
        return _quad_bytes(v, _word(v, record, _QUANT_WORDS + 8 * h + s8), _word(v, record, _HMASK_WORDS + s8), h, j)

    return quads


def activation_quad(v: VectorCode, aqs, t, b, half: int | None):
    """act_quad(position): the four bytes of activation row t (aqs: (type, int8[T, K] value)) at
    `position` of super-block b, broadcast to 16 lanes (<64 x i8>), or 8 for a half (<32 x i8>)."""
    builder = v.builder
    i32, i64 = ir.IntType(32), ir.IntType(64)
    # the block's first byte, then constant offsets from it (an offset added to the block's start
    # instead became one induction variable per position, spilled: q4_k_tiles.activation_quads)
    act_block = builder.gep(v.row_pointer(aqs[0], aqs[1], t), [builder.mul(b, i64(256))])
    lanes = TILE if half is None else TILE // 2

    def act_quad(position):
        pointer = builder.gep(act_block, [i64(position)])
        word = builder.load(builder.bitcast(pointer, i32.as_pointer()), align=1)
        return v.bitcast(v.splat(word, lanes), 4 * lanes, 8)

    return act_quad


def scaled_sums(v: VectorCode, word_quads, scales, aqs, t, b, half: int | None):
    """<16 x i32> (or <8 x i32> for a half): lane i = sum_g scale_g * sum_{p in group g} u_p * a_p for
    row i of the tile and activation row t, where word_quads(h, s8) loads what quant word 8h + s8 needs
    and returns quad(j): the rows' bytes at elements 128h + 32j + 4 * s8..+3 (group 8h + 2j + s8 // 4).
    Word by word: each quant word is loaded once and gives four quads (j = 0..3), one of each of four
    groups, whose sums are kept side by side (group by group, which reloads each word for four groups:
    17.9 against 22.6 GB/s in cache, one Zen 4 thread; 13.1 against 14.7 compiled for Haswell)."""
    builder = v.builder
    act_quad = activation_quad(v, aqs, t, b, half)
    scaled = None
    for h in range(2):
        for first in (0, 4):  # quant words 8h + first .. + 3: groups 8h + 2j + first // 4
            sums = [None] * 4
            for s8 in range(first, first + 4):
                quad = word_quads(h, s8)
                for j in range(4):
                    u_bytes = quad(j)
                    act = act_quad(128 * h + 32 * j + 4 * s8)
                    sums[j] = _dot_quads_512(v, sums[j], u_bytes, act) if half is None else v.dot_quads(u_bytes, act, sums[j])
            for j in range(4):
                scaled = v.add(scaled, builder.mul(sums[j], scales[8 * h + 2 * j + first // 4]))
    return scaled


def _word_quads(v: VectorCode, record, half: int | None):
    """scaled_sums' word_quads for Q3_K: the quant word and its hmask word, u = q + 4 (_quad_bytes)."""

    def word_quads(h: int, s8: int):
        quant_word = _word(v, record, _QUANT_WORDS + 8 * h + s8, half)
        hmask_word = _word(v, record, _HMASK_WORDS + s8, half)
        return lambda j: _quad_bytes(v, quant_word, hmask_word, h, j)

    return word_quads


def _record_scales(v: VectorCode, record, half: int | None = None):
    """The rows' signed scales: [group g's as <16 x i32> (<8 x i32> for a half), g < 16] from the three
    scale words (each row's 12 bytes as q3_k.emit_scales reads them), and the pairs of groups 2k,
    2k + 1 as int16 halves of one lane."""
    lanes = TILE if half is None else TILE // 2
    words = [v.bitcast(_word(v, record, _SCALE_WORDS + w, half), lanes, 32) for w in range(3)]
    scales = []
    for g in range(N_GROUPS):
        low = v.and_(v.shr(words[(g % 8) // 4], 8 * (g % 4) + 4 * (g // 8)), 15)
        high = v.and_(v.shr(words[2], 8 * (g % 4) + 2 * (g // 4)), 3)
        scales.append(v.builder.sub(v.or_(low, v.shl(high, 4)), v.constant(32, lanes, 32)))
    pairs = [v.or_(v.and_(scales[2 * k], 0xFFFF), v.shl(scales[2 * k + 1], 16)) for k in range(N_PAIRS)]
    return scales, pairs


def record_d(v: VectorCode, record, half: int | None = None):
    """The 16 rows' float16 d at the record's start as <16 x float> (or a half's 8)."""
    lanes = TILE if half is None else TILE // 2
    at = 0 if half is None else 2 * lanes * half
    halves = v.builder.bitcast(v.load(None, record, ir.IntType(64)(at), 2 * lanes), ir.VectorType(ir.HalfType(), lanes))
    return v.builder.fpext(halves, ir.VectorType(ir.FloatType(), lanes))


def prefetch_ahead(v: VectorCode, record, record_bytes: int):
    """Ask for every cache line of the record PREFETCH_RECORDS further on (the next tile's first records
    once b is near the end: the records of a run of tiles lie one after another)."""
    for line in range(0, record_bytes, 64):
        v.prefetch(None, record, ir.IntType(64)(line), PREFETCH_RECORDS * record_bytes)


def record_pointer(v: VectorCode, packed_type, packed, n_blocks, tile, b):
    """The first byte of record tile * n_blocks + b."""
    builder = v.builder
    return v.row_pointer(packed_type, packed, builder.add(builder.mul(v.resize(tile, 64), v.resize(n_blocks, 64)), v.resize(b, 64)))


def one_row_dots(emit, record_bytes: int, prefetch: bool = True):
    """record_dots_1(packed, n_blocks, tile, b, aqs, ad, pairs, acc, t, a), an intrinsic: acc[a] (16
    floats, the tile's rows) takes super-block b's step for activation row t, by emit(v, record, aqs, ad,
    pairs, acc, t, a, b, half) (each a (type, value) pair but t, a, b): once for all 16 lanes (half
    None), or on AVX2 (narrow) once per half of 8, each half done and stored before the other, so that
    LLVM cannot keep the activation's broadcasts from one half to the next (which spilled them).
    prefetch: ask for the records PREFETCH_RECORDS ahead (prefetch_ahead)."""

    @intrinsic
    def record_dots_1(typingctx, packed, n_blocks, tile, b, aqs, ad, pairs, acc, t, a):
        sig = types.void(packed, n_blocks, tile, b, aqs, ad, pairs, acc, t, a)

        def codegen(context, builder, signature, args):
            packed_, n_blocks_, tile_, b_, aqs_, ad_, pairs_, acc_, t_, a_ = args
            st = signature.args
            v = VectorCode(context, builder)
            t_, a_, b_ = v.resize(t_, 64), v.resize(a_, 64), v.resize(b_, 64)
            record = record_pointer(v, st[0], packed_, n_blocks_, tile_, b_)
            if prefetch:
                prefetch_ahead(v, record, record_bytes)
            for half in ([0, 1] if narrow(v) else [None]):
                emit(v, record, (st[4], aqs_), (st[5], ad_), (st[6], pairs_), (st[7], acc_), t_, a_, b_, half)
            return context.get_dummy_value()

        return sig, codegen

    return record_dots_1


@intrinsic
def unpacks_from(typingctx):
    """UNPACK_ROWS, or NARROW_UNPACK_ROWS where this compile's products run as halves (narrow)."""

    def codegen(context, builder, signature, args):
        return ir.Constant(ir.IntType(64), NARROW_UNPACK_ROWS if narrow(VectorCode(context, builder)) else UNPACK_ROWS)

    return types.int64(), codegen


def float_step(v: VectorCode, acc, a, half: int | None, scale, step):
    """acc[a, the lanes of half] = fma(scale, step, acc[a, ...]): a float step on 16 or 8 lanes."""
    builder = v.builder
    floats = scale.type
    lanes = floats.count
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(floats, [floats] * 3), f"llvm.fma.v{lanes}f32")
    first = 0 if half is None else lanes * half
    pointer = builder.bitcast(builder.gep(v.row_pointer(acc[0], acc[1], a), [ir.IntType(64)(first)]), floats.as_pointer())
    builder.store(builder.call(fma, [scale, step, builder.load(pointer, align=4)]), pointer, align=4)


def paired_sums(v: VectorCode, pairs, t, b, weight_pairs, half: int | None):
    """<lanes x i32>: lane i = sum_g w_g(row i) * asum_g over the block's 16 groups, from the rows' int16
    pairs (weight_pairs: 8 vectors of 16 or 8 lanes) and activation row t's pairs of 16-element sums
    (pairs: (type, int32[T, nb * 8] value)): vpdpwssd, or vpmaddwd per half."""
    builder = v.builder
    i64 = ir.IntType(64)
    lanes = TILE if half is None else TILE // 2
    pair_row = v.row_pointer(pairs[0], pairs[1], t)
    total = None
    for k in range(N_PAIRS):
        group_pair = v.splat(builder.load(builder.gep(pair_row, [builder.add(builder.mul(b, i64(N_PAIRS)), i64(k))])), lanes)
        if half is None:
            total = _dot_word_pairs_512(v, total, weight_pairs[k], group_pair)
        else:
            total = v.add(total, v.scale_pairs(v.bitcast(weight_pairs[k], 16, 16), v.bitcast(group_pair, 16, 16)))
    return total


def block_step(v: VectorCode, record, word_quads, scales, scale_pairs, offset_bits: int, aqs, ad, pairs, acc, t, a, b, half):
    """acc[a, lanes of half] takes super-block b's step for activation row t, for a type whose values u
    = q + 2**offset_bits go by 16-element groups with signed integer scales and whose d leads the record
    (Q3_K, Q6_K): the int32 total sum_g scale_g * (<u_g, a_g> - 2**offset_bits * asum_g), then vec_dot's
    float step fma(ad * d, total, acc). scales and scale_pairs as _record_scales gives them."""
    builder = v.builder
    lanes = TILE if half is None else TILE // 2
    floats = ir.VectorType(ir.FloatType(), lanes)
    scaled = scaled_sums(v, word_quads, scales, aqs, t, b, half)
    offsets = paired_sums(v, pairs, t, b, scale_pairs, half)  # sum_g scale_g * asum_g
    total = builder.sub(scaled, v.shl(offsets, offset_bits))
    a_scale = v.splat(builder.load(builder.gep(v.row_pointer(ad[0], ad[1], t), [b])), lanes)
    # vec_dot's float step, lane by lane: the product ad * d rounded, then one fma
    step_scale = builder.fmul(a_scale, record_d(v, record, half), flags=("arcp",))
    float_step(v, acc, a, half, step_scale, builder.sitofp(total, floats))


def _emit_record_dots(v: VectorCode, record, aqs, ad, pairs, acc, t, a, b, half: int | None):
    """acc[a, lanes of half] takes the block's step for activation row t (one_row_dots' emit)."""
    scales, scale_pairs = _record_scales(v, record, half)
    block_step(v, record, _word_quads(v, record, half), scales, scale_pairs, 2, aqs, ad, pairs, acc, t, a, b, half)


record_dots_1 = one_row_dots(_emit_record_dots, RECORD_BYTES)


@intrinsic
def unpack_record(typingctx, packed, n_blocks, tile, b, quants, scales, scale_pairs, d):
    """Record (tile, b) into q3_k_tiles' scratch for its tile_dots: quants uint8[64, 64] (row i's u at
    position p in quants[p // 4, 4 * i + p % 4]), scales int32[16, 16], scale_pairs int32[8, 16], d
    float32[16]."""
    sig = types.void(packed, n_blocks, tile, b, quants, scales, scale_pairs, d)

    def codegen(context, builder, signature, args):
        packed_, n_blocks_, tile_, b_, quants_, scales_, pairs_, d_ = args
        st = signature.args
        v = VectorCode(context, builder)
        record = record_pointer(v, st[0], packed_, n_blocks_, tile_, b_)

        quads = _record_quads(v, record)
        for q in range(64):
            store_vector(v, st[4], quants_, 64 * q, quads(q))
        scale_vectors, scale_pairs = _record_scales(v, record)
        for g in range(N_GROUPS):
            store_vector(v, st[5], scales_, TILE * g, scale_vectors[g])
        for k in range(N_PAIRS):
            store_vector(v, st[6], pairs_, TILE * k, scale_pairs[k])
        store_vector(v, st[7], d_, 0, record_d(v, record))
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel(parallel=True)
def matvec_packed(packed, n_blocks, n_parts, out, qs, d, s):
    """out[t, r] for r < 16 * n_tiles (the packed rows), every value equal to q3_k.vec_dot(row r,
    qs[t], d[t], s[t]): q4_k_x16.matvec_packed's loop for Q3_K's records (the tiles split in n_parts
    contiguous runs, each with its own float sums for CHUNK activation rows), from unpacks_from()
    activation rows through q3_k_tiles' scratch, fewer straight from the records."""
    n_rows = qs.shape[0]
    n_tiles = packed.shape[0] // n_blocks
    pairs = np.empty((n_rows, n_blocks * N_PAIRS), dtype=np.int32)
    group_sum_pairs(s, pairs)
    n_parts = max(1, min(n_parts, n_tiles))
    unpack = n_rows >= unpacks_from()
    for part in prange(n_parts):
        acc = np.empty((min(CHUNK, n_rows), TILE), dtype=np.float32)
        quants = np.empty((64, 64), dtype=np.uint8)
        scales = np.empty((N_GROUPS, TILE), dtype=np.int32)
        scale_pairs = np.empty((N_PAIRS, TILE), dtype=np.int32)
        dd = np.empty(TILE, dtype=np.float32)
        for tile in range(part * n_tiles // n_parts, (part + 1) * n_tiles // n_parts):
            for t0 in range(0, n_rows, CHUNK):
                t1 = min(t0 + CHUNK, n_rows)
                acc[: t1 - t0] = 0.0
                for b in range(n_blocks):
                    if unpack:
                        unpack_record(packed, n_blocks, tile, b, quants, scales, scale_pairs, dd)
                        t = t0
                        while t + ROWS <= t1:
                            tile_dots_4(quants, scales, scale_pairs, dd, qs, d, pairs, acc, t, t - t0, b)
                            t += ROWS
                        while t < t1:
                            tile_dots_1(quants, scales, scale_pairs, dd, qs, d, pairs, acc, t, t - t0, b)
                            t += 1
                    elif n_rows == 1:  # decode: no loop over rows (q4_k_x16.matvec_packed says why)
                        record_dots_1(packed, n_blocks, tile, b, qs, d, pairs, acc, 0, 0)
                    else:
                        for t in range(t0, t1):
                            record_dots_1(packed, n_blocks, tile, b, qs, d, pairs, acc, t, t - t0)
                for t in range(t0, t1):
                    for i in range(TILE):
                        out[t, tile * TILE + i] = acc[t - t0, i]
