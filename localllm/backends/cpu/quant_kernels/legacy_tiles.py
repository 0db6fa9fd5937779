"""Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL batched products with 16 weight rows as vector lanes (prefill, on
AVX-512 VNNI and, as two halves of 8 rows, AVX2 targets), each result equal to the type's vec_dot bit for
bit.

vec_dot's float order (VectorCode.row_sum) is not one scalar step per block: it keeps eight float lanes
across the blocks. Per block, lane j of an <8 x i32> holds the four products of quad j (bytes 4j..4j+3;
lane 0 starts from the zero correction -zero * asum), and the step is acc8 = fma(float(ints8), d * ad,
acc8), or acc8 + fma(float(ints8), d * ad, [m * ad * asum, 0, ...]) for the types with a minimum
(FloatSums._accumulate); at the end the eight lanes are summed by halving (float_sum). Here, with the
16 rows of a tile as the lanes of a 512-bit vector, the vpdpbusd of the tile's quad j against the
activation's quad j (broadcast) is exactly lane j of ints8 for 16 rows at once, so each activation row
keeps eight <16 x float> accumulators, one per quad, takes the same operations per block, and sums them
in float_sum's order: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).

Loop order: a tile is unpacked once for all K (tile[8b + j, 4i : 4i + 4] = row i's quants 4j..4j+3 of
block b, K * 16 bytes: L1 or L2 sized for the model's K), its scales (and minima) as float32[nb, 16];
then ROWS activation rows at a time stream over every block with their 8 * ROWS accumulators in
registers. Q8_0's signed quants are stored as unsigned q + 128 (vpdpbusd multiplies unsigned by signed
bytes), so lane j starts from -128 times the activation's quad j sum: |start| <= 128 * 4 * 127 and the
lane ends at exactly vec_dot's integer. IQ4_NL's looked-up levels (-127..113) are stored the same way.
On AVX2 (vpmaddubsw, which saturates where vpdpbusd does not) those two types' quants stay signed and
the activation's magnitudes take their place as the unsigned operand (SIGNED_BY_ACTIVATION).

Q4_0 and IQ4_NL are not in that order: their vec_dot sums each block in integers and takes one float
step per block (legacy.block_terms_kernel's block_sums, llama.cpp's re-laid order), and their tiles go
through tile_sums.py with one accumulator per row (sum_rows_*, level_rows_*).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ....jit import exact_kernel, read_f16
from ....quant.iq4_nl import KVALUES as IQ4_NL_LEVELS
from .legacy import _nibbles, _with_fifth_bits, level_nibbles
from .q4_k_tiles import TILE, _dot_quads_512, _transpose16
from .tile_sums import QUADS, emit_block_sums  # QUADS: vpdpbusd steps per block, one per float accumulator
from .vector import VectorCode, _target_has_avx2

BLOCK = 32
ROWS = 2  # activation rows per pass over the tile (16 accumulators in registers)
# Fewer activation rows: the pair (Q4_0, Q5_0, Q8_0) or grid kernels (Q4_1, Q5_1). Crossovers on Gemma 3
# 270M's layer shapes, one thread, a session script (best of 21 alternating passes, pairs or grid time /
# tiles time): Q4_0 T = 16 / 32 / 64: 0.89 / 1.07 / 1.31, Q5_0 T = 16 / 32: 0.86 / 1.13; Q8_0 T = 32 /
# 48 / 64: 0.80 / 0.81 / 1.06 (its pair kernels unpack nothing and its tiles add a start per lane);
# Q4_1 T = 4 / 8: 1.41 / 2.35, Q5_1: 0.76 / 1.27; IQ4_NL (2026-11-26, Intel machine, best of 15, pairs /
# tiles, 2048 x 640 and 640 x 2048) T = 8 / 16 / 32: 1.01-1.09 / 1.17-1.43 / 1.19-1.47 (its pair kernels
# look each block's levels up again per call, where the tiles unpack once).
MIN_ROWS = {"Q4_0": 32, "Q5_0": 32, "Q8_0": 64, "Q4_1": 8, "Q5_1": 8, "IQ4_NL": 8}
# On AVX2 targets (each activation row takes a tile as two halves: emit_rows), from these rows; None:
# never, the row kernels. Gemma 3 270M's 2048 x 640 and 640 x 2048, one Zen 4 thread compiled for
# Haswell, median of 7 calls, tiles / row kernels (GMAC/s), T = 8 / 16 / 32: Q4_0 36/35, 32/38 /
# 48/36, 40/39 / 36/35, 31/25; Q5_0 37/32, 33/34 / 47/31, 40/32 / 55/31, 44/33; Q4_1 26/28, 24/30 /
# 38/29, 32/30 / 44/28, 37/29; Q5_1 20/16, 17/16 / 37/22, 32/22 / 45/21, 36/22. Q8_0 and IQ4_NL
# (signed quants), first with |q| and its sign taken per quad: tiles / rows 0.74-0.97 at T = 8 and 16,
# 0.79-1.16 at 32 and 64, 1.02-1.19 at 256; then SIGNED_BY_ACTIVATION (the same runs, GMAC/s), T = 16 /
# 32 / 64 / 256: Q8_0 38/28, 35/29 / 42/37, 38/39 / 45/37, 41/39 / 45/36, 41/37 (the tiles 36/36 at
# 256 before); IQ4_NL 36/34, 35/36 / 42/34, 39/37 / 44/35, 40/36 / 47/34, 42/36 (39/40 before).
NARROW_MIN_ROWS = {"Q4_0": 16, "Q5_0": 16, "Q4_1": 16, "Q5_1": 16, "Q8_0": 32, "IQ4_NL": 32}


# ----- the types: where their quants lie, as an unpacking of one block to <32 x i8> in element order -----


def _four_bit(qs_offset: int):
    def quants(v: VectorCode, row, base):
        return _nibbles(v, None, row, v.offset(base, qs_offset))

    return quants


def _five_bit(qh_offset: int, qs_offset: int):
    def quants(v: VectorCode, row, base):
        low = _nibbles(v, None, row, v.offset(base, qs_offset))
        return _with_fifth_bits(v, low, None, row, v.offset(base, qh_offset))

    return quants


def wide(v: VectorCode) -> bool:
    """Whether this compile's tiles run as 512-bit vectors with vpdpbusd (AVX-512 VNNI): then the signed
    quants of the QUAD_OFFSET types are stored as q + 128 (vpdpbusd multiplies unsigned by signed
    bytes). Elsewhere each activation row takes a tile as two halves of 8 rows (emit_rows) and those
    quants stay signed (vpmaddubsw would saturate on 255 x 127 pairs): SIGNED_BY_ACTIVATION."""
    return v.avx512_vnni


def _offset_bytes(v: VectorCode, quants):
    """Signed quants as QUAD_OFFSET tiles hold them: q + 128 (the sign bit flipped) where wide(v)."""
    return v.builder.xor(quants, v.constant(0x80, BLOCK, 8)) if wide(v) else quants


def _eight_bit_offset(v: VectorCode, row, base):
    """Q8_0's signed quants, as _offset_bytes stores them."""
    return _offset_bytes(v, v.load(None, row, v.offset(base, 2), BLOCK))


_nl_levels = level_nibbles([int(level) for level in IQ4_NL_LEVELS])


def _level_offset(v: VectorCode, row, base):
    """IQ4_NL's signed levels (-127..113), as _offset_bytes stores them (as Q8_0's quants)."""
    return _offset_bytes(v, _nl_levels(v, row, v.offset(base, 2)))


# ----- unpacking a tile -----


def _unpacker(block_bytes: int, quants):
    """An intrinsic unpack(weights, r0, n_blocks, tile): blocks 0..n_blocks-1 of weight rows r0..r0+15
    into tile uint8[>= 8 * n_blocks (even), 64], two blocks at a time (16 rows x 16 dwords, transposed)."""

    @intrinsic
    def unpack(typingctx, weights, r0, n_blocks, tile):
        sig = types.void(weights, r0, n_blocks, tile)

        def codegen(context, builder, signature, args):
            weights_, r0_, n_blocks_, tile_ = args
            v = VectorCode(context, builder)
            i64 = ir.IntType(64)
            r0_, n_blocks_ = v.resize(r0_, 64), v.resize(n_blocks_, 64)
            rows = [v.row_pointer(signature.args[0], weights_, v.offset(r0_, i)) for i in range(TILE)]
            tile_data = v._data(signature.args[3], tile_)

            def block_pair(first, with_second: bool):
                """Blocks first and first + 1 (zeros for a missing second) -> tile rows 8 * first + m."""
                lanes = []
                for row in rows:
                    low = quants(v, row, builder.mul(first, i64(block_bytes)))
                    high = quants(v, row, builder.mul(v.offset(first, 1), i64(block_bytes))) if with_second else v.constant(0, BLOCK, 8)
                    lanes.append(v.bitcast(v.join(low, high), 16, 32))
                at = builder.mul(first, i64(QUADS * 64))
                for m, vec in enumerate(_transpose16(v, lanes)[: 2 * QUADS if with_second else QUADS]):
                    pointer = builder.gep(tile_data, [v.offset(at, 64 * m)])
                    builder.store(vec, builder.bitcast(pointer, vec.type.as_pointer()), align=1)

            with cgutils.for_range(builder, builder.udiv(n_blocks_, i64(2))) as loop:
                block_pair(builder.mul(loop.index, i64(2)), True)
            odd = builder.icmp_unsigned("!=", builder.urem(n_blocks_, i64(2)), i64(0))
            with builder.if_then(odd):
                block_pair(builder.sub(n_blocks_, i64(1)), False)
            return context.get_dummy_value()

        return sig, codegen

    return unpack


@exact_kernel
def f16_columns(weights, r0, block_bytes, offset, out):
    """out float32[nb, 16]: the float16 field at `offset` of block b of weight row r0 + i in out[b, i]."""
    for b in range(out.shape[0]):
        for i in range(TILE):
            out[b, i] = read_f16(weights[r0 + i], b * block_bytes + offset)


@exact_kernel
def zero_starts(s, zero, out):
    """out int32[T, nb]: lane 0's start of each block, -zero * (the activation's block sum)."""
    for t in range(s.shape[0]):
        for b in range(s.shape[1]):
            out[t, b] = -zero * s[t, b]


@exact_kernel
def quad_starts(qs, out):
    """out int32[T, K / 4]: lane j's start of each block for Q8_0's q + 128, -128 * (quad j's sum)."""
    for t in range(qs.shape[0]):
        for q in range(out.shape[1]):
            total = np.int32(0)
            for k in range(4):
                total += np.int32(qs[t, 4 * q + k])
            out[t, q] = -128 * total


# ----- the products: ROWS activation rows against a tile over every block -----

ZERO_POINT, MINIMUM, QUAD_OFFSET = "zero point", "minimum", "quad offset"  # how a type's lanes start
# The QUAD_OFFSET types' signed quants on narrow targets, the other way round: |a| (the activation's
# magnitudes, computed once per call) times q with a's sign, where dot_quads_signed takes |q| and moves
# q's sign onto a at every read of the tile: one operation fewer per quad (NARROW_MIN_ROWS has the
# figures). vpmaddubsw's signed operand is then q: exact unless q is -128, which llama.cpp never writes
# (round(x / d) with d = amax / 127) but a file may hold: the Q8_0 driver checks each tile (holds_byte).
SIGNED_BY_ACTIVATION = "signed by the activation"


def _rows_kernel(kind: str, n_rows: int, block_sums: bool = False):
    """An intrinsic tile_rows(tile, scales, mins, aqs, ad, ints, out, r0, t): out[t + u, r0 : r0 + 16]
    for u < n_rows, each lane vec_dot's value for its weight row. ints: the starts (ZERO_POINT:
    int32[T, nb]; QUAD_OFFSET: int32[T, K / 4]; SIGNED_BY_ACTIVATION: the activation's magnitudes
    int8[T, K], narrow targets only) or, for MINIMUM, the activation's block sums
    int32[T, nb] (mins float32[nb, 16] then holds the minima; otherwise unused). block_sums: the
    block-sums order (tile_sums.py), for a ZERO_POINT type of 4-bit quants (Q4_0) or IQ4_NL's levels
    (SIGNED_BY_ACTIVATION: ints on wide targets the starts of its q + 128, -128 * asum, int32[T, nb];
    elsewhere the activation's magnitudes as quads, int32[T, K / 4])."""

    @intrinsic
    def tile_rows(typingctx, tile, scales, mins, aqs, ad, ints, out, r0, t):
        sig = types.void(tile, scales, mins, aqs, ad, ints, out, r0, t)

        def codegen(context, builder, signature, args):
            tile_, scales_, mins_, aqs_, ad_, ints_, out_, r0_, t_ = args
            st = signature.args
            v = VectorCode(context, builder)
            i64 = ir.IntType(64)

            def block_vectors(b):
                quads = [v.load(st[0], tile_, builder.mul(v.offset(builder.mul(b, i64(QUADS)), j), i64(64)), 64) for j in range(QUADS)]
                d_vec = v.load(st[1], scales_, builder.mul(b, i64(16)), 16)
                m_vec = v.load(st[2], mins_, builder.mul(b, i64(16)), 16) if kind == MINIMUM else None
                return quads, d_vec, m_vec

            n_blocks = cgutils.unpack_tuple(builder, context.make_array(st[1])(context, builder, scales_).shape)[0]
            acts = [(st[3], aqs_), (st[4], ad_), (st[5], ints_)]
            if block_sums:
                source = (lambda b: block_vectors(b)[:2], r0_)
                emit_block_sums(v, [source], n_rows, n_blocks, acts, (st[6], out_), t_, signed=kind == SIGNED_BY_ACTIVATION)
            else:
                emit_rows(v, kind, n_rows, n_blocks, block_vectors, acts, (st[6], out_), r0_, t_)
            return context.get_dummy_value()

        return sig, codegen

    return tile_rows


def emit_rows(v: VectorCode, kind: str, n_rows: int, n_blocks, block_vectors, acts, out, r0, t):
    """The products of activation rows t..t+n_rows-1 with a tile over every block, into out[t + u, r0 :
    r0 + 16]. block_vectors(b) gives block b's (eight <64 x i8> quad vectors, <16 x float> scales,
    <16 x float> minima or None); acts: (type, value) of aqs, ad and the ints of _rows_kernel; out:
    (type, value). Each row keeps eight accumulators, one per lane of vec_dot's eight: <16 x float>,
    all rows in one loop over the blocks where wide(v); elsewhere (AVX2) one loop per row and half of
    the tile (rows r0..r0+7, then r0+8..r0+15), eight <8 x float> (16 of 16 lanes spill the 16 ymm
    registers), except for a single row of the unsigned kinds, which takes both halves HALF_CHUNK
    blocks at a time so that the tile is read once. Lane j of a
    quad's dot is the same integer either way and the float steps the same operations, so every output
    has vec_dot's bits on every target."""
    t, r0 = v.resize(t, 64), v.resize(r0, 64)
    act_rows = [[v.row_pointer(array_type, array, v.offset(t, u)) for array_type, array in acts] for u in range(n_rows)]
    if wide(v):
        _emit_pass(v, kind, list(range(n_rows)), range(16), n_blocks, block_vectors, act_rows, out, r0, t)
    elif n_rows == 1 and kind in (ZERO_POINT, MINIMUM) and v.avx2:
        _emit_halves_by_chunks(v, kind, n_blocks, block_vectors, act_rows, out, r0, t)
    else:
        for u in range(n_rows):
            for h in range(2):
                _emit_pass(v, kind, [u], range(8 * h, 8 * h + 8), n_blocks, block_vectors, act_rows, out, r0, t)


# Blocks a half of the tile takes before the other half takes the same ones (from L1). Against all 16
# lanes in one loop (accumulators spilled), measured when the re-laid Q4_0 took this path (before its
# block sums): the 8B-shaped Q4_0, one row, compiled for Haswell,
# one Zen 4 thread, three alternating runs: in cache 24.2-25.5 -> 26.1-26.3 GB/s; from memory no change
# measurable (two threads 33.2-33.4 / 28.8-33.8: the memory's speed).
HALF_CHUNK = 8


def _emit_halves_by_chunks(v: VectorCode, kind: str, n_blocks, block_vectors, act_rows, out, r0, t):
    """One activation row on AVX2: both halves of the tile over HALF_CHUNK blocks at a time, so that a
    tile's blocks come from memory once and each half's eight <8 x float> accumulators stay in registers
    through its inner loop (all 16 lanes in one loop spill them: 16 ymm registers)."""
    builder = v.builder
    i64 = ir.IntType(64)
    halves = [range(0, 8), range(8, 16)]
    accs = [_zero_accumulators(v, 8) for _ in halves]
    n_blocks = v.resize(n_blocks, 64)
    n_chunks = builder.udiv(builder.add(n_blocks, i64(HALF_CHUNK - 1)), i64(HALF_CHUNK))
    with cgutils.for_range(builder, n_chunks) as chunks:
        start = builder.mul(chunks.index, i64(HALF_CHUNK))
        stop = builder.select(builder.icmp_unsigned("<", builder.add(start, i64(HALF_CHUNK)), n_blocks),
                              builder.add(start, i64(HALF_CHUNK)), n_blocks)
        for h, lanes in enumerate(halves):
            _emit_blocks(v, kind, [0], lanes, start, stop, block_vectors, act_rows, {0: accs[h]})
    for h, lanes in enumerate(halves):
        _store_sums(v, {0: accs[h]}, [0], lanes, out, r0, t)


def _zero_accumulators(v: VectorCode, width: int):
    zeros = ir.Constant(ir.VectorType(ir.FloatType(), width), [0.0] * width)
    return [cgutils.alloca_once_value(v.builder, zeros) for _ in range(QUADS)]


def _emit_pass(v: VectorCode, kind: str, rows, lanes, n_blocks, block_vectors, act_rows, out, r0, t):
    """One loop over the blocks: activation rows t + u (u in rows) against the tile's weight rows
    r0 + i (i in lanes: all 16, or a half of 8 taken from the 64-byte quad vectors)."""
    accs = {u: _zero_accumulators(v, len(lanes)) for u in rows}
    n_blocks = v.resize(n_blocks, 64)
    _emit_blocks(v, kind, rows, lanes, ir.Constant(n_blocks.type, 0), n_blocks, block_vectors, act_rows, accs)
    _store_sums(v, accs, rows, lanes, out, r0, t)


def _emit_blocks(v: VectorCode, kind: str, rows, lanes, start, stop, block_vectors, act_rows, accs):
    """Blocks start..stop-1 into accs[u] (eight <len(lanes) x float> allocas per activation row u)."""
    builder = v.builder
    i64 = ir.IntType(64)
    width = len(lanes)
    floats = ir.VectorType(ir.FloatType(), width)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(floats, [floats] * 3), f"llvm.fma.v{width}f32")
    zeros = ir.Constant(floats, [0.0] * width)

    def part(vec):  # the lanes of this pass from a 16-lane vector
        return vec if width == 16 else v.shuffle(vec, lanes)

    with cgutils.for_range(builder, builder.sub(stop, start)) as loop:
        b = builder.add(loop.index, start)
        quads, d_vec, m_vec = block_vectors(b)
        for u in rows:
            qs_row, ad_row, ints_row = act_rows[u]
            ad_splat = v.splat(builder.load(builder.gep(ad_row, [b])), width)
            scale = builder.fmul(part(d_vec), ad_splat, flags=v.PINNED)
            extra = None
            if kind == MINIMUM:  # lane 0's m * ad * asum, as legacy.block_terms computes it
                asum = builder.sitofp(builder.load(builder.gep(ints_row, [b])), ir.FloatType())
                extra = builder.fmul(builder.fmul(part(m_vec), ad_splat, flags=v.PINNED), v.splat(asum, width), flags=v.PINNED)
            for j in range(QUADS):
                word = builder.load(builder.bitcast(builder.gep(qs_row, [v.offset(builder.mul(b, i64(BLOCK)), 4 * j)]), ir.IntType(32).as_pointer()), align=1)
                ints = _quad_dots(v, kind, quads[j], lanes, word, ints_row, b, j)
                values = builder.sitofp(ints, floats)
                acc = builder.load(accs[u][j])
                if kind == MINIMUM:  # acc + fma(values, scale, [extra, 0, ...]): lane j's share
                    step = builder.call(fma, [values, scale, extra if j == 0 else zeros])
                    builder.store(builder.fadd(acc, step, flags=v.PINNED), accs[u][j])
                else:
                    builder.store(builder.call(fma, [values, scale, acc]), accs[u][j])


def _store_sums(v: VectorCode, accs, rows, lanes, out, r0, t):
    """out[t + u, r0 + lanes] = the halving sum of row u's eight accumulators."""
    builder = v.builder
    floats = ir.VectorType(ir.FloatType(), len(lanes))
    for u in rows:
        total = _float_sum_lanes(v, [builder.load(pointer) for pointer in accs[u]])
        out_row = v.row_pointer(out[0], out[1], v.offset(t, u))
        first = builder.add(r0, ir.IntType(64)(lanes[0]))
        builder.store(total, builder.bitcast(builder.gep(out_row, [first]), floats.as_pointer()), align=4)


def _quad_dots(v: VectorCode, kind: str, quads, lanes, word, ints_row, b, j: int):
    """<len(lanes) x i32>: the weight rows' (lanes') quad j of block b dotted with the activation's four
    bytes (`word`), plus the lane's start. All 16 lanes: one vpdpbusd on the tile's bytes as stored
    (QUAD_OFFSET quants as q + 128). 8 lanes: dot_quads on their 32 bytes (vpmaddubsw + vpmaddwd on
    AVX2), the QUAD_OFFSET quants signed (wide(v) false) through dot_quads_signed, with no start."""
    width = len(lanes)
    if width == 16:
        return _dot_quads_512(v, _lane_start(v, kind, ints_row, b, j), quads, v.bitcast(v.splat(word, 16), 64, 8))
    weights = v.shuffle(quads, range(4 * lanes[0], 4 * lanes[0] + 4 * width))
    act = v.bitcast(v.splat(word, width), 4 * width, 8)
    if kind == QUAD_OFFSET:
        return v.dot_quads_signed(weights, act)
    if kind == SIGNED_BY_ACTIVATION:  # |a| (from ints_row) times q with a's sign
        at = v.offset(v.builder.mul(b, ir.Constant(b.type, BLOCK)), 4 * j)
        magnitude_word = v.builder.load(v.builder.bitcast(v.builder.gep(ints_row, [at]), ir.IntType(32).as_pointer()), align=1)
        return v.dot_quads_signed(act, weights, magnitude=v.bitcast(v.splat(magnitude_word, width), 4 * width, 8))
    return v.dot_quads(weights, act, _lane_start(v, kind, ints_row, b, j, width))


def _lane_start(v: VectorCode, kind: str, ints_row, b, j: int, lanes: int = 16):
    """The int32 start of quad j's lane of block b (broadcast to `lanes` rows), or None for zero."""
    builder = v.builder
    if kind == ZERO_POINT and j == 0:
        return v.splat(builder.load(builder.gep(ints_row, [b])), lanes)
    if kind == QUAD_OFFSET:
        return v.splat(builder.load(builder.gep(ints_row, [v.offset(builder.mul(b, ir.Constant(b.type, QUADS)), j)])), lanes)
    return None


def _float_sum_lanes(v: VectorCode, accs):
    """FloatSums.float_sum's halving over eight accumulators (each a <16 x float>, one per lane of
    vec_dot's eight): (a0 + a4, a1 + a5, a2 + a6, a3 + a7), then pairs 2 apart, then the last two."""
    while len(accs) > 1:
        half = len(accs) // 2
        accs = [v.builder.fadd(accs[k], accs[k + half], flags=v.PINNED) for k in range(half)]
    return accs[0]


zero_rows_2, zero_rows_1 = _rows_kernel(ZERO_POINT, ROWS), _rows_kernel(ZERO_POINT, 1)
sum_rows_2, sum_rows_1 = _rows_kernel(ZERO_POINT, ROWS, block_sums=True), _rows_kernel(ZERO_POINT, 1, block_sums=True)
min_rows_2, min_rows_1 = _rows_kernel(MINIMUM, ROWS), _rows_kernel(MINIMUM, 1)
quad_rows_2, quad_rows_1 = _rows_kernel(QUAD_OFFSET, ROWS), _rows_kernel(QUAD_OFFSET, 1)
signed_rows_2, signed_rows_1 = _rows_kernel(SIGNED_BY_ACTIVATION, ROWS), _rows_kernel(SIGNED_BY_ACTIVATION, 1)
level_rows_2, level_rows_1 = _rows_kernel(SIGNED_BY_ACTIVATION, ROWS, True), _rows_kernel(SIGNED_BY_ACTIVATION, 1, True)

unpack_q4_0 = _unpacker(18, _four_bit(2))
unpack_q4_1 = _unpacker(20, _four_bit(4))
unpack_q5_0 = _unpacker(22, _five_bit(2, 6))
unpack_q5_1 = _unpacker(24, _five_bit(4, 8))
unpack_q8_0 = _unpacker(34, _eight_bit_offset)
unpack_iq4_nl = _unpacker(18, _level_offset)


def available() -> bool:
    """Where these tiles are fast: the targets of q4_k_tiles (AVX-512 VNNI with BW)."""
    from .q4_k_tiles import available as q4_k_tiles_available

    return q4_k_tiles_available()


@intrinsic
def tiles_are_wide(typingctx):
    """wide(v) for this compile, as a constant the drivers branch on."""

    def codegen(context, builder, signature, args):
        return ir.Constant(ir.IntType(1), int(wide(VectorCode(context, builder))))

    return types.boolean(), codegen


def narrow_available() -> bool:
    """Whether the compile target has AVX2 (emit_rows' halves, for the types of NARROW_MIN_ROWS)."""
    from numba.core.registry import cpu_target

    return _target_has_avx2(cpu_target.target_context)


# ----- the drivers, one per type (each calls its intrinsics itself: a driver compiled anew compiles them
# anew, for the instruction set of that moment). Each: out[t, r] for the first N - N % 16 weight rows (16
# at a time, in parallel), every value equal to the type's vec_dot(weights[r], qs[t], d[t], s[t]). -----


@exact_kernel
def tile_scratch(n_blocks):
    """A tile's quants (uint8[8 * nb rounded up to even blocks, 64]), scales and minima (float32[nb, 16])."""
    tile = np.empty((QUADS * (n_blocks + n_blocks % 2), 64), dtype=np.uint8)
    return tile, np.empty((n_blocks, TILE), dtype=np.float32), np.empty((n_blocks, TILE), dtype=np.float32)


@exact_kernel(parallel=True)
def q4_0_tiles(weights, out, qs, d, s):
    n_rows, n_blocks = d.shape
    starts = np.empty((n_rows, n_blocks), dtype=np.int32)
    zero_starts(s, 8, starts)
    for tile_index in prange(weights.shape[0] // TILE):
        tile, scales, mins = tile_scratch(n_blocks)
        unpack_q4_0(weights, tile_index * TILE, n_blocks, tile)
        f16_columns(weights, tile_index * TILE, 18, 0, scales)
        for pair in range(n_rows // ROWS):
            sum_rows_2(tile, scales, mins, qs, d, starts, out, tile_index * TILE, pair * ROWS)
        for t in range(n_rows - n_rows % ROWS, n_rows):
            sum_rows_1(tile, scales, mins, qs, d, starts, out, tile_index * TILE, t)


@exact_kernel(parallel=True)
def q5_0_tiles(weights, out, qs, d, s):
    n_rows, n_blocks = d.shape
    starts = np.empty((n_rows, n_blocks), dtype=np.int32)
    zero_starts(s, 16, starts)
    for tile_index in prange(weights.shape[0] // TILE):
        tile, scales, mins = tile_scratch(n_blocks)
        unpack_q5_0(weights, tile_index * TILE, n_blocks, tile)
        f16_columns(weights, tile_index * TILE, 22, 0, scales)
        for pair in range(n_rows // ROWS):
            zero_rows_2(tile, scales, mins, qs, d, starts, out, tile_index * TILE, pair * ROWS)
        for t in range(n_rows - n_rows % ROWS, n_rows):
            zero_rows_1(tile, scales, mins, qs, d, starts, out, tile_index * TILE, t)


@exact_kernel(parallel=True)
def q4_1_tiles(weights, out, qs, d, s):
    n_rows, n_blocks = d.shape
    for tile_index in prange(weights.shape[0] // TILE):
        tile, scales, mins = tile_scratch(n_blocks)
        unpack_q4_1(weights, tile_index * TILE, n_blocks, tile)
        f16_columns(weights, tile_index * TILE, 20, 0, scales)
        f16_columns(weights, tile_index * TILE, 20, 2, mins)
        for pair in range(n_rows // ROWS):
            min_rows_2(tile, scales, mins, qs, d, s, out, tile_index * TILE, pair * ROWS)
        for t in range(n_rows - n_rows % ROWS, n_rows):
            min_rows_1(tile, scales, mins, qs, d, s, out, tile_index * TILE, t)


@exact_kernel(parallel=True)
def q5_1_tiles(weights, out, qs, d, s):
    n_rows, n_blocks = d.shape
    for tile_index in prange(weights.shape[0] // TILE):
        tile, scales, mins = tile_scratch(n_blocks)
        unpack_q5_1(weights, tile_index * TILE, n_blocks, tile)
        f16_columns(weights, tile_index * TILE, 24, 0, scales)
        f16_columns(weights, tile_index * TILE, 24, 2, mins)
        for pair in range(n_rows // ROWS):
            min_rows_2(tile, scales, mins, qs, d, s, out, tile_index * TILE, pair * ROWS)
        for t in range(n_rows - n_rows % ROWS, n_rows):
            min_rows_1(tile, scales, mins, qs, d, s, out, tile_index * TILE, t)


@exact_kernel
def holds_byte(tile, n_blocks, value):
    """Whether the tile's quants of n_blocks blocks hold the byte `value` anywhere: a count over the flat
    tile without an early exit, which LLVM vectorises (measured ~2.5 us for K = 2048, a 32 KB tile,
    where its products at T = 256 take ~190 us; a two-level loop or-ing booleans took ~7)."""
    flat = tile.ravel()
    found = np.int32(0)
    for i in range(QUADS * n_blocks * 64):
        found += np.int32(flat[i] == value)
    return found != 0


@exact_kernel
def quad_activation_terms(qs, n_blocks, wide_tiles):
    """(starts, magnitudes) of the QUAD_OFFSET drivers: on wide targets the lanes' starts (quad_starts)
    and qs as a placeholder, elsewhere a placeholder and |qs| (SIGNED_BY_ACTIVATION)."""
    if wide_tiles:
        starts = np.empty((qs.shape[0], n_blocks * QUADS), dtype=np.int32)
        quad_starts(qs, starts)
        return starts, qs
    return np.empty((1, 1), dtype=np.int32), np.abs(qs)


@exact_kernel(parallel=True)
def q8_0_tiles(weights, out, qs, d, s):
    n_rows, n_blocks = d.shape
    wide_tiles = tiles_are_wide()
    starts, magnitudes = quad_activation_terms(qs, n_blocks, wide_tiles)
    for tile_index in prange(weights.shape[0] // TILE):
        tile, scales, mins = tile_scratch(n_blocks)
        unpack_q8_0(weights, tile_index * TILE, n_blocks, tile)
        f16_columns(weights, tile_index * TILE, 34, 0, scales)
        by_activation = not wide_tiles and not holds_byte(tile, n_blocks, 0x80)  # no quant of -128
        for pair in range(n_rows // ROWS):
            if by_activation:
                signed_rows_2(tile, scales, mins, qs, d, magnitudes, out, tile_index * TILE, pair * ROWS)
            else:
                quad_rows_2(tile, scales, mins, qs, d, starts, out, tile_index * TILE, pair * ROWS)
        for t in range(n_rows - n_rows % ROWS, n_rows):
            if by_activation:
                signed_rows_1(tile, scales, mins, qs, d, magnitudes, out, tile_index * TILE, t)
            else:
                quad_rows_1(tile, scales, mins, qs, d, starts, out, tile_index * TILE, t)


@exact_kernel
def level_activation_terms(s, qs, wide_tiles):
    """The ints of IQ4_NL's tiles: on wide targets each block's start -128 * asum (its levels stored as
    q + 128), int32[T, nb]; elsewhere |qs| as int32[T, K / 4], one word a quad (SIGNED_BY_ACTIVATION)."""
    if wide_tiles:
        starts = np.empty(s.shape, dtype=np.int32)
        zero_starts(s, 128, starts)
        return starts
    return np.abs(qs).view(np.int32)


@exact_kernel(parallel=True)
def iq4_nl_tiles(weights, out, qs, d, s):
    n_rows, n_blocks = d.shape
    ints = level_activation_terms(s, qs, tiles_are_wide())
    for tile_index in prange(weights.shape[0] // TILE):
        tile, scales, mins = tile_scratch(n_blocks)
        unpack_iq4_nl(weights, tile_index * TILE, n_blocks, tile)
        f16_columns(weights, tile_index * TILE, 18, 0, scales)
        for pair in range(n_rows // ROWS):  # IQ4_NL's levels are -127..113: never -128
            level_rows_2(tile, scales, mins, qs, d, ints, out, tile_index * TILE, pair * ROWS)
        for t in range(n_rows - n_rows % ROWS, n_rows):
            level_rows_1(tile, scales, mins, qs, d, ints, out, tile_index * TILE, t)
