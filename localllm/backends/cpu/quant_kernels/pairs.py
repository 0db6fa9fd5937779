"""Batched decode: activation rows in pairs, two to a 512-bit vector, and the kernels that dot one weight
row with them (the generated matvec_rows of the types that have pair kernels: Q4_0, Q5_0, Q8_0).

matvec_rows (the server's batched decode) dots each weight row with T activation rows. Per block and
activation row the work is a few integer and float vector operations on eight lanes; with AVX-512 two
activation rows go side by side in one 512-bit vector (lanes 0-7 and 8-15), so each operation serves
two rows (Zen 5 runs 512-bit vpdpbusd / FMA at the 256-bit rate, measured). For that the activations
are first rearranged (pair_activations, once per matmul: O(T*K)) so that each operand is one load:
  pq int8[P, nb*64]      block b of rows 2p and 2p+1: pq[p, 64b : 64b+32], pq[p, 64b+32 : 64b+64]
  pd float32[P, nb*w]    their scales
  ps int32[P, nb*w]      the integer lanes' starting values (below)
in one of two layouts. "Spread" (w = 16): each scale repeated over its row's 8 lanes and each start in
its lane, so that they are plain loads; the fastest while the pairs stay in the L1 cache. "Compact" (w = 2):
the two values per block, spread by a shuffle; the same bytes as the activation arrays themselves. The
driver takes the spread layout while one group of four pairs is at most SPREAD_MAX_BYTES, and goes over
the weight rows in chunks of CHUNK_ROWS, each chunk against every group in turn, so that a group's pairs
are read from L1 for a whole chunk (and the chunk's weight rows from L1 or L2 for the later groups).

The starts: the zero-point types (Q4_0, Q5_0: weights d * (q - zero)) start lane 0 of each row with
-zero * asum, as their one-row block_terms does (ZERO_POINT). Q8_0 (QUAD_ZERO = 128) multiplies its signed
weights as unsigned bytes w + 128 (one xor per weight block, shared by every pair, against the three
operations per pair of applying the weights' signs to the activations); lane i then holds
sum (w_j + 128) a_j over bytes j = 4i..4i+3, and starts from -128 times those four activations' sum,
which pair_activations stores per lane in the spread layout: each lane ends at exactly the integer of
the one-row kernel's lane i (whose vpdpbusd takes |w| and the activations with w's signs).
Every lane thus sees exactly the integer of the one-row kernel's lane and the same float operations, so
every result is bit-identical to vec_dot's.

What bounds the kernels (one core, in L1, Q8_0 at K = 640 against 8 activation rows, variants timed
alternately in one process): with one weight row a call, taking away any one of the three 64-byte loads
per pair and block (activations, scales, starts) saved about a quarter of the time, while taking away
an arithmetic operation (the int-to-float conversion) saved nothing: the loads bound it. Hence four
weight rows a call (PAIR_ROWS), each load serving four. Tried and slower: the scales as one 8-lane
multiply per block for the group and a permute per pair (8-19% slower at four rows, 10% at one), Q5_0's
nibbles unpacked straight into 512 bits (no faster), one prefetch per block instead of one per row
(5-7% slower).
"""

from __future__ import annotations

from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ....jit import exact_kernel, fast_kernel
from .vector import VectorCode

SPREAD_MAX_BYTES = 32768  # the largest spread group (4 pairs of pq + pd + ps) the driver uses
SPREAD_BLOCK_BYTES = 4 * 192  # a spread group's bytes per block
CHUNK_ROWS = 16  # weight rows per step of the batched driver, against each group of pairs in turn


@exact_kernel
def aligned_rows(buffer, n_rows):
    """[n_rows, m] view of the 1D buffer (one 64-byte line longer than n_rows * m elements) starting at a
    64-byte boundary, so that every 64-byte block of a row is one cache line (rows are whole lines long).
    Numba allocates on 32-byte boundaries: half the 512-bit loads would straddle two lines."""
    skip = ((-buffer.ctypes.data) % 64) // buffer.itemsize
    m = (buffer.shape[0] - 64 // buffer.itemsize) // max(n_rows, 1)
    return buffer[skip : skip + n_rows * m].reshape((n_rows, m))


@exact_kernel
def _fill_pair(qs, d, s, zero, quad_zero, pq, pd, ps, p):
    """Pair p of pair_activations into its rows pq, pd, ps (1D views)."""
    n_blocks = d.shape[1]
    width = pd.shape[0] // max(n_blocks, 1) // 2  # lanes per row: 8 (spread) or 1 (compact)
    for half in range(2):
        t = min(2 * p + half, qs.shape[0] - 1)
        row_q, row_d, row_s = qs[t], d[t], s[t]
        for b in range(n_blocks):
            for j in range(32):
                pq[64 * b + 32 * half + j] = row_q[32 * b + j]
            at = 2 * width * b + width * half
            for j in range(width):
                pd[at + j] = row_d[b]
                ps[at + j] = 0
            ps[at] = -zero * row_s[b]
            if quad_zero != 0 and width == 8:
                for j in range(8):
                    quad = 0
                    for k in range(4):
                        quad += row_q[32 * b + 4 * j + k]
                    ps[at + j] = -quad_zero * quad


# From this many pairs pair_activations fills them in parallel (a 512-row prefill's 256 pairs of 640
# took ~160 us on one thread, before each of ~5 products per layer); fewer stay on the calling thread.
PARALLEL_PAIRS = 8


@exact_kernel(parallel=True)
def pair_activations(qs, d, s, zero, quad_zero, pq, pd, ps):
    """Fill pq, pd, ps (as above; [P, ...] with P = (T + 1) // 2, an odd last row paired with itself; the
    layout from pd's width) from the q8_0 activation rows qs int8[T, K], d float32[T, nb], s int32[T, nb];
    zero: the weight type's zero point (0 for none); quad_zero: Q8_0's 128 (the starts per lane, spread
    layout only), else 0."""
    if pq.shape[0] < PARALLEL_PAIRS:
        for p in range(pq.shape[0]):
            _fill_pair(qs, d, s, zero, quad_zero, pq[p], pd[p], ps[p], p)
        return
    for p in prange(pq.shape[0]):
        _fill_pair(qs, d, s, zero, quad_zero, pq[p], pd[p], ps[p], p)


def pair_lanes(v: VectorCode, pointer, b, spread: bool, starts: bool = False):
    """Block b's <16 x ...> from a pair array (pd, or ps with starts): loaded (spread layout), or its
    two values spread (compact): 8 lanes each, or, with starts, lanes 0 and 8 with zeros elsewhere."""
    if spread:
        return v.load(None, pointer, v.builder.mul(b, ir.Constant(b.type, 16)), 16)
    two = v.load(None, pointer, v.builder.mul(b, ir.Constant(b.type, 2)), 2)
    if not starts:
        return v.shuffle(two, [0] * 8 + [1] * 8)
    zeros = ir.Constant(two.type, [0, 0])
    return v.builder.shuffle_vector(two, zeros, v._lane_list([0] + [2] * 7 + [1] + [2] * 7))


def pair_lane(v: VectorCode, pointer, b, half, spread: bool):
    """Row half's value of block b in a pair array (its lane 0 in the spread layout)."""
    width = 8 if spread else 1
    return v.load_scalar(None, pointer, v.offset(v.builder.mul(b, ir.Constant(b.type, 2 * width)), width * half))


def dot_quads_signed_wide(v: VectorCode, x, y):
    """dot_quads_signed on 64 bytes -> <16 x i32> (avx512_vnni only): |x| times y with x's sign, the
    sign applied by a masked negation (AVX-512 has no vpsignb; where x is 0 the product is 0 anyway)."""
    builder = v.builder
    magnitude = v.magnitude(x)
    negative = builder.icmp_signed("<", x, v.constant(0, 64, 8))
    signed = builder.select(negative, builder.sub(v.constant(0, 64, 8), y), y)
    return v._vpdpbusd(None, magnitude, signed)


def dot_quads_offset_wide(v: VectorCode, x, y, starts):
    """The same <16 x i32> for signed x (avx512_vnni only, QUAD_ZERO starts): vpdpbusd of the bytes
    x + 128 (an xor) and y, from starts = -128 times each lane's four bytes of y summed."""
    unsigned = v.builder.xor(x, v.constant(0x80, 64, 8))
    return v._vpdpbusd(starts, unsigned, y)


def float_sums(v: VectorCode, accs):
    """The lane sums of float accumulators holding 8 lanes per dot (<8 x float>: one dot; <16 x float>:
    two side by side), each in VectorCode.float_sum's order (lanes i + i+4, then i + i+2, then 0 + 1),
    with the accumulators' halves gathered into whole vectors at every step: a few shuffles and adds for
    all the dots instead of a halving tree each. Returns the totals in order."""
    builder = v.builder
    width = 8
    vecs = list(accs)
    while width > 1:
        half = width // 2
        merged = []
        k = 0
        while k < len(vecs):
            a = vecs[k]
            b = vecs[k + 1] if k + 1 < len(vecs) and vecs[k + 1].type == a.type else None
            k += 1 if b is None else 2
            dots = a.type.count // width
            low = [d * width + i for d in range(dots) for i in range(half)]
            high = [d * width + half + i for d in range(dots) for i in range(half)]
            if b is not None:
                low += [a.type.count + i for i in low]
                high += [a.type.count + i for i in high]
            other = a if b is None else b
            merged.append(builder.fadd(
                builder.shuffle_vector(a, other, v._lane_list(low)),
                builder.shuffle_vector(a, other, v._lane_list(high)),
                flags=v.PINNED,
            ))
        vecs = merged
        width = half
    i32 = ir.IntType(32)
    return [builder.extract_element(vec, i32(i)) for vec in vecs for i in range(vec.type.count)]


def pair_grid_dot_intrinsic(pair_terms, n_pairs: int, spread: bool, n_rows: int = 1):
    """An intrinsic grid_dot(weights, r0, pq, pd, ps, p0, n_blocks) -> UniTuple(float32, n_rows * 2 * n_pairs):
    weight rows r0..r0+n_rows-1 (weights: uint8[N, row_bytes]) against the activation pairs
    p0..p0+n_pairs-1 (pair_activations), in the order (r0: rows 2 p0, 2 p0 + 1, ...), (r0 + 1: ...), ...;
    each result equals the type's one-row vec_dot bit for bit.

    pair_terms(v, w, pq, pd, ps, b, half, prefetch, spread) emits block b's (ints, scale) for the pair at
    element pointers pq, pd, ps (in the spread or compact layout): both rows side by side (<16 x i32>,
    <16 x float>) for half None, used where the target has AVX-512 BW and VNNI; else row `half` (0 or 1)
    alone, as block_terms would (<8 x ...>). The weight rows' loads of the same pair are the same
    addresses, which LLVM loads once: with several weight rows each activation load serves them all."""

    @intrinsic
    def grid_dot(typingctx, weights, r0, pq, pd, ps, p0, n_blocks):
        sig = types.UniTuple(types.float32, n_rows * 2 * n_pairs)(weights, r0, pq, pd, ps, p0, n_blocks)

        def codegen(context, builder, signature, args):
            weights_, r0_, pq_, pd_, ps_, p0_, n_blocks_ = args
            w_type, _, pq_type, pd_type, ps_type, _, _ = signature.args
            v = VectorCode(context, builder)
            rows = [v.row_pointer(w_type, weights_, v.offset(r0_, k)) for k in range(n_rows)]
            pairs = [
                tuple(v.row_pointer(t, a, v.offset(p0_, j)) for t, a in ((pq_type, pq_), (pd_type, pd_), (ps_type, ps_)))
                for j in range(n_pairs)
            ]
            if v.avx512_vnni:

                def block(b, i):
                    k, j = divmod(i, n_pairs)
                    return pair_terms(v, rows[k], *pairs[j], b, None, rows[k] if j == 0 else None, spread)

                accs = v.grid_sum(n_blocks_, block, n_rows * n_pairs, lanes=16, reduce=False)
            else:

                def block(b, i):
                    k, j = divmod(i, 2 * n_pairs)
                    pair, half = divmod(j, 2)
                    return pair_terms(v, rows[k], *pairs[pair], b, half, rows[k] if j == 0 else None, spread)

                accs = v.grid_sum(n_blocks_, block, n_rows * 2 * n_pairs, reduce=False)
            return context.make_tuple(builder, signature.return_type, float_sums(v, accs))

        return sig, codegen

    return grid_dot


# Weight rows per kernel call in the batched driver: each activation load (and each scale and start) then
# serves four weight rows, and the loads were what bound the one-row kernels (Q8_0 at 640, 8 activation
# rows, 64 weight rows in L1, per weight row: 43.7 -> 31.9 ns with four rows a call, 32.7 with two; Q5_0
# 45.1 -> 34.9, 37.9 with two). A chunk of rows that is not a multiple of four ends with a call that
# overlaps the one before (the same values written again); a matrix of fewer rows goes by vec_dot.
PAIR_ROWS = 4


def pair_kernel_names():
    """Names of the batched-decode kernels (pair_grid_dots), as the generated drivers import them:
    dot_{pairs|spread}_4x{A}: PAIR_ROWS weight rows against A activation rows (8, 4 or 2), on the compact
    (pairs) or spread pair layout."""
    return [f"dot_{'spread' if spread else 'pairs'}_{PAIR_ROWS}x{2 * n_pairs}" for spread in (False, True) for n_pairs in (4, 2, 1)]


def pair_grid_dots(pair_terms):
    """The batched-decode kernels a type's pair_terms gives, by name (pair_kernel_names)."""
    names = iter(pair_kernel_names())
    return {
        next(names): pair_grid_dot_intrinsic(pair_terms, n_pairs, spread, PAIR_ROWS)
        for spread in (False, True) for n_pairs in (4, 2, 1)
    }


@fast_kernel
def store_dots(out, dots, t, r, last, width):
    """out[min(t + j, last), r + k] = dots[width * k + j] for the weight rows k and activation rows j of a
    pair kernel's results (out: float32[T, N]; an odd T's last row comes twice, with the same value)."""
    for k in range(len(dots) // width):
        for j in range(width):
            out[min(t + j, last), r + k] = dots[width * k + j]
