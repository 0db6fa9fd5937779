"""The CPU kernels' building blocks for the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1): the integer
block dot products their vec_dot kernels are built from, and the vector code of their row dequantizers.
(Their formats, with the NumPy packing and the reference quantization rules, are in localllm/quant.)

Element order inside a block: byte j of `qs` holds element j in its low nibble and element j+16 in its
high nibble; bit j of the little-endian uint32 `qh` is the fifth bit of element j.

Why explicit vector code for the dot products: written as plain Numba loops (unpack 16 bytes, multiply,
add), LLVM unrolls the 16-step inner loop and then vectorises the loop over *blocks*, gathering bytes
18 apart one by one: 1.5 GB/s for Q4_0, measured, against 10 GB/s for the byte-aligned Q8_0. So each block
is one short sequence of vector operations (vector.VectorCode, shared with the K-quants): load the 16 quant
bytes, split the nibbles into 32 unsigned lanes (plus the fifth bits for Q5), multiply by the 32 int8
activations with adjacent pairs summed (vpmaddubsw: exact, as quants <= 31 and |a| <= 127 give pair sums
<= 2*31*127 < 32767), widen the pairs to int32 (vpmaddwd by ones) and sum the lanes; where the target has
VNNI the multiply and both sums are one vpdpbusd (VectorCode.dot_quads: the same int32 lanes). With GFNI
the nibble split is one gf2p8affineqb and with AVX-512 the fifth bits are a mask register and a masked add
(VectorCode.split_nibbles, add_where_bits).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .pairs import dot_quads_offset_wide, dot_quads_signed_wide, pair_lane, pair_lanes
from .vector import VectorCode

BLOCK = 32


# ----- integer block dot products (Numba intrinsics) -----


def _unsigned_block_dot(v: VectorCode, quants, act_type, acts_array, act_index):
    """sum_j quants[j] * acts[act_index + j] over 32 lanes, as an int32 scalar (quants: <32 x i8>, 0..31)."""
    acts = v.load(act_type, acts_array, act_index, BLOCK)
    return v.sum(v.dot_quads(quants, acts))


def _nibbles(v: VectorCode, array_type, array, index):
    """The 32 4-bit quants packed in array[index : index + 16], in element order, as <32 x i8>."""
    return v.split_nibbles(array_type, array, index)


def level_nibbles(levels):
    """quants(v, w, base) for a 4-bit type with a table of levels (IQ4_NL): levels[q] for the 32 nibbles
    q packed 16 bytes at w[base:] (element pointer), as signed <32 x i8> in element order."""

    def quants(v: VectorCode, w, base):
        return v.lookup16(levels, _nibbles(v, None, w, base))

    return quants


def _with_fifth_bits(v: VectorCode, quants, array_type, array, index):
    """quants (<32 x i8>, 0..15) plus 16 in lane j where bit j of the little-endian uint32 at array[index:]
    is set."""
    data = v._data(array_type, array)
    pointer = v.builder.bitcast(v.builder.gep(data, [index]), ir.IntType(32).as_pointer())
    return v.add_where_bits(quants, v.builder.load(pointer, align=1), 16)


@intrinsic
def q4_block_dot(typingctx, w, qs, aqs, a):
    """sum_j q_j * aqs[a + j] for the 32 unsigned 4-bit quants (0..15) packed at w[qs : qs + 16], int32."""
    sig = types.int32(w, qs, aqs, a)

    def codegen(context, builder, signature, args):
        w_, qs_, aqs_, a_ = args
        v = VectorCode(context, builder)
        quants = _nibbles(v, signature.args[0], w_, qs_)
        return _unsigned_block_dot(v, quants, signature.args[2], aqs_, a_)

    return sig, codegen


@intrinsic
def q5_block_dot(typingctx, w, qh, qs, aqs, a):
    """sum_j q_j * aqs[a + j] for the 32 unsigned 5-bit quants (0..31) whose fifth bits are the uint32 at
    w[qh : qh + 4] and low bits the nibbles at w[qs : qs + 16], int32."""
    sig = types.int32(w, qh, qs, aqs, a)

    def codegen(context, builder, signature, args):
        w_, qh_, qs_, aqs_, a_ = args
        v = VectorCode(context, builder)
        low = _nibbles(v, signature.args[0], w_, qs_)
        quants = _with_fifth_bits(v, low, signature.args[0], w_, qh_)
        return _unsigned_block_dot(v, quants, signature.args[3], aqs_, a_)

    return sig, codegen


def _first_lane(v: VectorCode, value, lanes: int):
    """A vector holding `value` in lane 0 and zeros elsewhere (to add a per-block scalar to a lane sum)."""
    zeros = ir.Constant(ir.VectorType(value.type, lanes), [value.type(0)] * lanes)
    return v.builder.insert_element(zeros, value, ir.Constant(ir.IntType(32), 0))


def block_totals(v: VectorCode, ints):
    """Each group of eight int32 lanes (a <8 x i32> block sum, or two side by side in a <16 x i32>)
    summed into its first lane, the other lanes zero: the block_sums order (block_terms_kernel). With
    zeros there, row_sum's other seven float lanes stay +0.0 and its halving sum returns lane 0's chain
    unchanged, so the generic row, grid and pair kernels compute one float step per block."""
    builder = v.builder
    totals = v.constant(0, ints.type.count, 32)
    for first in range(0, ints.type.count, 8):
        total = v.sum(v.shuffle(ints, range(first, first + 8)) if ints.type.count > 8 else ints)
        totals = builder.insert_element(totals, total, ir.Constant(ir.IntType(32), first))
    return totals


def block_terms_kernel(block_bytes: int, qs_offset: int, qh_offset=None, zero: int = 0, min_offset=None,
                       block_sums: bool = False):
    """block_terms(v, w, aqs, ad, asum, b, prefetch) for one 32-element block type: block b of the weight
    row w against the q8_0 activation (aqs, ad, asum), all element pointers, as (ints, scale, extra).

    Block b of the row w holds a float16 scale d at byte 0, the nibbles at qs_offset, the fifth bits at
    qh_offset (five-bit types) and a float16 minimum m at min_offset (types with a minimum). Its weights
    are d * (q - zero) [+ m]; against the activation the block contributes
        d * ad[b] * (sum_j q_j * a_j - zero * asum[b])  [+ m * ad[b] * asum[b]].
    The integer sum stays in eight int32 lanes (lane 0 starts from the zero correction), is converted
    and scaled as a vector and added to float accumulators (VectorCode.row_sum / grid_sum): no
    horizontal sum per block, which is what held these types to 7 GB/s; the float order of llama.cpp's
    AVX2 vec_dot. block_sums (marked on the returned function, for row_sum and grid_sum to read): the
    block's eight lanes summed whole, so the float steps are one fused multiply-add per block, acc =
    fma(float(sum), d * ad[b], acc), block after block (FloatSums._block_sums_grid, with the bits of
    block_totals' lane 0 in row_sum's eight lanes): the order of llama.cpp's re-laid AVX2 kernels
    (repack.cpp's gemv/gemm for Q4_0, which it takes on AVX2 for every matrix of N % 8 == 0), and one
    the 16-row lane kernels follow with one accumulator per row instead of eight (tile_sums.py).
    """

    def block_terms(v: VectorCode, w, aqs, ad, asum, b, prefetch):
        builder = v.builder
        base = builder.mul(b, ir.Constant(b.type, block_bytes))
        quants = _nibbles(v, None, w, v.offset(base, qs_offset))
        if prefetch is not None:  # the row pointer to prefetch PREFETCH_BYTES past block b of
            v.prefetch(None, prefetch, base)
        if qh_offset is not None:
            quants = _with_fifth_bits(v, quants, None, w, v.offset(base, qh_offset))
        acts = v.load(None, aqs, builder.mul(b, ir.Constant(b.type, BLOCK)), BLOCK)
        act_scale = v.load_scalar(None, ad, b)
        act_sum = v.resize(v.load_scalar(None, asum, b), 32)
        # The zero correction starts lane 0's sum (with VNNI, vpdpbusd's accumulator: no extra op).
        start = _first_lane(v, builder.mul(act_sum, ir.Constant(act_sum.type, -zero)), 8) if zero else None
        ints = v.dot_quads(quants, acts, start)
        scale = builder.fmul(v.load_f16_splat(None, w, base), v.splat(act_scale, 8), flags=v.PINNED)
        if min_offset is None:
            return ints, scale, None
        minimum = v.load_f16_splat(None, w, v.offset(base, min_offset), 1)
        minimum = builder.extract_element(minimum, ir.Constant(ir.IntType(32), 0))
        product = builder.fmul(minimum, act_scale, flags=v.PINNED)
        extra = builder.fmul(product, builder.sitofp(act_sum, ir.FloatType()), flags=v.PINNED)
        return ints, scale, extra

    block_terms.block_sums = block_sums
    return block_terms


def pair_terms_kernel(block_bytes: int, qs_offset: int, qh_offset=None, block_sums: bool = False):
    """pair_terms(v, w, pq, pd, ps, b, half, prefetch) for a zero-point type (Q4_0, Q5_0): block_terms
    against an activation pair (pairs.pair_activations, whose ps holds each row's zero correction in the
    lane block_terms starts it in), both rows in 512-bit vectors for half None, else row half;
    block_sums as block_terms_kernel's (each row's block sum in its first lane)."""
    totals = block_totals if block_sums else (lambda v, ints: ints)

    def pair_terms(v: VectorCode, w, pq, pd, ps, b, half, prefetch, spread):
        builder = v.builder
        base = builder.mul(b, ir.Constant(b.type, block_bytes))
        quants = _nibbles(v, None, w, v.offset(base, qs_offset))
        if prefetch is not None:
            v.prefetch(None, prefetch, base)
        if qh_offset is not None:
            quants = _with_fifth_bits(v, quants, None, w, v.offset(base, qh_offset))
        at64 = builder.mul(b, ir.Constant(b.type, 2 * BLOCK))
        if half is None:
            acts = v.load(None, pq, at64, 2 * BLOCK)
            ints = totals(v, v.dot_quads(v.join(quants, quants), acts, pair_lanes(v, ps, b, spread, starts=True)))
            return ints, builder.fmul(v.load_f16_splat(None, w, base, 16), pair_lanes(v, pd, b, spread), flags=v.PINNED)
        acts = v.load(None, pq, v.offset(at64, BLOCK * half), BLOCK)
        ints = totals(v, v.dot_quads(quants, acts, _first_lane(v, pair_lane(v, ps, b, half, spread), 8)))
        act_scale = pair_lane(v, pd, b, half, spread)
        return ints, builder.fmul(v.load_f16_splat(None, w, base), v.splat(act_scale, 8), flags=v.PINNED)

    return pair_terms


def f16_scale(v: VectorCode, w, base, lanes: int = 8):
    """A block's scale d, the float16 at its byte 0, on `lanes` float lanes (Q8_0, IQ4_NL)."""
    return v.load_f16_splat(None, w, base, lanes)


def signed_block_terms_kernel(block_bytes: int, quants, scale=f16_scale, block_sums: bool = False):
    """block_terms(v, w, aqs, ad, asum, b, prefetch) for a type of signed quants without zero point or
    minimum (Q8_0, IQ4_NL, MXFP4): weights d * q, d = scale(v, w, base of the block, lanes) (the float16
    at byte 0, or MXFP4's E8M0), q = quants(v, w, base of the block) (<32 x i8>, |q| <= 127). The 32
    products in eight int32 lanes (dot_quads_signed: lane j the exact sum over quad j) and the scale
    d * ad as a vector; asum unused. block_sums: block_terms_kernel's."""

    def block_terms(v: VectorCode, w, aqs, ad, asum, b, prefetch):
        builder = v.builder
        base = builder.mul(b, ir.Constant(b.type, block_bytes))
        weights = quants(v, w, base)
        if prefetch is not None:  # the row pointer to prefetch PREFETCH_BYTES past block b of
            v.prefetch(None, prefetch, base)
        acts = v.load(None, aqs, builder.mul(b, ir.Constant(b.type, BLOCK)), BLOCK)
        ints = v.dot_quads_signed(weights, acts)
        block_scale = builder.fmul(scale(v, w, base), v.splat(v.load_scalar(None, ad, b), 8), flags=v.PINNED)
        return ints, block_scale, None

    block_terms.block_sums = block_sums
    return block_terms


def signed_pair_terms_kernel(block_bytes: int, quants, scale=f16_scale, block_sums: bool = False):
    """pair_terms for a signed_block_terms_kernel type (pairs.py's QUAD_ZERO = 128): against an activation
    pair (pairs.pair_activations), both rows in 512-bit vectors for half None, else row half (ps unused).
    Both rows: in the spread layout the weights as unsigned bytes q + 128 from ps's per-lane starts; in
    the compact one, which has no room for those, the activations take the weights' signs by a masked
    negation (AVX-512 has no vpsignb). Every lane the same integer as block_terms'; block_sums as
    block_terms_kernel's (each row's block sum in its first lane)."""
    totals = block_totals if block_sums else (lambda v, ints: ints)

    def pair_terms(v: VectorCode, w, pq, pd, ps, b, half, prefetch, spread):
        builder = v.builder
        base = builder.mul(b, ir.Constant(b.type, block_bytes))
        weights = quants(v, w, base)
        if prefetch is not None:
            v.prefetch(None, prefetch, base)
        at64 = builder.mul(b, ir.Constant(b.type, 2 * BLOCK))
        if half is None:
            acts = v.load(None, pq, at64, 2 * BLOCK)
            both = v.join(weights, weights)
            if spread:
                ints = dot_quads_offset_wide(v, both, acts, pair_lanes(v, ps, b, spread))
            else:
                ints = dot_quads_signed_wide(v, both, acts)
            return totals(v, ints), builder.fmul(scale(v, w, base, 16), pair_lanes(v, pd, b, spread), flags=v.PINNED)
        acts = v.load(None, pq, v.offset(at64, BLOCK * half), BLOCK)
        ints = totals(v, v.dot_quads_signed(weights, acts))
        act_scale = pair_lane(v, pd, b, half, spread)
        return ints, builder.fmul(scale(v, w, base), v.splat(act_scale, 8), flags=v.PINNED)

    return pair_terms


def row_dot_kernel(block_terms):
    """An intrinsic row_dot(w, aqs, ad, asum, n_blocks) -> float32 over one weight row (w: uint8[row
    bytes]) and one q8_0 activation, from a block_terms_kernel."""

    @intrinsic
    def row_dot(typingctx, w, aqs, ad, asum, n_blocks):
        sig = types.float32(w, aqs, ad, asum, n_blocks)

        def codegen(context, builder, signature, args):
            v = VectorCode(context, builder)
            pointers = [v._data(t, a) for t, a in zip(signature.args[:4], args[:4])]
            return v.row_sum(args[4], lambda b: block_terms(v, *pointers, b, pointers[0]), getattr(block_terms, "block_sums", False))

        return sig, codegen

    return row_dot


# ----- block dequantizers (Numba intrinsics) -----
#
# The same block-at-a-time vector code for dequantize_row: as plain loops it runs at 2 Gelem/s, measured
# (the same gathers over blocks). Exactness is kept: integer quants convert to float32 exactly, and the
# multiply (then the add of the minimum) are separate IEEE operations without fast-math flags, in the
# order of the NumPy reference, so each lane equals d * float(q - zero) [+ m] as computed there.


def _splat(builder, value, lanes: int):
    """A vector of `lanes` copies of a scalar."""
    vector_type = ir.VectorType(value.type, lanes)
    single = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(single, single, ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))


def _block_dequantizer(five_bits: bool, with_min: bool):
    """An intrinsic dequantize_block(src, qh, qs, zero, d, m, out, o): out[o : o + 32] = d * (q - zero),
    plus m if with_min; q = the nibbles at src[qs : qs + 16], with the fifth bits of the uint32 at src[qh:]
    if five_bits (otherwise qh is ignored, as m is without a minimum)."""

    @intrinsic
    def dequantize_block(typingctx, src, qh, qs, zero, d, m, out, o):
        sig = types.void(src, qh, qs, zero, d, m, out, o)

        def codegen(context, builder, signature, args):
            src_, qh_, qs_, zero_, d_, m_, out_, o_ = args
            v = VectorCode(context, builder)
            quants = _nibbles(v, signature.args[0], src_, qs_)
            if five_bits:
                quants = _with_fifth_bits(v, quants, signature.args[0], src_, qh_)
            zero32 = context.cast(builder, zero_, signature.args[3], types.int32)
            values = builder.sub(v.widen(quants, 32, signed=False), _splat(builder, zero32, BLOCK))
            floats = builder.sitofp(values, ir.VectorType(ir.FloatType(), BLOCK))
            scale = context.cast(builder, d_, signature.args[4], types.float32)
            result = builder.fmul(_splat(builder, scale, BLOCK), floats)
            if with_min:
                minimum = context.cast(builder, m_, signature.args[5], types.float32)
                result = builder.fadd(result, _splat(builder, minimum, BLOCK))
            data = context.make_array(signature.args[6])(context, builder, out_).data
            pointer = builder.bitcast(builder.gep(data, [o_]), ir.VectorType(ir.FloatType(), BLOCK).as_pointer())
            builder.store(result, pointer, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return dequantize_block


dequantize_q4_block = _block_dequantizer(five_bits=False, with_min=False)
dequantize_q4_min_block = _block_dequantizer(five_bits=False, with_min=True)
dequantize_q5_block = _block_dequantizer(five_bits=True, with_min=False)
dequantize_q5_min_block = _block_dequantizer(five_bits=True, with_min=True)
