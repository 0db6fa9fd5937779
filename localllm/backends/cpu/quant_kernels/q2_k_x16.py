"""Q2_K weights re-laid 16 rows at a time, for products with the weight rows as vector lanes at any
number of activation rows (decode included), on AVX-512 VNNI and AVX2 targets (q3_k_x16's scheme for
Q2_K).

Done once, when a weight is first multiplied (matmul.PackedWeights): records of 1344 bytes, one per tile
of 16 rows and super-block b, the same bytes as the rows' blocks, word w of row i (the block's bytes
4w..4w+3) at bytes 64w + 4i: words 0..3 the scale codes (byte g: scale | min << 4 of group g), 4..19 the
quants, 20 d and dmin. Quant word 4 + s (s < 16; half h = s // 8) holds, in its bits 2j, 2j + 1,
elements 128h + 32j + 4(s % 8)..+3 of each row, a quad multiplied by the activation's (broadcast) with
vpdpbusd (two vpmaddubsw halves on AVX2), four quads to a group, each group's sums times the rows'
scales; the mins go through vpdpwssd against the activation's 16-element sums, and the float step is
q2_k.vec_dot's, fma(ad, fma(d, scaled, -(dmin * mins)), acc), on 16 lanes (q2_k_tiles'). Every output
equals q2_k.vec_dot's bit for bit, at every number of activation rows. From UNPACK_ROWS activation rows
(NARROW_UNPACK_ROWS on AVX2) each record is unpacked once into q2_k_tiles' scratch (the quants times
their scales, no transpose) for its tile_dots. Decode asks for the records q3_k_x16.PREFETCH_RECORDS ahead.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ....jit import exact_kernel
from ....quant.q2_k import BLOCK_BYTES, N_GROUPS
from .q2_k_tiles import N_PAIRS, store_vector, tile_dots_1, tile_dots_4
from .q3_k_x16 import NARROW_UNPACK_ROWS, UNPACK_ROWS, float_step, one_row_dots, paired_sums, record_pointer, scaled_sums
from .q3_k_x16 import unpacks_from, word_vector
from .q4_k_tiles import CHUNK, ROWS, TILE
from .q6_k_tiles import group_sum_pairs
from .vector import VectorCode

WORDS = BLOCK_BYTES // 4  # 21
RECORD_BYTES = TILE * BLOCK_BYTES  # 1344
_SCALE_WORDS, _QUANT_WORDS, _D_WORD = 0, 4, 20
# UNPACK_ROWS, NARROW_UNPACK_ROWS and the prefetch distance: q3_k_x16's (measured there; Q2_K's records
# are the same kind of work, less of it).
__all__ = ["NARROW_UNPACK_ROWS", "UNPACK_ROWS", "matvec_packed", "pack"]


@exact_kernel(parallel=True)
def interleave(weights, packed):
    """weights uint32[N, nb * 21] (Q2_K rows as words) -> packed uint32[N // 16 * nb, 336]: record
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
    """uint8[N, nb * 84] Q2_K rows -> the records of their first N - N % 16 rows (interleave), as bytes."""
    n_tiles = weights.shape[0] // TILE
    n_blocks = weights.shape[1] // BLOCK_BYTES
    packed = np.empty((n_tiles * n_blocks, WORDS * TILE), dtype=np.uint32)
    interleave(np.ascontiguousarray(weights[: n_tiles * TILE]).view(np.uint32), packed)
    return packed.view(np.uint8)


def _word(v: VectorCode, record, w: int, half: int | None = None):
    """Word w of the 16 rows' blocks (q3_k_x16.word_vector)."""
    return word_vector(v, record, 64 * w, half)


def _record_codes(v: VectorCode, record, half: int | None = None):
    """The rows' scales [group g's as <lanes x i32>, g < 16] and the pairs of their mins (groups 2k and
    2k + 1 as the low and high int16 of one lane)."""
    lanes = TILE if half is None else TILE // 2
    words = [v.bitcast(_word(v, record, _SCALE_WORDS + w, half), lanes, 32) for w in range(4)]
    scales = [v.and_(v.shr(words[g // 4], 8 * (g % 4)), 15) for g in range(N_GROUPS)]
    mins = [v.and_(v.shr(words[g // 4], 8 * (g % 4) + 4), 15) for g in range(N_GROUPS)]
    pairs = [v.or_(mins[2 * k], v.shl(mins[2 * k + 1], 16)) for k in range(N_PAIRS)]
    return scales, pairs


def _record_d_dmin(v: VectorCode, record, half: int | None = None):
    """d and dmin of the rows, <lanes x float> each (word 20: d the low float16, dmin the high)."""
    lanes = TILE if half is None else TILE // 2
    halves = v.builder.bitcast(_word(v, record, _D_WORD, half), ir.VectorType(ir.HalfType(), 2 * lanes))
    floats = ir.VectorType(ir.FloatType(), lanes)
    d = v.builder.fpext(v.shuffle(halves, range(0, 2 * lanes, 2)), floats)
    dmin = v.builder.fpext(v.shuffle(halves, range(1, 2 * lanes, 2)), floats)
    return d, dmin


def _word_quads(v: VectorCode, record, half: int | None):
    """q3_k_x16.scaled_sums' word_quads for Q2_K: the quant word's 2-bit quads as they are."""

    def word_quads(h: int, s8: int):
        quant_word = _word(v, record, _QUANT_WORDS + 8 * h + s8, half)
        return lambda j: v.and_(v.shr(quant_word, 2 * j), 3)

    return word_quads


def _emit_record_dots(v: VectorCode, record, aqs, ad, pairs, acc, t, a, b, half: int | None):
    """acc[a, lanes of half] takes the block's step for activation row t (q3_k_x16.one_row_dots' emit)."""
    builder = v.builder
    lanes = TILE if half is None else TILE // 2
    floats = ir.VectorType(ir.FloatType(), lanes)
    scales, min_pairs = _record_codes(v, record, half)
    scaled = scaled_sums(v, _word_quads(v, record, half), scales, aqs, t, b, half)  # sum_g scale_g * sum q * a
    mins = paired_sums(v, pairs, t, b, min_pairs, half)  # sum_g min_g * asum_g
    d_vec, dmin_vec = _record_d_dmin(v, record, half)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(floats, [floats] * 3), f"llvm.fma.v{lanes}f32")
    # q4_k.accumulate's float step, lane by lane (no fast-math flags: each operation rounded as written)
    mins_term = builder.fmul(dmin_vec, builder.sitofp(mins, floats), flags=("arcp",))
    step = builder.call(fma, [d_vec, builder.sitofp(scaled, floats), builder.fneg(mins_term, flags=("arcp",))])
    a_scale = v.splat(builder.load(builder.gep(v.row_pointer(ad[0], ad[1], t), [b])), lanes)
    float_step(v, acc, a, half, a_scale, step)


record_dots_1 = one_row_dots(_emit_record_dots, RECORD_BYTES)


@intrinsic
def unpack_record(typingctx, packed, n_blocks, tile, b, quants, min_pairs, d, dmin):
    """Record (tile, b) into q2_k_tiles' scratch for its tile_dots: quants uint8[64, 64] (row i's
    scale * q at position p in quants[p // 4, 4 * i + p % 4]: each 32-bit lane times its row's scale,
    no carry between its bytes as scale * q <= 45), min_pairs int32[8, 16], d and dmin float32[16]."""
    sig = types.void(packed, n_blocks, tile, b, quants, min_pairs, d, dmin)

    def codegen(context, builder, signature, args):
        packed_, n_blocks_, tile_, b_, quants_, pairs_, d_, dmin_ = args
        st = signature.args
        v = VectorCode(context, builder)
        record = record_pointer(v, st[0], packed_, n_blocks_, tile_, b_)

        scales, min_pairs = _record_codes(v, record)
        for s in range(16):
            quant_word = _word(v, record, _QUANT_WORDS + s)
            h, s8 = s // 8, s % 8
            for j in range(4):
                q = v.bitcast(v.and_(v.shr(quant_word, 2 * j), 3), TILE, 32)
                quad = 32 * h + 8 * j + s8  # elements 4 * quad .. : group quad // 4
                store_vector(v, st[4], quants_, 64 * quad, v.bitcast(builder.mul(q, scales[quad // 4]), 64, 8))
        for k in range(N_PAIRS):
            store_vector(v, st[5], pairs_, TILE * k, min_pairs[k])
        d_vec, dmin_vec = _record_d_dmin(v, record)
        store_vector(v, st[6], d_, 0, d_vec)
        store_vector(v, st[7], dmin_, 0, dmin_vec)
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel(parallel=True)
def matvec_packed(packed, n_blocks, n_parts, out, qs, d, s):
    """out[t, r] for r < 16 * n_tiles (the packed rows), every value equal to q2_k.vec_dot(row r,
    qs[t], d[t], s[t]): q3_k_x16.matvec_packed's loop for Q2_K's records."""
    n_rows = qs.shape[0]
    n_tiles = packed.shape[0] // n_blocks
    pairs = np.empty((n_rows, n_blocks * N_PAIRS), dtype=np.int32)
    group_sum_pairs(s, pairs)
    n_parts = max(1, min(n_parts, n_tiles))
    unpack = n_rows >= unpacks_from()
    for part in prange(n_parts):
        acc = np.empty((min(CHUNK, n_rows), TILE), dtype=np.float32)
        quants = np.empty((64, 64), dtype=np.uint8)
        min_pairs = np.empty((N_PAIRS, TILE), dtype=np.int32)
        dd = np.empty(TILE, dtype=np.float32)
        dm = np.empty(TILE, dtype=np.float32)
        for tile in range(part * n_tiles // n_parts, (part + 1) * n_tiles // n_parts):
            for t0 in range(0, n_rows, CHUNK):
                t1 = min(t0 + CHUNK, n_rows)
                acc[: t1 - t0] = 0.0
                for b in range(n_blocks):
                    if unpack:
                        unpack_record(packed, n_blocks, tile, b, quants, min_pairs, dd, dm)
                        t = t0
                        while t + ROWS <= t1:
                            tile_dots_4(quants, min_pairs, dd, dm, qs, d, pairs, acc, t, t - t0, b)
                            t += ROWS
                        while t < t1:
                            tile_dots_1(quants, min_pairs, dd, dm, qs, d, pairs, acc, t, t - t0, b)
                            t += 1
                    elif n_rows == 1:  # decode: no loop over rows (q4_k_x16.matvec_packed says why)
                        record_dots_1(packed, n_blocks, tile, b, qs, d, pairs, acc, 0, 0)
                    else:
                        for t in range(t0, t1):
                            record_dots_1(packed, n_blocks, tile, b, qs, d, pairs, acc, t, t - t0)
                for t in range(t0, t1):
                    for i in range(TILE):
                        out[t, tile * TILE + i] = acc[t - t0, i]
