"""Q6_K weights re-laid 16 rows at a time, for products with the weight rows as vector lanes at any
number of activation rows (decode included), on AVX-512 VNNI and AVX2 targets: q3_k_x16's scheme for
Q6_K, whose block sum has the same shape (16 groups of 16 with signed integer scales, an unsigned value
u = q + 32, the offset back through the activation's group sums, one float step per block).

Q6_K's 210-byte block is ql (bytes 0..127, words 0..31), qh (128..191, words 32..47), the 16 int8
scales (192..207, words 48..51) and the float16 d (208, 209). Records of 3360 bytes, one per tile of
16 rows and super-block b, hold the same bytes:
  bytes 0..31                     the 16 rows' float16 d (row i at 2i)
  bytes 32 + 64 SLOT[w] + 4i + k  byte 4w + k of row i's block (w < 52)
so one 64-byte load holds a word of each of 16 rows, and the words lie in the order the products read
them (ORDER: the scales, then for each half and s8 the two ql words and the qh word below), so a record
is read front to back (in the block's own word order, ql and qh words in turn, decode from memory ran
at well under the row kernel's speed on a Zen 3: docs/performance.md). For half h and s8 < 8, ql word
16h + s8 holds elements 128h + 4 * s8..+3 in its low nibbles and 128h + 64 + 4 * s8.. in its high ones,
ql word 16h + 8 + s8 elements 128h + 32 + 4 * s8.. and 128h + 96 + 4 * s8.., and qh word 32 + 8h + s8
their high bit pairs (bits 2j, 2j + 1 for elements 128h + 32j + 4 * s8..): q3_k_x16.scaled_sums' word
order, so its sums, offsets (shifted by 5 here) and float step serve as they are. Every output equals
q6_k.vec_dot's bit for bit, at every number of activation rows. From q3_k_x16's unpacks_from() activation
rows each record is unpacked once into q6_k_tiles' scratch (no transpose) for its tile_dots.

Not picked on any target yet (its PackedKernel: the kernel record says why).
"""

from __future__ import annotations

import numpy as np
from numba import prange, types
from numba.extending import intrinsic

from ....jit import exact_kernel
from ....quant.q6_k import BLOCK_BYTES, N_GROUPS
from .q2_k_tiles import N_PAIRS, store_vector
from .q3_k_x16 import NARROW_UNPACK_ROWS, UNPACK_ROWS, WORDS_AT, block_step, one_row_dots, record_d, record_pointer
from .q3_k_x16 import unpacks_from, word_vector
from .q4_k_tiles import CHUNK, ROWS, TILE
from .q6_k_tiles import group_sum_pairs, tile_dots_1, tile_dots_4
from .vector import VectorCode

WORDS = 52  # whole words of a 210-byte block (bytes 0..207); the float16 d (bytes 208, 209) leads the record
RECORD_BYTES = TILE * BLOCK_BYTES  # 3360
_QL_WORDS, _QH_WORDS, _SCALE_WORDS = 0, 32, 48
OFFSET_BITS = 5  # u = q + 32
ORDER = tuple([_SCALE_WORDS + k for k in range(4)] + [
    w for h in range(2) for s8 in range(8) for w in (_QL_WORDS + 16 * h + s8, _QL_WORDS + 16 * h + 8 + s8, _QH_WORDS + 8 * h + s8)
])  # the block's words in the order of the records
SLOT = np.array([ORDER.index(w) for w in range(WORDS)], dtype=np.int64)  # word w's place in a record
# UNPACK_ROWS and NARROW_UNPACK_ROWS: q3_k_x16's
__all__ = ["CHUNK", "NARROW_UNPACK_ROWS", "ROWS", "UNPACK_ROWS", "matvec_packed", "pack"]


@exact_kernel(parallel=True)
def interleave(weights, packed):
    """weights uint8[N, nb * 210] -> packed uint8[N // 16 * nb, 3360]: record tile * nb + b as above."""
    n_blocks = weights.shape[1] // BLOCK_BYTES
    for tile in prange(packed.shape[0] // max(n_blocks, 1)):
        for b in range(n_blocks):
            record = packed[tile * n_blocks + b]
            for i in range(TILE):
                row = weights[tile * TILE + i]
                at = b * BLOCK_BYTES
                record[2 * i] = row[at + 208]
                record[2 * i + 1] = row[at + 209]
                for w in range(WORDS):
                    for k in range(4):
                        record[WORDS_AT + 64 * SLOT[w] + 4 * i + k] = row[at + 4 * w + k]


def pack(weights: np.ndarray) -> np.ndarray:
    """uint8[N, nb * 210] Q6_K rows -> the records of their first N - N % 16 rows (interleave)."""
    n_tiles = weights.shape[0] // TILE
    n_blocks = weights.shape[1] // BLOCK_BYTES
    packed = np.empty((n_tiles * n_blocks, RECORD_BYTES), dtype=np.uint8)
    interleave(np.ascontiguousarray(weights[: n_tiles * TILE]), packed)
    return packed


def _word(v: VectorCode, record, w: int, half: int | None = None):
    """Word w of the 16 rows' blocks (q3_k_x16.word_vector), at its SLOT."""
    return word_vector(v, record, WORDS_AT + 64 * int(SLOT[w]), half)


def _quad_bytes(v: VectorCode, low_word, high_word, j: int):
    """u = q + 32 of the rows' quad j (elements 128h + 32j + 4 * s8..+3): the low (j = 0, 1) or high
    (j = 2, 3) nibbles of the ql word, or'd with bits 2j, 2j + 1 of the qh word moved to bits 4, 5."""
    nibbles = v.and_(low_word, 15) if j < 2 else v.shr(low_word, 4)
    shift = 4 - 2 * j
    moved = v.shl(high_word, shift) if shift > 0 else (high_word if shift == 0 else v.shr(high_word, -shift))
    return v.or_(nibbles, v.and_(moved, 48))


def _word_quads(v: VectorCode, record, half: int | None):
    """q3_k_x16.scaled_sums' word_quads for Q6_K: quads j = 0, 2 from ql word 16h + s8, j = 1, 3 from
    ql word 16h + 8 + s8, their high bits from qh word 32 + 8h + s8."""

    def word_quads(h: int, s8: int):
        low_words = (_word(v, record, _QL_WORDS + 16 * h + s8, half), _word(v, record, _QL_WORDS + 16 * h + 8 + s8, half))
        high_word = _word(v, record, _QH_WORDS + 8 * h + s8, half)
        return lambda j: _quad_bytes(v, low_words[j % 2], high_word, j)

    return word_quads


def _record_scales(v: VectorCode, record, half: int | None = None):
    """The rows' int8 scales: [group g's as <16 x i32> (<8 x i32> for a half), g < 16], and the pairs
    of groups 2k, 2k + 1 as int16 halves of one lane."""
    lanes = TILE if half is None else TILE // 2
    words = [_word(v, record, _SCALE_WORDS + w, half) for w in range(4)]
    scales = [v.widen(v.shuffle(words[g // 4], [4 * i + g % 4 for i in range(lanes)]), 32) for g in range(N_GROUPS)]
    pairs = [v.or_(v.and_(scales[2 * k], 0xFFFF), v.shl(scales[2 * k + 1], 16)) for k in range(N_PAIRS)]
    return scales, pairs


def _emit_record_dots(v: VectorCode, record, aqs, ad, pairs, acc, t, a, b, half: int | None):
    """acc[a, lanes of half] takes the block's step for activation row t (one_row_dots' emit)."""
    scales, scale_pairs = _record_scales(v, record, half)
    block_step(v, record, _word_quads(v, record, half), scales, scale_pairs, OFFSET_BITS, aqs, ad, pairs, acc, t, a, b, half)


# No software prefetch: the records are read front to back (ORDER), which the hardware's prefetchers
# follow (q3_k_x16's four records ahead made decode from memory slower on a Zen 3: docs/performance.md).
record_dots_1 = one_row_dots(_emit_record_dots, RECORD_BYTES, prefetch=False)


@intrinsic
def unpack_record(typingctx, packed, n_blocks, tile, b, quants, scales, scale_pairs, d):
    """Record (tile, b) into q6_k_tiles' scratch for its tile_dots: quants uint8[64, 64] (row i's u at
    position p in quants[p // 4, 4 * i + p % 4]), scales int32[16, 16], scale_pairs int32[8, 16], d
    float32[16]."""
    sig = types.void(packed, n_blocks, tile, b, quants, scales, scale_pairs, d)

    def codegen(context, builder, signature, args):
        packed_, n_blocks_, tile_, b_, quants_, scales_, pairs_, d_ = args
        st = signature.args
        v = VectorCode(context, builder)
        record = record_pointer(v, st[0], packed_, n_blocks_, tile_, b_)
        word_quads = _word_quads(v, record, None)
        for h in range(2):
            for s8 in range(8):
                quad = word_quads(h, s8)
                for j in range(4):  # elements 128h + 32j + 4 * s8..: quants row 32h + 8j + s8
                    store_vector(v, st[4], quants_, 64 * (32 * h + 8 * j + s8), quad(j))
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
    """out[t, r] for r < 16 * n_tiles (the packed rows), every value equal to q6_k.vec_dot(row r,
    qs[t], d[t], s[t]): q3_k_x16.matvec_packed's loop for Q6_K's records and q6_k_tiles' scratch."""
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
