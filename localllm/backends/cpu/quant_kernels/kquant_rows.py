"""Multi-row dot products for the super-block types Q4_K, Q5_K and Q6_K: one weight row against R q8_k
activation rows (the batched decode, and an integer path for prefill), each result bit-identical to
the type's one-row `vec_dot`.

    <type>_pack(qs, d, s, t0, n_groups, R) -> (pq, pd, ps): the activation rows [T, ...] rearranged once
        per matmul into groups of R rows, block by block (rows past T - 1 repeat it, so a batch's
        remainder is one more group whose extra lanes the driver stores on the last row)
    <type>_rows_R (R = 16, 8, 4, 2; any power of two from 2 builds): intrinsics
        (weights uint8[N, row_bytes], r, pq, pd, ps, g, b0, b1, start, ahead) -> UniTuple(float32, R):
        blocks b0..b1-1 of weight row r against the R rows of group g, accumulating on from `start` (R
        floats), so that a driver can take the blocks in ranges whose activations stay in the L1 cache;
        `ahead`: the prefetch distance in bytes

Per super-block the weights are unpacked once (quants, per-sub-block scales as words, the mins or the
Q6_K offsets as words) and then, per activation row, the integer work goes into one <16 x i32>
accumulator (_scaled_rows): two multiply-adds per 64 weights (vpmaddubsw, then vpmaddwd by the scales,
the add fused into vpdpwssd by LLVM), or, where the target has AVX-512 VNNI, three per 128 (a vpdpbusd
per 64, the two results packed to words, one vpmaddwd by the scales). The mins' share (Q4_K) is one
vpmaddwd per four rows on the pair sums of the activation's 16-element sums, packed as int16 (|sum| <=
32 * 127); Q6_K's -32 offset one vpmaddwd per row on the int32 sums read as words (value, sign) against
(-32 * scale, 0), exact since a 16-element sum fits in int16. The rows' accumulators are then reduced
together by a transposing tree (two vectors -> one, each add halving every row's partials), so the
horizontal sums cost a few shuffles per row, and the float step runs with the rows as lanes: a vector
fma is a scalar fma per lane, so each lane does exactly what the type's `accumulate` does for its row:
    Q4_K, Q5_K: acc = fma(ad, fma(d, float(scaled), -(dmin * float(mins))), acc)
    Q6_K: acc = fma(ad * d, float(total), acc)
The integers are exact wrapping int32 sums (the same whatever their order), so every lane's value is
vec_dot's, bit for bit (tests/backends/cpu/test_quant_kquant_rows.py, on every VECTOR_ISA path).

Measured on the Zen 4 machine (one thread, in cache, Q4_K, K = 4096, scripts/bench_quant.py's kind of
matrix): per row and block ~2.3 ns of per-row work (the multiplies: one 512-bit multiply per cycle)
plus ~5.4 ns per block shared by the R rows, so R = 16 takes ~2.9 ns per row and block, R = 8 ~3.0,
R = 4 ~3.7, R = 2 ~5.0 (vec_dot: ~8). On the earlier Zen 5 machine R = 8 was ~1.55 ns and R = 16 only
~4% faster per row.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....jit import exact_kernel
from . import q4_k, q5_k, q6_k
from .vector import VectorCode

NO_FAST_MATH = q4_k.NO_FAST_MATH  # a flag that permits nothing here, so fast-math leaves the op alone
I32 = ir.IntType(32)


def _reduce(v, vectors, n_outputs: int, until: int = 1):
    """Sum partials. vectors: integer vectors of one type, each n_outputs outputs x P partials laid out
    as [output 0's P lanes | output 1's | ...], the outputs of vector i following those of vector i - 1.
    While more than `until` partials remain: two neighbouring vectors become one (the first halves of
    every output's partials, then the second halves, added; outputs kept in order), or, once one vector
    is left, it is halved in place. Returns (vectors, outputs per vector); each output is the wrapping
    sum of its partials, so the order of the adds does not matter."""
    builder = v.builder
    count = n_outputs
    partials = vectors[0].type.count // n_outputs
    while partials > until:
        half = partials // 2
        first = [o * partials + i for o in range(count) for i in range(half)]
        second = [o * partials + half + i for o in range(count) for i in range(half)]
        if len(vectors) == 1:
            vectors = [builder.add(v.shuffle(vectors[0], first), v.shuffle(vectors[0], second))]
        else:
            merged = []
            for a, b in zip(vectors[0::2], vectors[1::2]):
                lanes = a.type.count
                low = builder.shuffle_vector(a, b, v._lane_list(first + [lanes + x for x in first]))
                high = builder.shuffle_vector(a, b, v._lane_list(second + [lanes + x for x in second]))
                merged.append(builder.add(low, high))
            vectors = merged
            count *= 2
        partials = half
    return vectors, count


def _halves_f32(v, row, byte_index, count: int):
    """The `count` consecutive float16 values at row[byte_index:] (a uint8 pointer), as <count x float>."""
    builder = v.builder
    pointer = builder.bitcast(builder.gep(row, [byte_index]), ir.VectorType(ir.IntType(16), count).as_pointer())
    halves = builder.bitcast(builder.load(pointer, align=1), ir.VectorType(ir.HalfType(), count))
    return builder.fpext(halves, ir.VectorType(ir.FloatType(), count))


def _fma(builder, a, b, c):
    lanes = a.type.count
    f32v = a.type
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32v, [f32v] * 3), f"llvm.fma.v{lanes}f32")
    return builder.call(fn, [a, b, c])


def _rows_intrinsic(n_rows: int, block_bytes: int, prefetch_step: int, sums_per_row: int, shared, block_ints, float_step):
    """The intrinsic for one type and R = n_rows,
        rows_dot(weights, r, pq, pd, ps, g, b0, b1, start, ahead) -> UniTuple(float32, R):
    blocks b0 <= b < b1 of weight row r against the R rows of group g, the float accumulation going on
    from start (R float32: zeros for b0 = 0, else what the call for the blocks before b0 returned; the
    float steps are sequential per block, so a row split into ranges gives vec_dot's value exactly);
    each block asks for its cache lines `ahead` bytes further on (the weight bytes the driver reads next
    at that point: PREFETCH_BYTES when it goes row after row, a row's length when it takes the same
    range of blocks of the next row).
    shared(v, row, base) unpacks the block at byte base of
    the weight row (a uint8 pointer) once; block_ints(v, unpacked, acts, sums, b, n_rows) gives the
    block's integers for the R rows (activations of the packed layout: element pointers of the group's
    rows of pq and ps); float_step(v, row, base, ints, ad, acc) applies the block's float step to the R
    lanes of acc (ad: <R x float>, the rows' activation scales)."""

    @intrinsic
    def rows_dot(typingctx, weights, r, pq, pd, ps, group, b0, b1, start, ahead):
        sig = types.UniTuple(types.float32, n_rows)(weights, r, pq, pd, ps, group, b0, b1, start, ahead)

        def codegen(context, builder, signature, args):
            weights_, r_, pq_, pd_, ps_, group_, b0_, b1_, start_, ahead_ = args
            w_type, _, pq_type, pd_type, ps_type = signature.args[:5]
            v = VectorCode(context, builder)
            row = v.row_pointer(w_type, weights_, r_)
            acts = v.row_pointer(pq_type, pq_, group_)
            scales = v.row_pointer(pd_type, pd_, group_)
            sums = v.row_pointer(ps_type, ps_, group_)
            f32v = ir.VectorType(ir.FloatType(), n_rows)
            acc = ir.Constant(f32v, ir.Undefined)
            for i in range(n_rows):
                acc = builder.insert_element(acc, builder.extract_value(start_, i), I32(i))
            acc_pointer = cgutils.alloca_once_value(builder, acc)
            b0_ = context.cast(builder, b0_, signature.args[6], types.intp)
            b1_ = context.cast(builder, b1_, signature.args[7], types.intp)
            ahead_ = context.cast(builder, ahead_, signature.args[9], types.intp)
            with cgutils.for_range(builder, builder.sub(b1_, b0_)) as loop:
                b = builder.add(b0_, loop.index)
                base = builder.mul(b, ir.Constant(b.type, block_bytes))
                for line in range(0, block_bytes, prefetch_step):  # every line of the block, `ahead` further on
                    v.prefetch(None, row, builder.add(v.offset(base, line), ahead_), 0)
                unpacked = shared(v, row, base)
                block_acts = builder.gep(acts, [builder.mul(b, ir.Constant(b.type, 256 * n_rows))])
                block_sums = builder.gep(sums, [builder.mul(b, ir.Constant(b.type, sums_per_row * n_rows))])
                ints = block_ints(v, unpacked, block_acts, block_sums, n_rows)
                ad = v.load(None, scales, builder.mul(b, ir.Constant(b.type, n_rows)), n_rows)
                builder.store(float_step(v, row, base, ints, ad, builder.load(acc_pointer)), acc_pointer)
            acc = builder.load(acc_pointer)
            totals = [builder.extract_element(acc, I32(i)) for i in range(n_rows)]
            return context.make_tuple(builder, signature.return_type, totals)

        return sig, codegen

    return rows_dot


@exact_kernel
def _aligned_rows(buffer, n_rows):
    """[n_rows, m] view of the 1D buffer (64 bytes longer than n_rows * m elements) from its first 64-byte
    boundary: with rows a multiple of 64 bytes long, each 64-byte load of a block is one cache line."""
    skip = ((-buffer.ctypes.data) % 64) // buffer.itemsize
    m = (buffer.shape[0] - 64 // buffer.itemsize) // max(n_rows, 1)
    return buffer[skip : skip + n_rows * m].reshape((n_rows, m))


@exact_kernel
def _pack_acts(qs, d, t0, n_groups, width):
    """(pq, pd): the activation rows min(t0 + width * g + i, T - 1), i < width, g < n_groups, of
    qs int8[T, n], d float32[T, nb], grouped so that block b of a group's rows is in one place:
        pq int8[G, nb*width*256]   pq[g, (b * width + i) * 256 + j] = qs[t, 256 b + j] (rows 64-byte aligned)
        pd float32[G, nb*width]    pd[g, b * width + i] = d[t, b]
    (Element loops on row views: 3-8x faster than slice assignments, measured at T = 8.)"""
    n_blocks = d.shape[1]
    last = qs.shape[0] - 1
    pq = _aligned_rows(np.empty(n_groups * n_blocks * width * 256 + 64, dtype=np.int8), n_groups)
    pd = np.empty((n_groups, n_blocks * width), dtype=np.float32)
    for g in range(n_groups):
        dst = pq[g]
        for i in range(width):
            t = min(t0 + width * g + i, last)
            src = qs[t]
            for b in range(n_blocks):
                at = b * width + i
                for j in range(256):
                    dst[at * 256 + j] = src[256 * b + j]
                pd[g, at] = d[t, b]
    return pq, pd


@exact_kernel
def q4_k_pack(qs, d, s, t0, n_groups, width):
    """(pq, pd, ps) for the Q4_K kernels: _pack_acts's, and the sums of the 16-element activation sums
    s int32[T, nb*16] in pairs (the mins' sub-blocks of 32), as int16 (|sum| <= 32 * 127):
        ps int16[G, nb*width*8]    ps[g, (b * width + i) * 8 + k] = s[t, 16 b + 2k] + s[t, 16 b + 2k + 1]"""
    pq, pd = _pack_acts(qs, d, t0, n_groups, width)
    n_blocks = d.shape[1]
    last = qs.shape[0] - 1
    ps = _aligned_rows(np.empty(n_groups * n_blocks * width * 8 + 32, dtype=np.int16), n_groups)
    for g in range(n_groups):
        dst = ps[g]
        for i in range(width):
            src = s[min(t0 + width * g + i, last)]
            for b in range(n_blocks):
                for k in range(8):
                    dst[(b * width + i) * 8 + k] = src[16 * b + 2 * k] + src[16 * b + 2 * k + 1]
    return pq, pd, ps


def _scaled_rows(v, quants, scales, acts, n_rows: int):
    """Per activation row i < n_rows, <16 x i32> partial sums of its scaled dot products with the block:
    quants are the block's four runs of 64 unsigned quants, acts the rows' 256 activations each.
    Without AVX-512 VNNI, scales holds one <32 x i16> per run (the scale of each vpmaddubsw word): per
    run one vpmaddubsw and one vpmaddwd. With it, one per two runs in scaled_quads_wide's word order
    (_quad_scales): per two runs two vpdpbusd, a vpackssdw and a vpmaddwd, 3 multiplies where the other
    way takes 4 (Zen 4 executes one 512-bit multiply per cycle). The lanes differ between the two; each
    row's total does not."""
    rows = []
    for i in range(n_rows):
        row_acts = [v.load(None, acts, ir.Constant(I32, 256 * i + 64 * c), 64) for c in range(len(quants))]
        acc = None
        if v.avx512_vnni:
            for j, s in enumerate(scales):
                runs = [(quants[2 * j + h], row_acts[2 * j + h]) for h in range(2)]
                acc = v.add(acc, v.scaled_quads_wide(runs, s))
        else:
            for q, a, s in zip(quants, row_acts, scales):
                acc = v.add(acc, v.scale_pairs_wide(v.dot_pairs_wide(q, a), s))
        rows.append(acc)
    return rows


def _quad_scales(v, words_for, scale_of):
    """With AVX-512 VNNI, the two scale vectors _scaled_rows takes (None without): vector j, for runs 2j
    and 2j + 1, is v.quad_scales(words_for(j), lambda which, element: scale_of(j, which, element))."""
    if not v.avx512_vnni:
        return None
    return [v.quad_scales(words_for(j), lambda which, element, j=j: scale_of(j, which, element)) for j in range(2)]


# ----- Q4_K -----


def _q4_k_shared(v, row, base):
    """(quants <64 x i8> for the 4 sub-block pairs, their scales <32 x i16>, the mins as words
    <32 x i16>: lane 8i + k = min_k, for four rows' pair sums)."""
    codes = q4_k.emit_scale_min_codes(v, None, row, v.offset(base, q4_k._SCALES))
    codes16 = v.widen(codes, 16, signed=False)
    low8 = v.shuffle(codes16, range(8))
    quants = []
    for c in range(q4_k.N_SUB // 2):
        packed = v.load(None, row, v.offset(base, q4_k._QS + q4_k.SUB * c), q4_k.SUB)
        quants.append(v.bit_fields_wide(packed, {j: j for j in range(4)}, {j: j + 4 for j in range(4)}))
    mins = v.shuffle(codes16, [8 + lane % 8 for lane in range(32)])
    return quants, _sub_block_scales(v, low8), mins


def _sub_block_scales(v, low8):
    """Q4_K/Q5_K: the scale words _scaled_rows takes, from the 8 sub-block scales (<8 x i16>)."""
    runs = range(q4_k.N_SUB // 2)
    return _quad_scales(v, lambda j: low8, _sub_block) or [v.pick_words(low8, [2 * c] * 16 + [2 * c + 1] * 16) for c in runs]


def _sub_block(j: int, which: int, element: int) -> int:
    """Q4_K/Q5_K: the sub-block (scale index) of element `element` of run 2j + which (a run is a pair of
    sub-blocks, the low nibbles' then the high nibbles')."""
    return 2 * (2 * j + which) + element // 32


def _q4_k_ints(v, unpacked, acts, sums, n_rows):
    """<2R x i32>: the R rows' sum_k scale_k * <q_k, a_k>, then their sum_k min_k * (pair sum k).

    Per row 16 lanes of scaled partials (4 x vpmaddubsw + vpmaddwd); the mins four rows at a time (one
    vpmaddwd on four rows' 8 pair sums: 4 partials each); then both reduced together."""
    quants, scales, min_words = unpacked
    rows = _scaled_rows(v, quants, scales, acts, n_rows)
    scaled, count = _reduce(v, rows, 1, until=4)  # R / 4 vectors of 4 rows x 4 partials (R = 2: one of 2 x 4)
    if n_rows >= 4:
        mins = [v.scale_pairs_wide(v.load(None, sums, ir.Constant(I32, 32 * j), 32), min_words) for j in range(n_rows // 4)]
    else:  # two rows: their 16 pair sums on 256 bits, 2 rows x 4 partials
        mins = [v.scale_pairs(v.load(None, sums, ir.Constant(I32, 0), 16), v.shuffle(min_words, range(16)))]
    vectors, _ = _reduce(v, scaled + mins, count)
    return vectors[0] if len(vectors) == 1 else v.join(*vectors)


def _q4_k_float(v, row, base, ints, ad, acc):
    builder = v.builder
    lanes = ad.type.count
    f32v = ad.type
    scaled = builder.sitofp(v.shuffle(ints, range(lanes)), f32v)
    mins = builder.sitofp(v.shuffle(ints, range(lanes, 2 * lanes)), f32v)
    d_dmin = _halves_f32(v, row, v.offset(base, q4_k._D), 2)
    d = v.shuffle(d_dmin, [0] * lanes)
    dmin = v.shuffle(d_dmin, [1] * lanes)
    mins_term = builder.fmul(dmin, mins, flags=NO_FAST_MATH)
    step = _fma(builder, d, scaled, builder.fneg(mins_term, flags=NO_FAST_MATH))
    return _fma(builder, ad, step, acc)


# ----- Q5_K: Q4_K's layout and arithmetic, with a fifth bit per quant -----


def _q5_k_shared(v, row, base):
    """As _q4_k_shared, the quants 5-bit: bit 2c of qh[l] (bit 2c + 1) is bit 4 of element 64c + l
    (64c + 32 + l)."""
    codes = q4_k.emit_scale_min_codes(v, None, row, v.offset(base, q5_k._SCALES))
    codes16 = v.widen(codes, 16, signed=False)
    low8 = v.shuffle(codes16, range(8))
    high = v.load(None, row, v.offset(base, q5_k._QH), q5_k.SUB)
    quants = []
    for c in range(q5_k.N_SUB // 2):
        packed = v.load(None, row, v.offset(base, q5_k._QS + q5_k.SUB * c), q5_k.SUB)
        nibbles = v.bit_fields_wide(packed, {j: j for j in range(4)}, {j: j + 4 for j in range(4)})
        quants.append(v.or_(nibbles, v.bit_fields_wide(high, {4: 2 * c}, {4: 2 * c + 1})))
    mins = v.shuffle(codes16, [8 + lane % 8 for lane in range(32)])
    return quants, _sub_block_scales(v, low8), mins


# ----- Q6_K -----


def _q6_k_shared(v, row, base):
    """(unsigned quants u = q + 32 <64 x i8> for the 4 runs of 64 elements, their group scales
    <32 x i16>, -32 * scale_g as words <32 x i16> (lane 16i + g, for two rows' int16 group sums))."""
    scales = v.widen(v.load(None, row, v.offset(base, q6_k._SCALES), q6_k.N_GROUPS), 16)
    quants = []
    for h in range(2):
        low = v.load(None, row, v.offset(base, q6_k._QL + 64 * h), 64)
        high = v.load(None, row, v.offset(base, q6_k._QH + 32 * h), 32)
        quants.append(v.or_(v.and_(low, 15), v.bit_fields_wide(high, {4: 0, 5: 1}, {4: 2, 5: 3})))
        quants.append(v.or_(v.shr(low, 4), v.bit_fields_wide(high, {4: 4, 5: 5}, {4: 6, 5: 7})))
    offsets = v.builder.mul(scales, v.constant(-32, 16, 16))  # |32 * scale| <= 4096: int16
    # Runs 2h, 2h + 1 hold groups 8h .. 8h + 7 (16 elements each): run 2h + j the groups 8h + 4j + i // 8
    # of its vpmaddubsw words i, or (VNNI) vector h's words the groups 4 * which + element // 16 of them.
    scales_of_half = [v.shuffle(scales, range(8 * h, 8 * h + 8)) for h in range(2)]
    group_scales = _quad_scales(v, lambda h: scales_of_half[h], lambda h, which, element: 4 * which + element // 16) or [
        v.pick_words(scales_of_half[h], [4 * j + i // 8 for i in range(32)]) for h in range(2) for j in range(2)
    ]
    return quants, group_scales, v.shuffle(offsets, list(range(16)) * 2)


def _q6_k_ints(v, unpacked, acts, sums, n_rows):
    """<R x i32>: each row's sum_g scale_g * <u_g - 32, a_g>. Per row 16 lanes of 4 x vpmaddubsw +
    vpmaddwd, reduced two rows into one vector; then the -32 offsets, one vpmaddwd per two rows on their
    int16 group sums (lanes in the same order), added; then all reduced together."""
    quants, scales, offset_words = unpacked
    rows = _scaled_rows(v, quants, scales, acts, n_rows)
    pairs, _ = _reduce(v, rows, 1, until=8)  # rows 2j, 2j+1: [8 partials | 8 partials]
    pairs = [
        v.builder.add(pair, v.scale_pairs_wide(v.load(None, sums, ir.Constant(I32, 32 * j), 32), offset_words))
        for j, pair in enumerate(pairs)
    ]
    (ints,), _ = _reduce(v, pairs, 2)
    return ints


@exact_kernel
def q6_k_pack(qs, d, s, t0, n_groups, width):
    """(pq, pd, ps) for the Q6_K kernels: _pack_acts's, and the 16-element activation sums as int16
    (|sum| <= 16 * 127):
        ps int16[G, nb*width*16]   ps[g, (b * width + i) * 16 + k] = s[t, 16 b + k]"""
    pq, pd = _pack_acts(qs, d, t0, n_groups, width)
    n_blocks = d.shape[1]
    last = qs.shape[0] - 1
    ps = _aligned_rows(np.empty(n_groups * n_blocks * width * 16 + 32, dtype=np.int16), n_groups)
    for g in range(n_groups):
        dst = ps[g]
        for i in range(width):
            src = s[min(t0 + width * g + i, last)]
            for b in range(n_blocks):
                for k in range(16):
                    dst[(b * width + i) * 16 + k] = src[16 * b + k]
    return pq, pd, ps


def _q6_k_float(v, row, base, ints, ad, acc):
    builder = v.builder
    lanes = ad.type.count
    d = v.shuffle(_halves_f32(v, row, v.offset(base, q6_k._D), 1), [0] * lanes)
    scale = builder.fmul(ad, d, flags=NO_FAST_MATH)
    return _fma(builder, scale, builder.sitofp(ints, ad.type), acc)


q4_k_rows_16, q4_k_rows_8, q4_k_rows_4, q4_k_rows_2 = (
    _rows_intrinsic(n, q4_k.BLOCK_BYTES, 48, 8, _q4_k_shared, _q4_k_ints, _q4_k_float) for n in (16, 8, 4, 2)
)
q5_k_rows_16, q5_k_rows_8, q5_k_rows_4, q5_k_rows_2 = (
    _rows_intrinsic(n, q5_k.BLOCK_BYTES, 48, 8, _q5_k_shared, _q4_k_ints, _q4_k_float) for n in (16, 8, 4, 2)
)
q5_k_pack = q4_k_pack  # the same activation layout (pair sums for the mins)
q6_k_rows_16, q6_k_rows_8, q6_k_rows_4, q6_k_rows_2 = (
    _rows_intrinsic(n, q6_k.BLOCK_BYTES, 60, 16, _q6_k_shared, _q6_k_ints, _q6_k_float) for n in (16, 8, 4, 2)
)

