"""Q4_0 weights re-laid 16 rows at a time, for products with the weight rows as vector lanes at any
number of activation rows (decode included), on AVX-512 VNNI and AVX2 targets (as q4_k_x16 does for
Q4_K).

legacy_tiles transposes 16 rows per product, which pays back only over many activation rows; here the
transpose is done once, when a weight is first multiplied (matmul.PackedWeights), into records of 288
bytes, one per tile of 16 rows and block b, the same bytes as the rows' blocks:
  bytes 0..31                 the 16 rows' float16 scales d (row i at 2i)
  bytes 32 + 64c + 4i + k     row i's quant byte 4c + k (c < 4, k < 4)
so one 64-byte load holds four quant bytes of each of 16 rows: its low nibbles are quad c of every row
(elements 4c..4c+3), its high nibbles quad c + 4 (elements 16 + 4c..), the operands of the
multiply-adds against broadcast activation quads. The products are tile_sums.py's (one float step per
block and row, Q4_0's block-sums order), so every output equals q4_0.vec_dot's bit for bit at every
number of activation rows; the decode reads APART tiles a quarter of the matrix apart in the same loop
steps. Figures: docs/performance.md.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ....jit import exact_kernel
from .iq4_tiles import table_values
from .legacy_tiles import QUADS, ROWS, TILE, zero_starts
from .tile_sums import emit_block_sums
from .vector import VectorCode

BLOCK_BYTES = 18  # a Q4_0 block: float16 d, 16 bytes of nibbles
RECORD_BYTES = TILE * BLOCK_BYTES  # 288
QUANTS_AT = 2 * TILE  # the record's first quant byte
ZERO = 8  # Q4_0's weights are d * (q - 8)


@exact_kernel(parallel=True)
def interleave(weights, packed):
    """weights uint8[N, nb * 18] -> packed uint8[N // 16 * nb, 288]: record tile * nb + b as above."""
    n_blocks = weights.shape[1] // BLOCK_BYTES
    for tile in prange(packed.shape[0] // max(n_blocks, 1)):
        for b in range(n_blocks):
            record = packed[tile * n_blocks + b]
            for i in range(TILE):
                row = weights[tile * TILE + i]
                at = b * BLOCK_BYTES
                record[2 * i] = row[at]
                record[2 * i + 1] = row[at + 1]
                for c in range(4):
                    for k in range(4):
                        record[QUANTS_AT + 64 * c + 4 * i + k] = row[at + 2 + 4 * c + k]


def pack(weights: np.ndarray) -> np.ndarray:
    """uint8[N, nb * 18] Q4_0 rows -> the records of their first N - N % 16 rows (interleave)."""
    n_tiles = weights.shape[0] // TILE
    n_blocks = weights.shape[1] // BLOCK_BYTES
    packed = np.empty((n_tiles * n_blocks, RECORD_BYTES), dtype=np.uint8)
    interleave(np.ascontiguousarray(weights[: n_tiles * TILE]), packed)
    return packed


def _record_vectors(v: VectorCode, record, levels=None):
    """A record's eight quad vectors (<64 x i8>, quad j of the 16 rows) and scales (<16 x float>); with
    `levels` (16 int8 values: IQ4_NL's) each nibble's level in place of the nibble."""
    builder = v.builder
    i64 = ir.IntType(64)
    quads = [None] * QUADS
    for c in range(4):
        packed = v.load(None, record, i64(QUANTS_AT + 64 * c), 64)
        quads[c] = v.and_(packed, 0x0F)
        quads[c + 4] = v.shr(packed, 4)
    if levels is not None:
        quads = [table_values(v, levels, quad) for quad in quads]
    halves = builder.bitcast(v.load(None, record, i64(0), 2 * TILE), ir.VectorType(ir.HalfType(), TILE))
    return quads, builder.fpext(halves, ir.VectorType(ir.FloatType(), TILE))


def _record_pointer(v: VectorCode, packed_type, packed, n_blocks, tile, b):
    builder = v.builder
    return v.row_pointer(packed_type, packed, builder.add(builder.mul(v.resize(tile, 64), v.resize(n_blocks, 64)), b))


def _record_rows(n_rows: int, n_tiles: int = 1, levels=None):
    """levels: a function of the VectorCode giving the 16 levels the nibbles stand for (IQ4_NL's, signed
    or + 128 as tile_sums takes them), or None: the nibbles themselves (Q4_0)."""

    @intrinsic
    def record_rows(typingctx, packed, n_blocks, tile, step, aqs, ad, starts, out, t):
        """out[t + u, 16 * tile_k : 16 * tile_k + 16] for u < n_rows and the n_tiles tiles tile_k = tile
        + k * step, straight from their records, all in one loop over the blocks (tile_sums.py); starts:
        tile_sums.emit_block_sums' starts (or, for levels on narrow targets, magnitudes)."""
        sig = types.void(packed, n_blocks, tile, step, aqs, ad, starts, out, t)

        def codegen(context, builder, signature, args):
            packed_, n_blocks_, tile_, step_, aqs_, ad_, starts_, out_, t_ = args
            st = signature.args
            v = VectorCode(context, builder)
            i64 = ir.IntType(64)

            def source(k):
                tile_k = builder.add(v.resize(tile_, 64), builder.mul(v.resize(step_, 64), i64(k)))

                def block_vectors(b):
                    record = _record_pointer(v, st[0], packed_, n_blocks_, tile_k, b)
                    return _record_vectors(v, record, None if levels is None else levels(v))

                return block_vectors, builder.mul(tile_k, i64(TILE))

            acts = [(st[4], aqs_), (st[5], ad_), (st[6], starts_)]
            sources = [source(k) for k in range(n_tiles)]
            emit_block_sums(v, sources, n_rows, n_blocks_, acts, (st[7], out_), t_, signed=levels is not None)
            return context.get_dummy_value()

        return sig, codegen

    return record_rows


# The tiles the one-row decode reads side by side, a quarter of the matrix apart: four sequential runs per thread (the 8B-shaped Q4_0 file, Zen 3, 2 threads, tg32 tok/s
# alternating: one tile at a time 2.67 / 2.93, four apart 4.37 / 3.71, two 3.43 / 3.61, eight 3.67 /
# 3.62; llama.cpp 2.74 / 3.03).
APART = 4
record_rows_pass, record_rows_1 = _record_rows(ROWS), _record_rows(1)
record_rows_apart = _record_rows(1, APART)


@exact_kernel(parallel=True)
def matvec_packed(packed, n_blocks, n_parts, out, qs, d, s):
    """out[t, r] for r < 16 * n_tiles (the packed rows), every value equal to q4_0.vec_dot(row r,
    qs[t], d[t], s[t]). One activation row (the decode): tiles i, q + i, 2q + i, 3q + i together (q =
    n_tiles // APART), the rest one by one. More: the tiles split in n_parts contiguous runs (the
    caller's thread count), every tile taken straight from its records by ROWS activation rows
    at a time. (Through legacy_tiles' scratch instead, unpacked once per tile: no faster at any T
    measured, 8 to 64.)"""
    n_rows = qs.shape[0]
    n_tiles = packed.shape[0] // n_blocks
    starts = np.empty((n_rows, n_blocks), dtype=np.int32)
    zero_starts(s, ZERO, starts)
    if n_rows == 1:
        q = n_tiles // APART
        for i in prange(q):
            record_rows_apart(packed, n_blocks, i, q, qs, d, starts, out, 0)
        for tile in prange(APART * q, n_tiles):
            record_rows_1(packed, n_blocks, tile, 0, qs, d, starts, out, 0)
        return
    n_parts = max(1, min(n_parts, n_tiles))
    for part in prange(n_parts):
        for tile in range(part * n_tiles // n_parts, (part + 1) * n_tiles // n_parts):
            for group in range(n_rows // ROWS):
                record_rows_pass(packed, n_blocks, tile, 0, qs, d, starts, out, group * ROWS)
            for t in range(n_rows - n_rows % ROWS, n_rows):
                record_rows_1(packed, n_blocks, tile, 0, qs, d, starts, out, t)
