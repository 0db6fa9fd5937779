"""Q4_K batched products with the weight rows as vector lanes (prefill, on AVX-512 VNNI and AVX2 targets).

The row kernels (kquant_rows) take one weight row against many activation rows: every product of a
(weight row, activation row, super-block) ends in a horizontal sum of integer lanes and a scalar float
step. Here a tile of TILE = 16 weight rows is unpacked once per super-block into a transposed scratch:
`tile[j, i]` holds the four quants of row i at positions 4j..4j+3, so one vpdpbusd of `tile[j]` against
an activation's four bytes (broadcast) adds to sixteen rows at once, lane i being row i. Per sub-block
the eight such products are scaled by the sixteen rows' scales (a 32-bit multiply), the mins go through
vpdpwssd against the activation's 32-element sums, and the float step is accumulate's own
(fma(ad, fma(d, scaled, -(dmin * mins)), acc), q4_k.accumulate) on sixteen lanes: each lane computes
exactly what vec_dot computes for its row, so every output equals the one-row kernel's bit for bit.
Four activation rows share each load of `tile[j]`.

Measured (2026-11-24, Zen 4, one thread, a session script timing this kernel, then with chunks of 64,
against the row kernels' driver on the same matrix and activations, best of 5; chunks of 256 took 7% off
at T = 512), ns per (weight row, activation row, super-block):
512 x 4096 at T = 16 / 64 / 512: 2.57 / 1.63-1.74 / 1.84 against 2.84 / 2.80 / 2.95 (1.1x / 1.6-1.7x /
1.6x); 256 x 14336 at T = 256: 1.86 against 3.17. Below MIN_ROWS the per-chunk unpacking (a 16 x 16
transpose of 32-bit lanes per 64 positions) is not paid back. A C version of the same loop nest (with a
scalar transpose) came first, at 1.6-1.8 ns.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ....jit import exact_kernel, read_f16
from .q4_k import BLOCK, BLOCK_BYTES, emit_scale_min_codes
from .vector import VectorCode, _target_has_avx512_bw, _target_has_avx512_vnni

TILE = 16  # weight rows per tile: the lanes of a 512-bit vector of int32
ROWS = 4  # activation rows per pass over a tile's quants (each quant vector loaded once for them)
CHUNK = 256  # activation rows whose float sums (CHUNK x TILE floats, 16 KiB) stay in the L1 cache (64: 7-9% slower at T = 512)
N_SUB = 8
MIN_ROWS = 16  # fewer activation rows: the row kernels (the unpacking is amortised over too few)
# On AVX2 targets (narrow: each product as two 256-bit halves), the K-quant tiles from these rows
# (TileKernel.narrow_min_rows). One Zen 4 thread compiled for Haswell, 640 x 1024 and 640 x 2048,
# activation quantization included, median of 7 calls, GMAC/s, tiles against the row kernels (Q4_K,
# Q5_K, Q6_K) or one vec_dot per weight and activation row (Q2_K, Q3_K, IQ4_XS), T = 4 / 8 / 16 / 32 /
# 256: Q4_K 27-33/47-50, 38-42/57-58, 52-55/60-61, 65-68/61, 73-81/60-62; Q5_K 25-27/39-41,
# 36-38/52-53, 50-53/40, 63-65/38-41, 69-77/34-40; Q6_K 18-22/34-40, 31-34/44-50, 43-47/50-59,
# 51-57/49-59, 57-71/55; Q2_K 24/27-28, 36-37/28, 49-52/28, 62-63/27-28, 72-75/27-28; Q3_K 14-19/13-18,
# 23/13, 36-37/14, 43-45/14, 49-71/14-21; IQ4_XS 26-29/21-22, 35-38/22, 45-48/22, 52-55/22, 59-60/22
# (and at T = 2 17-20/20-21). Dequantize + BLAS (one OpenBLAS thread) was 43-51 at T = 256.
NARROW_MIN_ROWS = 32


def _transpose16(v: VectorCode, lanes: list) -> list:
    """16 vectors <16 x i32> -> their transpose (out[m] lane i = lanes[i] lane m): four butterfly
    stages, each exchanging the off-diagonal halves of blocks of 2, 4, 8, 16 lanes."""
    lanes = list(lanes)
    for stage in range(4):
        step = 1 << stage
        for i in range(TILE):
            if i & step:
                continue
            a, b = lanes[i], lanes[i + step]
            low = [k if not (k >> stage) & 1 else 16 + k - step for k in range(16)]
            high = [k + step if not (k >> stage) & 1 else 16 + k for k in range(16)]
            lanes[i] = v.builder.shuffle_vector(a, b, v._lane_list(low))
            lanes[i + step] = v.builder.shuffle_vector(a, b, v._lane_list(high))
    return lanes


@intrinsic
def unpack_tile_vectors(typingctx, weights, r0, b, tile, scales, mins):
    """Super-block b of weight rows r0..r0+15 into the scratch: tile uint8[64, 64] (row i's quant at
    position p in tile[p // 4, 4 * i + p % 4]: each row's nibbles split into four 64-byte vectors, then
    per 64 positions a 16 x 16 transpose of 32-bit lanes), scales int32[8, 16] and mins int32[4, 16]
    (sub-blocks 2k and 2k+1 as the low and high int16 of one lane; the 6-bit codes of every row unpacked
    at once, q4_k.emit_scale_min_codes, then transposed)."""
    sig = types.void(weights, r0, b, tile, scales, mins)

    def codegen(context, builder, signature, args):
        weights_, r0_, b_, tile_, scales_, mins_ = args
        wt, _, _, tt, st, mt = signature.args
        v = VectorCode(context, builder)
        i64 = ir.IntType(64)
        r0_ = v.resize(r0_, 64)
        block_at = builder.mul(v.resize(b_, 64), i64(BLOCK_BYTES))
        quants_at = builder.add(block_at, i64(16))
        rows, codes = [], []  # rows[i][c]: <16 x i32>, dword m = row i's quants at 64c + 4m .. 64c + 4m + 3
        for i in range(TILE):
            row = v.row_pointer(wt, weights_, builder.add(r0_, i64(i)))
            chunks = []
            for c in range(4):
                packed = v.load(None, row, builder.add(quants_at, i64(32 * c)), 32)
                chunks.append(v.bitcast(v.join(v.and_(packed, 15), v.shr(packed, 4)), 16, 32))
            rows.append(chunks)
            codes.append(v.widen(emit_scale_min_codes(v, None, row, builder.add(block_at, i64(4))), 32, signed=False))

        def store(array_type, array, index, vec):
            pointer = builder.gep(v._data(array_type, array), [i64(index)])
            builder.store(vec, builder.bitcast(pointer, vec.type.as_pointer()), align=1)

        for c in range(4):
            for m, vec in enumerate(_transpose16(v, [rows[i][c] for i in range(TILE)])):
                store(tt, tile_, 64 * (16 * c + m), vec)
        by_code = _transpose16(v, codes)  # by_code[k]: scale k of each row (k < 8), min k - 8 (k >= 8)
        for k in range(N_SUB):
            store(st, scales_, 16 * k, by_code[k])
        for k in range(N_SUB // 2):
            store(mt, mins_, 16 * k, v.or_(by_code[8 + 2 * k], v.shl(by_code[9 + 2 * k], 16)))
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel
def sub_block_sum_pairs(asum, out):
    """out int32[T, nb * 4]: for super-block b and k < 4, the 32-element sums of sub-blocks 2k and 2k+1
    (asum's 16-element sums added in pairs) as the low and high int16 of one value (|sum| <= 32 * 127)."""
    for t in range(asum.shape[0]):
        for g in range(out.shape[1]):
            low = asum[t, 4 * g] + asum[t, 4 * g + 1]
            high = asum[t, 4 * g + 2] + asum[t, 4 * g + 3]
            out[t, g] = (low & 0xFFFF) | (high << 16)


def activation_quads(v: VectorCode, aqs_type, aqs, t, b, rows: int):
    """act_quad(u, position): the four bytes of activation row t + u (aqs int8[T, K]) at `position` of
    super-block b, broadcast to 16 lanes (<64 x i8>), for vpdpbusd against 16 weight rows."""
    builder = v.builder
    i32, i64 = ir.IntType(32), ir.IntType(64)
    # Each row's block start, then constant offsets from it: with each offset added to the block's start
    # instead (gep(row, block_start + position)), LLVM made one induction variable per position, 64 of
    # them, kept on the stack and reloaded for every quad (docs/performance.md, thirty-fourth session)
    block_start = builder.mul(b, i64(BLOCK))
    act_blocks = [builder.gep(v.row_pointer(aqs_type, aqs, builder.add(t, i64(u))), [block_start]) for u in range(rows)]

    def act_quad(u, position):
        pointer = builder.gep(act_blocks[u], [i64(position)])
        word = builder.load(builder.bitcast(pointer, i32.as_pointer()), align=1)
        return v.bitcast(v.splat(word, 16), 64, 8)

    return act_quad


def group_sums(v: VectorCode, tile_type, tile, scales_type, scales, aqs_type, aqs, t, b, rows: int, quads_per_group: int,
               signed_weights: bool = False):
    """For activation rows t..t+rows-1 (aqs int8[T, K]) and super-block b: per row, sum over the groups
    of the block of scale_g (scales int32[n_groups, 16]) times the group's products with the tile's
    16 rows (quads_per_group vpdpbusd each, the activation's four bytes broadcast): <16 x i32> per row.
    Each tile vector is loaded once for the `rows` activation rows. signed_weights: the tile's bytes
    are signed (_dot_quads_512)."""
    builder = v.builder
    i64 = ir.IntType(64)
    act_quad = activation_quads(v, aqs_type, aqs, t, b, rows)
    scaled = [None] * rows
    for g in range(64 // quads_per_group):
        sums = [None] * rows
        for j in range(quads_per_group):
            quad = quads_per_group * g + j
            quads = v.load(tile_type, tile, i64(64 * quad), 64)
            for u in range(rows):
                sums[u] = _dot_quads_512(v, sums[u], quads, act_quad(u, 4 * quad), signed_weights)
        scale = v.load(scales_type, scales, i64(16 * g), 16)
        for u in range(rows):
            scaled[u] = v.add(scaled[u], builder.mul(sums[u], scale))
    return scaled


def fma_into_row(v: VectorCode, acc_type, acc, row, a, b):
    """acc[row] (16 floats) = fma(a, b, acc[row]), <16 x float> a and b: a float step on 16 lanes."""
    builder = v.builder
    f32x16 = ir.VectorType(ir.FloatType(), 16)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32x16, [f32x16] * 3), "llvm.fma.v16f32")
    pointer = builder.bitcast(v.row_pointer(acc_type, acc, row), f32x16.as_pointer())
    builder.store(builder.call(fma, [a, b, builder.load(pointer, align=4)]), pointer, align=4)


def float_steps(v: VectorCode, scaled, d_vec, dmin_vec, min_pairs, pairs, ad, acc, t, a, b):
    """For each activation row t + u (u < len(scaled)) and super-block b: the mins' sum from the 16
    rows' min pairs against the row's sub-block sum pairs (pairs: (type, int32[T, nb * 4] value)),
    then q4_k.accumulate's float step on 16 lanes into acc[a + u]: fma(ad, fma(d, scaled, -(dmin *
    mins)), acc). pairs, ad and acc are (Numba type, value) pairs; t, a, b int64 values."""
    builder = v.builder
    i64 = ir.IntType(64)
    f32x16 = ir.VectorType(ir.FloatType(), 16)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32x16, [f32x16] * 3), "llvm.fma.v16f32")
    for u, scaled_u in enumerate(scaled):
        row = builder.add(t, i64(u))
        pair_row = v.row_pointer(pairs[0], pairs[1], row)
        mins_sum = None
        for k in range(4):
            sums = builder.load(builder.gep(pair_row, [builder.add(builder.mul(b, i64(4)), i64(k))]))
            mins_sum = _dot_word_pairs_512(v, mins_sum, min_pairs[k], v.splat(sums, 16))
        # accumulate's float step, lane by lane (no fast-math flags: each operation rounded as written)
        mins_term = builder.fmul(dmin_vec, builder.sitofp(mins_sum, f32x16), flags=("arcp",))
        step = builder.call(fma, [d_vec, builder.sitofp(scaled_u, f32x16), builder.fneg(mins_term, flags=("arcp",))])
        a_scale = v.splat(builder.load(builder.gep(v.row_pointer(ad[0], ad[1], row), [b])), 16)
        fma_into_row(v, acc[0], acc[1], builder.add(a, i64(u)), a_scale, step)


def _tile_dots(rows: int):
    @intrinsic
    def tile_dots(typingctx, tile, scales, mins, d, dmin, aqs, ad, pairs, acc, t, a, b):
        """For activation rows t..t+rows-1 and super-block b: acc[a + u] (16 floats: the tile's rows)
        takes the block's step, as q4_k.accumulate does it for each row."""
        sig = types.void(tile, scales, mins, d, dmin, aqs, ad, pairs, acc, t, a, b)

        def codegen(context, builder, signature, args):
            tile_, scales_, mins_, d_, dmin_, aqs_, ad_, pairs_, acc_, t_, a_, b_ = args
            st = signature.args
            v = VectorCode(context, builder)
            i64 = ir.IntType(64)
            t_, a_, b_ = v.resize(t_, 64), v.resize(a_, 64), v.resize(b_, 64)
            scaled = group_sums(v, st[0], tile_, st[1], scales_, st[5], aqs_, t_, b_, rows, 8)
            d_vec = v.load(st[3], d_, i64(0), 16)
            dmin_vec = v.load(st[4], dmin_, i64(0), 16)
            min_pairs = [v.load(st[2], mins_, i64(16 * k), 16) for k in range(4)]
            float_steps(v, scaled, d_vec, dmin_vec, min_pairs, (st[7], pairs_), (st[6], ad_), (st[8], acc_), t_, a_, b_)
            return context.get_dummy_value()

        return sig, codegen

    return tile_dots


def narrow(v: VectorCode) -> bool:
    """Whether this compile's tiles take each 512-bit product as two 256-bit halves (AVX2 without AVX-512
    VNNI: vpmaddubsw + vpmaddwd, exact for weight bytes <= 127 unsigned or -127..127 signed, so types
    whose tiles hold larger unsigned bytes keep them signed there: iq4_tiles)."""
    return v.avx2 and not v.avx512_vnni


def _dot_quads_512(v: VectorCode, start, weight_bytes, signed_bytes, signed_weights: bool = False):
    """<16 x i32>: lane i += sum of the four products of bytes 4i..4i+3: weight bytes (unsigned, or
    signed where signed_weights: narrow targets only) times signed activation bytes (-127..127)."""
    if v.avx512_vnni:
        return v._vpdpbusd(start, weight_bytes, signed_bytes)
    if v.avx2:
        dot = v.dot_quads_signed if signed_weights else v.dot_quads
        return v.add(start, v.join(*[dot(_half(v, weight_bytes, h), _half(v, signed_bytes, h)) for h in range(2)]))
    products = v.builder.mul(v.widen(weight_bytes, 32, signed=signed_weights), v.widen(signed_bytes, 32))
    sums = None
    for q in range(4):
        sums = v.add(sums, v.shuffle(products, range(q, 64, 4)))
    return v.add(start, sums)


def _dot_word_pairs_512(v: VectorCode, start, x, y):
    """<16 x i32>: lane i += low16(x_i) * low16(y_i) + high16(x_i) * high16(y_i), signed (vpdpwssd)."""
    builder = v.builder
    if v.avx512_bw:  # vpmaddwd, and the add LLVM fuses into vpdpwssd where the target has VNNI
        words = v.vector_type(32, 16)
        pairs = v._x86("llvm.x86.avx512.pmaddw.d.512", [builder.bitcast(x, words), builder.bitcast(y, words)], x.type)
        return v.add(start, pairs)
    if v.avx2:  # vpmaddwd on each 256-bit half
        halves = [v.scale_pairs(v.bitcast(_half(v, x, h), 16, 16), v.bitcast(_half(v, y, h), 16, 16)) for h in range(2)]
        return v.add(start, v.join(*halves))
    words_x, words_y = v.widen(v.bitcast(x, 32, 16), 32), v.widen(v.bitcast(y, 32, 16), 32)
    products = builder.mul(words_x, words_y)
    sums = builder.add(v.shuffle(products, range(0, 32, 2)), v.shuffle(products, range(1, 32, 2)))
    return v.add(start, sums)


def _half(v: VectorCode, vec, h: int):
    """Half h (0: low lanes, 1: high) of a 512-bit vector."""
    n = vec.type.count // 2
    return v.shuffle(vec, range(n * h, n * h + n))


tile_dots_4 = _tile_dots(ROWS)
tile_dots_1 = _tile_dots(1)


def available() -> bool:
    """Whether the compile target has AVX-512 VNNI (with BW), where the tiles beat the row kernels from
    MIN_ROWS (on AVX2, matmul.tile_rows_from takes NARROW_MIN_ROWS; elsewhere the kernel compiles through
    portable IR, the tests run it so, but is no faster)."""
    from numba.core.registry import cpu_target

    return _target_has_avx512_vnni(cpu_target.target_context) and _target_has_avx512_bw(cpu_target.target_context)


@exact_kernel(parallel=True)
def matvec_tiles(weights, out, qs, d, s):
    """out[t, r] for the first N - N % 16 weight rows (16 at a time, in parallel), every value equal to
    q4_k.vec_dot(weights[r], qs[t], d[t], s[t]); the caller computes the rest. Activation rows in chunks
    of CHUNK (their float sums in a 16 KiB scratch), each super-block of the tile unpacked once per chunk,
    then taken by ROWS activation rows at a time."""
    n_rows = qs.shape[0]
    n_blocks = d.shape[1]
    pairs = np.empty((n_rows, n_blocks * 4), dtype=np.int32)
    sub_block_sum_pairs(s, pairs)
    for tile_index in prange(weights.shape[0] // TILE):
        r0 = tile_index * TILE
        tile = np.empty((64, 64), dtype=np.uint8)
        scales = np.empty((N_SUB, TILE), dtype=np.int32)
        mins = np.empty((N_SUB // 2, TILE), dtype=np.int32)
        dd = np.empty(TILE, dtype=np.float32)
        dm = np.empty(TILE, dtype=np.float32)
        acc = np.empty((CHUNK, TILE), dtype=np.float32)
        for t0 in range(0, n_rows, CHUNK):
            t1 = min(t0 + CHUNK, n_rows)
            acc[:] = 0.0
            for b in range(n_blocks):
                unpack_tile_vectors(weights, r0, b, tile, scales, mins)
                for i in range(TILE):
                    dd[i] = read_f16(weights[r0 + i], b * BLOCK_BYTES)
                    dm[i] = read_f16(weights[r0 + i], b * BLOCK_BYTES + 2)
                t = t0
                while t + ROWS <= t1:
                    tile_dots_4(tile, scales, mins, dd, dm, qs, d, pairs, acc, t, t - t0, b)
                    t += ROWS
                while t < t1:
                    tile_dots_1(tile, scales, mins, dd, dm, qs, d, pairs, acc, t, t - t0, b)
                    t += 1
            for t in range(t0, t1):
                for i in range(TILE):
                    out[t, r0 + i] = acc[t - t0, i]


