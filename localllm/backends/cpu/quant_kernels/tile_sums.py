"""Products of 16-row tiles (weight rows as vector lanes: legacy_tiles' unpacked tiles, q4_0_x16's records)
in the block-sums order of legacy.block_terms_kernel (Q4_0): per activation row and weight row one float
accumulator, acc = fma(float(block sum), d * ad[b], acc), block after block, so every output equals the
type's vec_dot bit for bit. One accumulator per row (against eight in legacy_tiles.emit_rows' quad order)
lets one loop over the blocks carry several tiles and activation rows at once: the decode reads four
tiles a part of the matrix apart in the same steps (q4_0_x16.matvec_packed), four sequential runs per
thread, which the memory serves faster than one.

The integer sum of a block, per weight row: with AVX-512 VNNI eight vpdpbusd of the 16 rows' quad j
against the activation's quad j (broadcast), chained from the zero correction; elsewhere per half of 8
rows, vpmaddubsw per quad gives int16 pair sums (|pair| <= 2 * 15 * 127 = 3810 for 4-bit quants), the
eight quads' pairs are summed in int16 (|sum| <= 30480 < 32767: exact), then one vpmaddwd by ones and
the start. Only 4-bit unsigned quants may come here (a fifth bit would overflow the int16 sums).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .q4_k_tiles import TILE
from .vector import VectorCode

QUADS = 8  # four-byte quads per 32-element block


def emit_block_sums(v: VectorCode, sources, n_rows: int, n_blocks, acts, out, t):
    """out[t + u, r0 + i] for u < n_rows, i < 16 and every source (block_vectors, r0): block_vectors(b)
    gives block b of that tile as (eight <64 x i8> quad vectors, quad j of the 16 rows at bytes 4i..4i+3,
    unsigned 0..15; <16 x float> scales d), r0 its first output column. acts: (type, value) of aqs
    (int8[T, K]), ad (float32[T, nb]) and starts (int32[T, nb]: -zero * the activation's block sum);
    out: (type, value) of float32[T, N]."""
    builder = v.builder
    i64 = ir.IntType(64)
    t = v.resize(t, 64)
    wide = v.avx512_vnni
    width = 16 if wide else 8
    halves = [range(16)] if wide else [range(0, 8), range(8, 16)]
    floats = ir.VectorType(ir.FloatType(), width)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(floats, [floats] * 3), f"llvm.fma.v{width}f32")
    zeros = ir.Constant(floats, [0.0] * width)
    accs = [[[cgutils.alloca_once_value(builder, zeros) for _ in halves] for _ in range(n_rows)] for _ in sources]
    act_rows = [[v.row_pointer(array_type, array, v.offset(t, u)) for array_type, array in acts] for u in range(n_rows)]
    with cgutils.for_range(builder, v.resize(n_blocks, 64)) as loop:
        b = loop.index
        rows = [_activation_block(v, act_row, b, width) for act_row in act_rows]
        for k, (block_vectors, _) in enumerate(sources):
            quads, d_vec = block_vectors(b)
            for u, (words, start, ad_splat) in enumerate(rows):
                for h, lanes in enumerate(halves):
                    ints = _block_sum(v, quads, lanes, words, start)
                    scale = builder.fmul(d_vec if wide else v.shuffle(d_vec, lanes), ad_splat, flags=v.PINNED)
                    acc = accs[k][u][h]
                    builder.store(builder.call(fma, [builder.sitofp(ints, floats), scale, builder.load(acc)]), acc)
    for k, (_, r0) in enumerate(sources):
        for u in range(n_rows):
            out_row = v.row_pointer(out[0], out[1], v.offset(t, u))
            for h, lanes in enumerate(halves):
                first = builder.add(v.resize(r0, 64), i64(lanes[0]))
                builder.store(builder.load(accs[k][u][h]), builder.bitcast(builder.gep(out_row, [first]), floats.as_pointer()), align=4)


def _activation_block(v: VectorCode, act_row, b, width: int):
    """Block b of one activation row: its eight quads each broadcast to `width` lanes (<4 * width x i8>),
    its start and its scale ad[b] on `width` lanes."""
    builder = v.builder
    qs_row, ad_row, starts_row = act_row
    words = []
    for j in range(QUADS):
        at = v.offset(builder.mul(b, ir.Constant(b.type, 4 * QUADS)), 4 * j)
        word = builder.load(builder.bitcast(builder.gep(qs_row, [at]), ir.IntType(32).as_pointer()), align=1)
        words.append(v.bitcast(v.splat(word, width), 4 * width, 8))
    start = v.splat(builder.load(builder.gep(starts_row, [b])), width)
    return words, start, v.splat(builder.load(builder.gep(ad_row, [b])), width)


def _block_sum(v: VectorCode, quads, lanes, words, start):
    """<len(lanes) x i32>: start + the block's products summed over its 32 elements, for the weight rows
    `lanes` of the tile (all 16 with VNNI's vpdpbusd, else a half of 8 through int16 pair sums)."""
    builder = v.builder
    if len(lanes) == TILE:
        ints = start
        for j in range(QUADS):
            ints = v._vpdpbusd(ints, quads[j], words[j])
        return ints
    pairs = None
    for j in range(QUADS):
        weights = v.shuffle(quads[j], range(4 * lanes[0], 4 * lanes[0] + 4 * len(lanes)))
        pairs = v.add(pairs, v.dot_pairs(weights, words[j]))
    return builder.add(v.scale_pairs(pairs, v.constant(1, 16, 16)), start)
