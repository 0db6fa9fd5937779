"""IQ4_NL weights re-laid 16 rows at a time, for products with the weight rows as vector lanes at any
number of activation rows (decode included), on AVX-512 VNNI and AVX2 targets.

An IQ4_NL block is laid out as Q4_0's (float16 d, then 16 bytes of nibbles, element j in the low nibble
of byte j and element j + 16 in its high nibble), so its records are q4_0_x16's, made by the same pack;
only the nibbles stand for levels (quant.iq4_nl.KVALUES, -127..113) instead of q - 8. The products look
each quad of nibbles up (one vpshufb) and take tile_sums.py's signed block sums: on AVX-512 VNNI the
levels + 128 from the start -128 * asum (legacy_tiles.level_activation_terms), elsewhere the signed
levels against the activation's magnitudes. One float step per block and row, iq4_nl.vec_dot's
block-sums order, so every output equals vec_dot's bit for bit at every number of activation rows; the
decode reads q4_0_x16.APART tiles a quarter of the matrix apart in the same loop steps. From
UNPACK_ROWS activation rows each tile's records are looked up once into legacy_tiles' scratch tile and
multiplied there (legacy_tiles.level_rows_*): straight from the records every row would look the
levels up again.
"""

from __future__ import annotations

from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ....jit import exact_kernel
from .iq4_tiles import SIGNED_TABLE, UNSIGNED_TABLE
from .legacy_tiles import QUADS, ROWS, TILE, level_activation_terms, level_rows_1, level_rows_2, tile_scratch, tiles_are_wide
from .q4_0_x16 import APART, _record_pointer, _record_rows, _record_vectors
from .q4_0_x16 import pack as q4_0_pack
from .vector import VectorCode

# From this many activation rows a tile is looked up once into a scratch tile. Gemma 3 270M's 2048 x 640
# and 640 x 2048 in cache, two Zen 3 threads, median of 9 (GMAC/s, noisy): from the records T = 2 / 3
# 11.2-12.5 / 8.2-14.2, through the scratch T = 2 / 3 / 4 5.7-10.2 / 10.7-17.0 / 18.1-19.7.
UNPACK_ROWS = 4


pack = q4_0_pack  # an IQ4_NL block is laid out as a Q4_0 block: the same records


def _levels(v):
    """The 16 levels as the products take them: + 128 (unsigned bytes) under vpdpbusd, else signed."""
    return UNSIGNED_TABLE if v.avx512_vnni else SIGNED_TABLE


record_rows_pass, record_rows_1 = _record_rows(ROWS, levels=_levels), _record_rows(1, levels=_levels)
record_rows_apart = _record_rows(1, APART, levels=_levels)


@intrinsic
def unpack_tile(typingctx, packed, n_blocks, tile, quads, scales):
    """Records tile * nb .. tile * nb + nb - 1 into legacy_tiles' scratch: quads[8b + j] the 16 rows'
    quad j of block b as the products take them (_levels), scales[b] their d as float32."""
    sig = types.void(packed, n_blocks, tile, quads, scales)

    def codegen(context, builder, signature, args):
        packed_, n_blocks_, tile_, quads_, scales_ = args
        st = signature.args
        v = VectorCode(context, builder)
        i64 = ir.IntType(64)
        quad_data, scale_data = v._data(st[3], quads_), v._data(st[4], scales_)
        with cgutils.for_range(builder, v.resize(n_blocks_, 64)) as loop:
            b = loop.index
            record = _record_pointer(v, st[0], packed_, n_blocks_, tile_, b)
            block_quads, d = _record_vectors(v, record, _levels(v))
            for j, quad in enumerate(block_quads):
                at = builder.mul(v.offset(builder.mul(b, i64(QUADS)), j), i64(64))
                builder.store(quad, builder.bitcast(builder.gep(quad_data, [at]), quad.type.as_pointer()), align=1)
            at = builder.mul(b, i64(TILE))
            builder.store(d, builder.bitcast(builder.gep(scale_data, [at]), d.type.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel(parallel=True)
def matvec_packed(packed, n_blocks, n_parts, out, qs, d, s):
    """out[t, r] for r < 16 * n_tiles (the packed rows), every value equal to iq4_nl.vec_dot(row r,
    qs[t], d[t], s[t]); below UNPACK_ROWS the tiles taken as q4_0_x16.matvec_packed takes them."""
    n_rows = qs.shape[0]
    n_tiles = packed.shape[0] // n_blocks
    ints = level_activation_terms(s, qs, tiles_are_wide())
    if n_rows == 1:
        q = n_tiles // APART
        for i in prange(q):
            record_rows_apart(packed, n_blocks, i, q, qs, d, ints, out, 0)
        for tile in prange(APART * q, n_tiles):
            record_rows_1(packed, n_blocks, tile, 0, qs, d, ints, out, 0)
        return
    if n_rows >= UNPACK_ROWS:
        for tile in prange(n_tiles):
            quads, scales, mins = tile_scratch(n_blocks)
            unpack_tile(packed, n_blocks, tile, quads, scales)
            for group in range(n_rows // ROWS):
                level_rows_2(quads, scales, mins, qs, d, ints, out, tile * TILE, group * ROWS)
            for t in range(n_rows - n_rows % ROWS, n_rows):
                level_rows_1(quads, scales, mins, qs, d, ints, out, tile * TILE, t)
        return
    n_parts = max(1, min(n_parts, n_tiles))
    for part in prange(n_parts):
        for tile in range(part * n_tiles // n_parts, (part + 1) * n_tiles // n_parts):
            for group in range(n_rows // ROWS):
                record_rows_pass(packed, n_blocks, tile, 0, qs, d, ints, out, group * ROWS)
            for t in range(n_rows - n_rows % ROWS, n_rows):
                record_rows_1(packed, n_blocks, tile, 0, qs, d, ints, out, t)
