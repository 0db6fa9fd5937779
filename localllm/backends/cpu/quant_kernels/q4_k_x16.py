"""Q4_K weights re-laid 16 rows at a time, for products with the weight rows as vector lanes at any
number of activation rows (decode included), on AVX-512 VNNI and AVX2 targets (matmul.packed_available).

The tile kernels (q4_k_tiles) transpose 16 weight rows per product, which only pays back over many
activation rows; a decode step reads each weight once. Here the transpose is done once, when a weight
is first multiplied (CPUBackend), into `packed`: for each tile of 16 rows and super-block b, a record
of 576 32-bit words where word 16 * s + i is word s of row i's 144-byte block (s = 0: d and dmin as two
float16; s = 1..3: the 12 packed scale bytes; s = 4..35: the quants, 4 bytes = 8 nibbles each). So a
record is the transpose of a 16 x 36 word matrix: the same bytes, nothing widened, the same size as
the rows (llama.cpp repacks its Q4_K weights likewise, 8 rows per group, ggml's "CPU_REPACK" buffers).

One 64-byte load then holds four quant bytes of each of 16 rows; its low nibbles are sub-block 2c's
positions 4q..4q+3, its high nibbles sub-block 2c + 1's, so two vpdpbusd against broadcast activation
bytes add to 16 rows at once (lane i = row i). The scales and mins are unpacked on 16 lanes (ggml's
kmask trick on each lane's three words), the mins go through vpdpwssd against the activation's
32-element sums, and the float step is q4_k.accumulate's (fma(ad, fma(d, scaled, -(dmin * mins)),
acc)) on 16 lanes: each lane computes exactly what q4_k.vec_dot computes for its row, so every output
equals the one-row kernel's bit for bit, at every number of activation rows.

Per 16 rows and super-block this is ~280 instructions (64 vpdpbusd, 32 loads, the nibble splits, the
scales) where the one-row kernel spends ~50 per row (the per-block horizontal sums and the scalar float
step). Measured (Zen 4, one thread, one-row products, medians of 9 alternating passes): in cache
(1024 x 4096) 40 GB/s against the row kernel's 14; from memory (12 distinct 14336 x 4096 matrices) 20-24
against 14-17 GB/s, and on two threads 29-32 against 27-30. Unlike the row kernels it asks for no
software prefetch: the records are one sequential stream per thread, and 36 prefetches per record took
it from 20-24 down to 16-17 GB/s.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ....jit import exact_kernel
from .q2_k_tiles import store_vector
from .q4_k import BLOCK_BYTES
from .q4_k_tiles import CHUNK, TILE, _dot_quads_512, activation_quads, float_steps, narrow, sub_block_sum_pairs
from .q4_k_tiles import tile_dots_1, tile_dots_4
from .vector import VectorCode

WORDS = BLOCK_BYTES // 4  # 36 words per row and super-block
RECORD_WORDS = WORDS * TILE  # 576: one tile's super-block
_SCALE_WORDS, _QUANT_WORDS = 1, 4  # word s of a row's block: 0 d|dmin, 1..3 scales, 4..35 quants
ROWS = 4  # activation rows sharing each quant load (as q4_k_tiles.ROWS)
# From this many activation rows the records go through q4_k_tiles' scratch (matvec_packed). Products
# of T activation rows, speed against the row kernels' multi-row driver, 14336 x 4096 from memory, one
# and two threads, a session script: straight from the records T = 2: 1.07-1.10x, 4: 0.95-0.99x,
# 8: 0.73-0.76x; through the scratch T = 8: 0.98-1.0x, 15: 1.26-1.32x.
UNPACK_ROWS = 8


@exact_kernel(parallel=True)
def interleave(weights, packed):
    """weights uint32[N, nb * 36] (Q4_K rows as words) -> packed uint32[N // 16 * nb, 576]: record
    tile * nb + b holds, at word 16 * s + i, word s of row 16 * tile + i's super-block b."""
    n_blocks = weights.shape[1] // WORDS
    for tile in prange(packed.shape[0] // n_blocks):
        for b in range(n_blocks):
            record = packed[tile * n_blocks + b]
            for i in range(TILE):
                row = weights[tile * TILE + i]
                for s in range(WORDS):
                    record[TILE * s + i] = row[b * WORDS + s]


def pack(weights: np.ndarray) -> np.ndarray:
    """uint8[N, nb * 144] Q4_K rows -> the records of their first N - N % 16 rows (interleave)."""
    n_tiles = weights.shape[0] // TILE
    n_blocks = weights.shape[1] // BLOCK_BYTES
    packed = np.empty((n_tiles * n_blocks, RECORD_WORDS), dtype=np.uint32)
    interleave(np.ascontiguousarray(weights[: n_tiles * TILE]).view(np.uint32), packed)
    return packed


def unpacked_codes(v: VectorCode, record):
    """The record's scales and mins on 16 lanes: ([scale_k as <16 x i32> for k < 8], [mins of
    sub-blocks 2k and 2k + 1 as the low and high int16 of each lane, for k < 4]): ggml's kmask
    unpacking (q4_k.scale_min_words) applied to each lane's three words."""
    i64 = ir.IntType(64)
    low, mid, high = (v.load(None, record, i64(TILE * (_SCALE_WORDS + w)), TILE) for w in range(3))
    scales_0_3 = v.and_(low, 0x3F3F3F3F)
    scales_4_7 = v.or_(v.and_(high, 0x0F0F0F0F), v.shl(v.and_(v.shr(low, 6), 0x03030303), 4))
    mins_0_3 = v.and_(mid, 0x3F3F3F3F)
    mins_4_7 = v.or_(v.and_(v.shr(high, 4), 0x0F0F0F0F), v.shl(v.and_(v.shr(mid, 6), 0x03030303), 4))
    scales = []
    for k in range(8):
        word = scales_0_3 if k < 4 else scales_4_7
        scales.append(v.and_(v.shr(word, 8 * (k % 4)), 0xFF))
    min_pairs = []
    for k in range(4):
        word = mins_0_3 if k < 2 else mins_4_7
        first = 16 * (k % 2)  # bit offset of min 2k's byte in its word
        low_min = v.and_(v.shr(word, first), 0xFF)
        high_min = v.and_(v.shr(word, first + 8), 0xFF)
        min_pairs.append(v.or_(low_min, v.shl(high_min, 16)))
    return scales, min_pairs


def _record_dots(rows: int):
    @intrinsic
    def record_dots(typingctx, packed, n_blocks, tile, b, aqs, ad, pairs, acc, t, a):
        """For activation rows t..t+rows-1 and super-block b of the tile: acc[a + u] (16 floats, the
        tile's rows) takes the block's step, as q4_k.accumulate takes it for each row."""
        sig = types.void(packed, n_blocks, tile, b, aqs, ad, pairs, acc, t, a)

        def codegen(context, builder, signature, args):
            packed_, n_blocks_, tile_, b_, aqs_, ad_, pairs_, acc_, t_, a_ = args
            st = signature.args
            v = VectorCode(context, builder)
            i64 = ir.IntType(64)
            f32x16 = ir.VectorType(ir.FloatType(), 16)
            t_, a_, b_ = v.resize(t_, 64), v.resize(a_, 64), v.resize(b_, 64)
            record = v.row_pointer(st[0], packed_, builder.add(builder.mul(v.resize(tile_, 64), v.resize(n_blocks_, 64)), b_))
            scales, min_pairs = unpacked_codes(v, record)
            act_quad = activation_quads(v, st[4], aqs_, t_, b_, rows)
            scaled = [None] * rows
            for c in range(4):  # 32 quant bytes per row: sub-blocks 2c (low nibbles) and 2c + 1 (high)
                low_sums, high_sums = [None] * rows, [None] * rows
                for q in range(8):
                    word_at = TILE * (_QUANT_WORDS + 8 * c + q)
                    quads = v.bitcast(v.load(None, record, i64(word_at), TILE), 64, 8)
                    # the high nibbles stay in place (16 x their value): one vpand instead of a shift
                    # and a mask per load; their sums are divided by 16 once per sub-block below. Not
                    # on narrow targets: vpmaddubsw would saturate on 240 x 127 pairs.
                    low = v.and_(quads, 0x0F)
                    high = v.and_(v.shr(quads, 4), 0x0F) if narrow(v) else v.and_(quads, 0xF0)
                    for u in range(rows):
                        low_sums[u] = _dot_quads_512(v, low_sums[u], low, act_quad(u, 64 * c + 4 * q))
                        high_sums[u] = _dot_quads_512(v, high_sums[u], high, act_quad(u, 64 * c + 32 + 4 * q))
                for u in range(rows):
                    # exact: every term is a multiple of 16 (and |sum| < 2^31: 32 * 240 * 128)
                    if not narrow(v):
                        high_sums[u] = builder.ashr(high_sums[u], v.constant(4, TILE, 32))
                    part = builder.add(builder.mul(low_sums[u], scales[2 * c]), builder.mul(high_sums[u], scales[2 * c + 1]))
                    scaled[u] = v.add(scaled[u], part)
            halves = builder.bitcast(v.load(None, record, i64(0), TILE), ir.VectorType(ir.HalfType(), 2 * TILE))
            d_vec = builder.fpext(v.shuffle(halves, range(0, 2 * TILE, 2)), f32x16)
            dmin_vec = builder.fpext(v.shuffle(halves, range(1, 2 * TILE, 2)), f32x16)
            float_steps(v, scaled, d_vec, dmin_vec, min_pairs, (st[6], pairs_), (st[5], ad_), (st[7], acc_), t_, a_, b_)
            return context.get_dummy_value()

        return sig, codegen

    return record_dots


@intrinsic
def unpack_record(typingctx, packed, n_blocks, tile, b, quants, scales, mins, d, dmin):
    """Record (tile, b) into q4_k_tiles' scratch for its tile_dots: quants uint8[64, 64] (row i's
    quant at position p in quants[p // 4, 4 * i + p % 4]: the record's quad words with their nibbles
    split, no transpose), scales int32[8, 16], mins int32[4, 16] (sub-blocks 2k and 2k + 1 as int16
    halves), d and dmin float32[16]."""
    sig = types.void(packed, n_blocks, tile, b, quants, scales, mins, d, dmin)

    def codegen(context, builder, signature, args):
        packed_, n_blocks_, tile_, b_, quants_, scales_, mins_, d_, dmin_ = args
        st = signature.args
        v = VectorCode(context, builder)
        i64 = ir.IntType(64)
        f32x16 = ir.VectorType(ir.FloatType(), 16)
        record = v.row_pointer(st[0], packed_, builder.add(builder.mul(v.resize(tile_, 64), v.resize(n_blocks_, 64)), v.resize(b_, 64)))

        for c in range(4):
            for q in range(8):
                quads = v.bitcast(v.load(None, record, i64(TILE * (_QUANT_WORDS + 8 * c + q)), TILE), 64, 8)
                store_vector(v, st[4], quants_, 64 * (16 * c + q), v.and_(quads, 0x0F))  # sub-block 2c: positions 64c + 4q..
                store_vector(v, st[4], quants_, 64 * (16 * c + 8 + q), v.and_(v.shr(quads, 4), 0x0F))  # 2c + 1: 64c + 32 + 4q..
        scale_vectors, min_pairs = unpacked_codes(v, record)
        for k in range(8):
            store_vector(v, st[5], scales_, TILE * k, scale_vectors[k])
        for k in range(4):
            store_vector(v, st[6], mins_, TILE * k, min_pairs[k])
        halves = builder.bitcast(v.load(None, record, i64(0), TILE), ir.VectorType(ir.HalfType(), 2 * TILE))
        store_vector(v, st[7], d_, 0, builder.fpext(v.shuffle(halves, range(0, 2 * TILE, 2)), f32x16))
        store_vector(v, st[8], dmin_, 0, builder.fpext(v.shuffle(halves, range(1, 2 * TILE, 2)), f32x16))
        return context.get_dummy_value()

    return sig, codegen


record_dots_4 = _record_dots(ROWS)
record_dots_1 = _record_dots(1)


@exact_kernel(parallel=True)
def matvec_packed(packed, n_blocks, n_parts, out, qs, d, s):
    """out[t, r] for r < 16 * n_tiles (the packed rows), every value equal to q4_k.vec_dot(row r,
    qs[t], d[t], s[t]). The tiles are split in n_parts contiguous runs (the caller passes its thread
    count: numba.get_num_threads inside a kernel keeps Numba from caching it), each with its own float
    sums for CHUNK activation rows (so no allocation per tile: a decode step of an 8B model goes through
    ~86,000 tiles). From UNPACK_ROWS activation rows each record is unpacked once per chunk into
    q4_k_tiles' scratch and taken by its tile_dots (prefill: the 8B-shaped file's pp512 at 2 threads
    went from 33 to 39 tok/s against record_dots_4 straight from the record, whose unpacked quants
    LLVM kept in stack slots); fewer rows go straight from the record."""
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
                    elif n_rows == 1:  # decode: no loop over rows, out of which LLVM would hoist the
                        record_dots_1(packed, n_blocks, tile, b, qs, d, pairs, acc, 0, 0)  # unpacked record into 64 stack slots
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


@exact_kernel(parallel=True)
def matvec_packed_grouped(packed, n_blocks, tiles_per_expert, groups, bounds, n_parts, out, qs, d, s):
    """Routed experts on records of several experts (expert e's tile j: records (e * tiles_per_expert + j)
    * n_blocks + b): out[t, r] for the rows t of group g (bounds[g] <= t < bounds[g + 1]), every value
    equal to q4_k.vec_dot(row r of expert groups[g], qs[t], d[t], s[t]), as matvec_packed computes it.

    One parallel region for all the groups (a decode step of Qwen3-30B-A3B multiplies 8 experts of 768
    rows three times per layer: as separate products, each one's call and thread start cost about as
    much as its 0.9 MB of weights take to read). The jobs are (run, group) with each group's tiles cut
    in n_parts runs, run-major: contiguous job ranges give every thread a share of every group."""
    n_rows = qs.shape[0]
    pairs = np.empty((n_rows, n_blocks * 4), dtype=np.int32)
    sub_block_sum_pairs(s, pairs)
    n_groups = groups.shape[0]
    runs = max(1, min(n_parts, tiles_per_expert))
    for job in prange(runs * n_groups):
        run, g = job // n_groups, job % n_groups
        first, last = bounds[g], bounds[g + 1]
        acc = np.empty((min(CHUNK, max(1, last - first)), TILE), dtype=np.float32)
        quants = np.empty((64, 64), dtype=np.uint8)
        scales = np.empty((8, TILE), dtype=np.int32)
        mins = np.empty((4, TILE), dtype=np.int32)
        dd = np.empty(TILE, dtype=np.float32)
        dm = np.empty(TILE, dtype=np.float32)
        for local in range(run * tiles_per_expert // runs, (run + 1) * tiles_per_expert // runs):
            tile = groups[g] * tiles_per_expert + local
            for t0 in range(first, last, CHUNK):
                t1 = min(t0 + CHUNK, last)
                acc[: t1 - t0] = 0.0
                for b in range(n_blocks):
                    if last - first >= UNPACK_ROWS:
                        unpack_record(packed, n_blocks, tile, b, quants, scales, mins, dd, dm)
                        t = t0
                        while t + ROWS <= t1:
                            tile_dots_4(quants, scales, mins, dd, dm, qs, d, pairs, acc, t, t - t0, b)
                            t += ROWS
                        while t < t1:
                            tile_dots_1(quants, scales, mins, dd, dm, qs, d, pairs, acc, t, t - t0, b)
                            t += 1
                    elif t1 - t0 == 1:
                        record_dots_1(packed, n_blocks, tile, b, qs, d, pairs, acc, t0, 0)
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
                        out[t, local * TILE + i] = acc[t - t0, i]
