"""Products of 16-row tiles (weight rows as vector lanes: legacy_tiles' unpacked tiles, q4_0_x16's records)
in the block-sums order of legacy.block_terms_kernel (Q4_0): per activation row and weight row one float
accumulator, acc = fma(float(block sum), d * ad[b], acc), block after block, so every output equals the
type's vec_dot bit for bit. One accumulator per row (against eight in legacy_tiles.emit_rows' quad order)
lets one loop over the blocks carry several tiles and activation rows at once: the decode reads four
tiles a part of the matrix apart in the same steps (q4_0_x16.matvec_packed), four sequential runs per
thread, which the memory serves faster than one.

The integer sum of a block, per weight row: with AVX-512 VNNI eight vpdpbusd of the 16 rows' quad j
against the activation's quad j (broadcast), chained from the start (Q4_0's zero correction -8 * asum;
IQ4_NL's levels stored as q + 128, -128 * asum). Elsewhere per half of 8 rows: for 4-bit unsigned
quants (Q4_0) vpmaddubsw per quad gives int16 pair sums (|pair| <= 2 * 15 * 127 = 3810), the eight
quads' pairs are summed in int16 (|sum| <= 30480 < 32767: exact), then one vpmaddwd by ones and the
start (a fifth bit would overflow the int16 sums); for signed quants (IQ4_NL, `signed`) each quad is
dot_quads_signed with the activation's magnitudes computed once per product (legacy_tiles'
SIGNED_BY_ACTIVATION: |a| times q with a's sign, |pair| <= 2 * 127 * 127, so widened per quad) and the
eight quads' int32 lanes are added.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .q4_k_tiles import TILE
from .vector import VectorCode

QUADS = 8  # four-byte quads per 32-element block


def emit_block_sums(v: VectorCode, sources, n_rows: int, n_blocks, acts, out, t, signed: bool = False):
    """out[t + u, r0 + i] for u < n_rows, i < 16 and every source (block_vectors, r0): block_vectors(b)
    gives block b of that tile as (eight <64 x i8> quad vectors, quad j of the 16 rows at bytes 4i..4i+3,
    unsigned 0..15, or with `signed` the levels -127..127 (+ 128 with VNNI); <16 x float> scales d), r0
    its first output column. acts: (type, value) of aqs (int8[T, K]), ad (float32[T, nb]) and starts
    (int32[T, nb]: -zero * the activation's block sum) or, with `signed` on a target without AVX-512
    VNNI, the activation's magnitudes |aqs| as quads (int32[T, K / 4]); out: (type, value) of
    float32[T, N]."""
    builder = v.builder
    i64 = ir.IntType(64)
    t = v.resize(t, 64)
    wide = v.avx512_vnni
    if signed and not wide and n_rows > 1:
        # One loop per activation row: two rows in one loop spill the 16 ymm registers (LLVM computes
        # each row's and half's sum whole, so the tile's quads wait on the stack for the other row).
        # x86 instructions a product of 8 weight rows by a quad in legacy_tiles' IQ4_NL tile, two rows /
        # one: 7.8 / 6.7; the second pass reads the tile from L1 or L2. Q4_0 keeps its rows together
        # (5.1 / 4.5 there, but from q4_0_x16's records the split unpacks the nibbles again for each
        # row: 8B-shaped Q4_0 pp128, tok/s alternating, together 7.24 / 5.46 / 6.12, split 5.44 /
        # 5.03 / 6.39).
        for u in range(n_rows):
            emit_block_sums(v, sources, 1, n_blocks, acts, out, v.offset(t, u), signed)
        return
    width = 16 if wide else 8
    halves = [range(16)] if wide else [range(0, 8), range(8, 16)]
    floats = ir.VectorType(ir.FloatType(), width)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(floats, [floats] * 3), f"llvm.fma.v{width}f32")
    zeros = ir.Constant(floats, [0.0] * width)
    accs = [[[cgutils.alloca_once_value(builder, zeros) for _ in halves] for _ in range(n_rows)] for _ in sources]
    act_rows = [[v.row_pointer(array_type, array, v.offset(t, u)) for array_type, array in acts] for u in range(n_rows)]
    with cgutils.for_range(builder, v.resize(n_blocks, 64)) as loop:
        b = loop.index
        by_magnitude = signed and not wide
        rows = [_activation_block(v, act_row, b, width, by_magnitude) for act_row in act_rows]
        for k, (block_vectors, _) in enumerate(sources):
            quads, d_vec = block_vectors(b)
            sums = _block_sums(v, quads, halves, rows, by_magnitude)
            for u, (_, _, ad_splat) in enumerate(rows):
                for h, lanes in enumerate(halves):
                    ints = sums[u][h]
                    scale = builder.fmul(d_vec if wide else v.shuffle(d_vec, lanes), ad_splat, flags=v.PINNED)
                    acc = accs[k][u][h]
                    builder.store(builder.call(fma, [builder.sitofp(ints, floats), scale, builder.load(acc)]), acc)
    for k, (_, r0) in enumerate(sources):
        for u in range(n_rows):
            out_row = v.row_pointer(out[0], out[1], v.offset(t, u))
            for h, lanes in enumerate(halves):
                first = builder.add(v.resize(r0, 64), i64(lanes[0]))
                builder.store(builder.load(accs[k][u][h]), builder.bitcast(builder.gep(out_row, [first]), floats.as_pointer()), align=4)


def _activation_block(v: VectorCode, act_row, b, width: int, by_magnitude: bool):
    """Block b of one activation row: word(j), its quad j broadcast to `width` lanes (<4 * width x i8>),
    its start (by_magnitude: the same function for its magnitudes instead) and its scale ad[b] on
    `width` lanes."""
    builder = v.builder
    qs_row, ad_row, ints_row = act_row

    def quad_words(row, per_quad: int):  # row: an element pointer, per_quad elements a quad
        # Each broadcast emitted at its use: all sixteen up front, LLVM kept them and spilled (IQ4_NL's
        # one-row AVX2 tile loop 128 x86 instructions for 16 quad products, 106 this way).
        def word(j: int):
            at = v.offset(builder.mul(b, ir.Constant(b.type, per_quad * QUADS)), per_quad * j)
            word = builder.load(builder.bitcast(builder.gep(row, [at]), ir.IntType(32).as_pointer()), align=1)
            return v.bitcast(v.splat(word, width), 4 * width, 8)

        return word

    start = quad_words(ints_row, 1) if by_magnitude else v.splat(builder.load(builder.gep(ints_row, [b])), width)
    return quad_words(qs_row, 4), start, v.splat(builder.load(builder.gep(ad_row, [b])), width)


def _block_sums(v: VectorCode, quads, halves, rows, by_magnitude: bool):
    """[u][h] <len(halves[h]) x i32>: start + the block's products summed over its 32 elements, for
    activation row u (rows[u]: its quad words and start, by_magnitude its magnitude quads) and the weight
    rows halves[h] of the tile: all 16 with VNNI's vpdpbusd, else a half of 8 through int16 pair sums or,
    by_magnitude, signed quads widened one at a time. Written quad by quad over every row and half
    (integer sums: the order changes no bit; LLVM's scheduler picks its own, and with two rows on AVX2
    still spills, hence emit_block_sums' one loop per row there)."""
    builder = v.builder
    ones = v.constant(1, 16, 16)
    partial = [[None for _ in halves] for _ in rows]
    for j in range(QUADS):
        whole = quads[j]
        weights = [whole if len(lanes) == TILE else v.shuffle(whole, range(4 * lanes[0], 4 * lanes[0] + 4 * len(lanes)))
                   for lanes in halves]
        for u, (words, start, _) in enumerate(rows):
            word = words(j)
            magnitude = start(j) if by_magnitude else None
            for h, lanes in enumerate(halves):
                if len(lanes) == TILE:
                    partial[u][h] = v._vpdpbusd(start if j == 0 else partial[u][h], weights[h], word)
                elif by_magnitude:
                    partial[u][h] = v.add(partial[u][h], v.dot_quads_signed(word, weights[h], magnitude=magnitude))
                else:
                    partial[u][h] = v.add(partial[u][h], v.dot_pairs(weights[h], word))
    if by_magnitude or len(halves) == 1:
        return partial
    return [[builder.add(v.scale_pairs(pairs, ones), start) for pairs in row] for row, (_, start, _) in zip(partial, rows)]
