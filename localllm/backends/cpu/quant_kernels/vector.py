"""Vector building blocks for the block dot products: `VectorCode` (LLVM IR for a few vector operations,
emitted from inside Numba intrinsics, per instruction set) and the grid dot-product intrinsics built on
it (the batched decode's pair kernels, built on the same, are in pairs.py). Every quant type's fast
kernels are made from these; the instruction-set paths give identical integers (tests/backends/cpu/test_quant_isa.py).
"""

from __future__ import annotations

from llvmlite import ir
from llvmlite import binding as llvm_binding
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .vector_sums import FloatSums
from .vector_wide import WideOps

# ----- Vector building blocks for the block dot products -----
#
# Numba's auto-vectorizer turns an unpack-multiply-add loop over 4-bit quants into 128-bit code that
# widens every byte to 16 bits (measured 3.2 GB/s for Q4_K). llama.cpp's AVX2 kernels instead multiply
# unsigned quant bytes by signed activation bytes with vpmaddubsw (adjacent pairs summed into int16),
# then multiply-add those int16 pairs by the sub-block scales with vpmaddwd (pairs summed into int32):
# two instructions per 32 weights. `VectorCode` emits the same operations as LLVM IR from inside a
# Numba @intrinsic, so a kernel states them in a few readable lines:
#
#   dot_pairs(u, s)      <32 x u8> * <32 x i8>  -> <16 x i16>, lane i = u[2i]*s[2i] + u[2i+1]*s[2i+1]
#   scale_pairs(p, sc)   <16 x i16> * <16 x i16> -> <8 x i32>, lane i = p[2i]*sc[2i] + p[2i+1]*sc[2i+1]
#
# dot_pairs is exact (vpmaddubsw saturates the int16 pair sums) while the unsigned quants are at most
# 127: 2*127*128 = 32512 < 32767 for any int8 activation; every caller's quants are 0..63. Where the
# compile target has AVX2 the two map to vpmaddubsw / vpmaddwd; elsewhere (or with VECTOR_ISA =
# "generic", which the tests use to check that path too) they are plain widening multiplies and pairwise
# adds that any LLVM target lowers. Either way the integer results are identical.
#
# Numba's cache keys compiled code on the CPU name and features, so a cached kernel is never reused on a
# machine with a different instruction set.

# How far ahead of the block being read a row kernel asks for the weights (VectorCode.prefetch). The rows
# of a weight matrix are contiguous, so 8 KiB past the block is some rows further on, whichever row of a
# grid kernel asks. Measured over Gemma 3 270M's weights in decode order (streamed from memory), against
# the 1024 bytes (past the same place in the next group of rows) used before: Q5_0 matvecs 2.9 -> 1.9 ms
# a token, the Q8_0 output projection about 10% faster; 4-10 KiB all within noise of each other.
PREFETCH_BYTES = 8192
# Into which cache (llvm.prefetch's locality: 3 = prefetcht0, every level; 2 = prefetcht1, L2 and
# out; 0 = prefetchnta). Measured on a Zen 4 (2026-11-23, scripts/bench_quant.py --mb 256): with
# prefetcht0 the lines asked for 8 KiB ahead land in the 32 KiB L1 and push out the activation, which
# every row reads again; at K = 14336 (Llama-3-8B's ffn_down) a Q6_K matvec ran at 14-15 GB/s on one
# thread against 26 at K = 4096; with prefetcht1 22-26, Q4_K 15.8 against 10.5-14.6. At K = 4096 Q4_K
# the same, Q6_K 22-24 against 25-26 (two rounds). Model decode: Gemma 3 270M tg128 +9-11%, the
# 8B-shaped file +9-21% on one thread.
# prefetchnta (lines that skip L2) helped an isolated matvec on a Zen 5 but cost Gemma's decode 14% here.
PREFETCH_LOCALITY = 2

# "auto": the best of the paths below that the target has; "avx2": AVX2 only (no VNNI, no AVX-512
# masks), "generic": portable IR only. The tests compile every path and compare the integer results.
VECTOR_ISA = "auto"
VECTOR_ISAS = ("auto", "avx2", "generic")
# The target features that only "auto" uses (every feature a VECTOR_ISA == "auto" check reads: here, in
# float_panels_ir and amx_tiles; tests/backends/cpu/test_quant_isa.py holds the two lists together). On
# a target with none of them, "auto" emits exactly the "avx2" path's code.
AUTO_ONLY_FEATURES = frozenset({"+avxvnni", "+avx512f", "+avx512bw", "+avx512vl", "+avx512vnni", "+gfni", "+amx-tile", "+amx-bf16"})


def ll_version_major() -> int:
    return llvm_binding.llvm_version_info[0]


def _target_features(context) -> set:
    return set((getattr(context.codegen(), "_tm_features", "") or "").split(","))


def distinct_isas(context) -> tuple[str, ...]:
    """The VECTOR_ISAS whose code differs on this compile target: all three, or "auto" and "generic"
    where the target has none of AUTO_ONLY_FEATURES ("avx2" would compile "auto"'s code again; the
    per-path tests compile each path afresh, so on an AVX2-only machine a third of their time)."""
    if AUTO_ONLY_FEATURES & _target_features(context):
        return VECTOR_ISAS
    return tuple(isa for isa in VECTOR_ISAS if isa != "avx2")


def _target_has_avx2(context) -> bool:
    return VECTOR_ISA != "generic" and "+avx2" in _target_features(context)


def _target_has_vnni(context) -> bool:
    """vpdpbusd on 256-bit vectors: AVX-VNNI, or AVX-512 VNNI with VL."""
    if VECTOR_ISA != "auto":
        return False
    features = _target_features(context)
    return "+avx2" in features and ("+avxvnni" in features or {"+avx512vnni", "+avx512vl"} <= features)


def _target_has_avx512_vnni(context) -> bool:
    """vpdpbusd and byte masks on 512-bit vectors: AVX-512 F, BW and VNNI."""
    return VECTOR_ISA == "auto" and {"+avx512f", "+avx512bw", "+avx512vnni"} <= _target_features(context)


def _target_has_gfni(context) -> bool:
    """gf2p8affineqb on 256-bit vectors (GFNI with AVX)."""
    return VECTOR_ISA == "auto" and {"+gfni", "+avx2"} <= _target_features(context)


def _target_has_avx512_bw(context) -> bool:
    """Byte and word multiply-adds on 512-bit vectors (vpmaddubsw / vpmaddwd zmm): AVX-512 F and BW."""
    return VECTOR_ISA == "auto" and {"+avx512f", "+avx512bw"} <= _target_features(context)


def _target_has_avx512_masks(context) -> bool:
    """Byte-lane masks (k registers) for 256-bit vectors: AVX-512 BW with VL."""
    return VECTOR_ISA == "auto" and {"+avx512bw", "+avx512vl"} <= _target_features(context)


class VectorCode(WideOps, FloatSums):
    """Emits vector IR into one Numba intrinsic's body (builder) for the compile target (context)."""

    def __init__(self, context, builder):
        self.context = context
        self.builder = builder
        self.avx2 = _target_has_avx2(context)
        self.vnni = _target_has_vnni(context)
        self.avx512_masks = _target_has_avx512_masks(context)
        self.gfni = _target_has_gfni(context)
        self.avx512_vnni = _target_has_avx512_vnni(context)
        self.avx512_bw = _target_has_avx512_bw(context)

    # -- construction --

    @staticmethod
    def vector_type(lanes: int, bits: int) -> ir.VectorType:
        return ir.VectorType(ir.IntType(bits), lanes)

    def constant(self, value: int, lanes: int, bits: int) -> ir.Constant:
        return ir.Constant(self.vector_type(lanes, bits), [value] * lanes)

    def offset(self, base, delta: int):
        """base (an index value) + delta."""
        return self.builder.add(base, ir.Constant(base.type, delta))

    def _data(self, array_type, array):
        """The element pointer of a Numba array value, or `array` itself when array_type is None (a
        pointer from row_pointer): every load below takes either."""
        if array_type is None:
            return array
        return self.context.make_array(array_type)(self.context, self.builder, array).data

    def row_pointer(self, array_type, array, row):
        """Pointer to the first element of row `row` of a 2D array (rows contiguous inside; any row
        stride), for the loads below with array_type None. For a 1D array, the array's own data (row 0)."""
        builder = self.builder
        arr = self.context.make_array(array_type)(self.context, builder, array)
        if array_type.ndim == 1:
            return arr.data
        stride = cgutils.unpack_tuple(builder, arr.strides)[0]
        as_bytes = builder.bitcast(arr.data, ir.IntType(8).as_pointer())
        moved = builder.gep(as_bytes, [builder.mul(self.resize(row, stride.type.width), stride)])
        return builder.bitcast(moved, arr.data.type)

    def load(self, array_type, array, index, lanes: int):
        """array[index : index + lanes] as a vector of the array's element width (no alignment assumed)."""
        data = self._data(array_type, array)
        vector_pointer = ir.VectorType(data.type.pointee, lanes).as_pointer()
        pointer = self.builder.bitcast(self.builder.gep(data, [index]), vector_pointer)
        return self.builder.load(pointer, align=1)

    def from_scalars(self, values, bits: int):
        """A vector of the given integer scalars (truncated or sign-extended to `bits`)."""
        vec = ir.Constant(self.vector_type(len(values), bits), ir.Undefined)
        for lane, value in enumerate(values):
            vec = self.builder.insert_element(vec, self.resize(value, bits), ir.Constant(ir.IntType(32), lane))
        return vec

    def resize(self, value, bits: int, signed: bool = True):
        width = value.type.width
        if width > bits:
            return self.builder.trunc(value, ir.IntType(bits))
        if width < bits:
            return (self.builder.sext if signed else self.builder.zext)(value, ir.IntType(bits))
        return value

    # -- lane-wise operations --

    @staticmethod
    def _lane_list(lanes) -> ir.Constant:
        lanes = list(lanes)
        return ir.Constant(ir.VectorType(ir.IntType(32), len(lanes)), lanes)

    def shuffle(self, vec, lanes):
        """Lanes of vec picked by index (the result has len(lanes) lanes)."""
        return self.builder.shuffle_vector(vec, vec, self._lane_list(lanes))

    def join(self, a, b):
        """The lanes of a followed by those of b (same lane type)."""
        return self.builder.shuffle_vector(a, b, self._lane_list(range(a.type.count + b.type.count)))

    def widen(self, vec, bits: int, signed: bool = True):
        target = self.vector_type(vec.type.count, bits)
        return self.builder.sext(vec, target) if signed else self.builder.zext(vec, target)

    def bitcast(self, vec, lanes: int, bits: int):
        return self.builder.bitcast(vec, self.vector_type(lanes, bits))

    def and_(self, vec, mask: int):
        return self.builder.and_(vec, self.constant(mask, vec.type.count, vec.type.element.width))

    def shr(self, vec, count):
        """Logical shift right by `count` (an int, or a list of per-lane counts)."""
        if isinstance(count, int):
            return self.builder.lshr(vec, self.constant(count, vec.type.count, vec.type.element.width))
        return self.builder.lshr(vec, ir.Constant(vec.type, list(count)))

    def shl(self, vec, count: int):
        return self.builder.shl(vec, self.constant(count, vec.type.count, vec.type.element.width))

    def or_(self, a, b):
        return self.builder.or_(a, b)

    def add(self, a, b):
        """a + b, where a may be None (the start of a sum)."""
        return b if a is None else self.builder.add(a, b)

    def mul(self, a, b):
        return self.builder.mul(a, b)

    def sum(self, vec):
        """The (wrapping) sum of all lanes, a scalar."""
        fnty = ir.FunctionType(vec.type.element, [vec.type])
        name = f"llvm.vector.reduce.add.v{vec.type.count}i{vec.type.element.width}"
        return self.builder.call(cgutils.get_or_insert_function(self.builder.module, fnty, name), [vec])

    # -- the two multiply-adds --

    def _pairwise_add(self, vec):
        even = self.shuffle(vec, range(0, vec.type.count, 2))
        odd = self.shuffle(vec, range(1, vec.type.count, 2))
        return self.builder.add(even, odd)

    def _x86(self, name: str, args, result_type):
        fnty = ir.FunctionType(result_type, [arg.type for arg in args])
        return self.builder.call(cgutils.get_or_insert_function(self.builder.module, fnty, name), args)

    def dot_pairs(self, unsigned_bytes, signed_bytes):
        """<32 x i8> (as unsigned) * <32 x i8> (signed) -> <16 x i16>: adjacent products summed."""
        if self.avx2:
            args = [unsigned_bytes, signed_bytes]
            return self._x86("llvm.x86.avx2.pmadd.ub.sw", args, self.vector_type(16, 16))
        products = self.builder.mul(self.widen(unsigned_bytes, 16, signed=False), self.widen(signed_bytes, 16))
        return self._pairwise_add(products)

    def magnitude(self, x):
        """|x| per byte lane (vpabsb; -128 stays 0x80, which the multiply-adds read as unsigned 128)."""
        return self._x86(f"llvm.abs.v{x.type.count}i8", [x, ir.Constant(ir.IntType(1), 0)], x.type)

    def dot_pairs_signed(self, x, y, magnitude=None):
        """<32 x i8> * <32 x i8>, both signed -> <16 x i16>: adjacent products summed.

        Exact for |x| <= 127 and y != -128 (on AVX2 it is vpmaddubsw(|x|, y * sign(x)), as llama.cpp
        does); q8_0/q8_k activations lie in -127..127 by construction. magnitude: |x|, where the caller
        has it already (legacy_tiles.SIGNED_BY_ACTIVATION: the activation's, computed once per product).
        """
        if self.avx2:
            magnitude = self.magnitude(x) if magnitude is None else magnitude
            signed = self._x86("llvm.x86.avx2.psign.b", [y, x], y.type)
            return self._x86("llvm.x86.avx2.pmadd.ub.sw", [magnitude, signed], self.vector_type(16, 16))
        return self._pairwise_add(self.builder.mul(self.widen(x, 16), self.widen(y, 16)))

    def split_nibbles(self, array_type, array, index):
        """The 16 bytes at array[index:] as <32 x i8>: their low nibbles, then their high nibbles.

        With GFNI: the 16 bytes loaded into both halves of the vector (a broadcast load) and one
        gf2p8affineqb, whose bit matrix is per 64-bit lane: "keep bits 0-3" in the low half, "bits 4-7
        down to 0-3" in the high half. Elsewhere an and, a shift and a join. Same bytes either way."""
        packed = self.load(array_type, array, index, 16)
        if not self.gfni:
            return self.join(self.and_(packed, 0x0F), self.shr(packed, 4))
        both = self.shuffle(packed, list(range(16)) * 2)
        # Result bit i = parity(matrix byte 7-i AND x): byte 7-i of "low" selects bit i, of "high" bit i+4.
        low = [0, 0, 0, 0, 0x08, 0x04, 0x02, 0x01]
        high = [0, 0, 0, 0, 0x80, 0x40, 0x20, 0x10]
        matrix = ir.Constant(both.type, low * 2 + high * 2)
        return self._x86("llvm.x86.vgf2p8affineqb.256", [both, matrix, ir.Constant(ir.IntType(8), 0)], both.type)

    def add_where_bits(self, vec, bits, value: int):
        """vec (<32 x i8>) with `value` added in lane j where bit j of the i32 `bits` is set (wrapping).

        With AVX-512 the bits become a mask register directly (kmovd) and the add is a masked vpaddb;
        elsewhere each lane's byte is picked out (shuffle), tested (and, compare) and selected."""
        builder = self.builder
        lanes = vec.type.count
        added = builder.add(vec, self.constant(value, lanes, 8))
        if self.avx512_masks:
            mask = builder.bitcast(bits, ir.VectorType(ir.IntType(1), lanes))
            return builder.select(mask, added, vec)
        as_bytes = builder.bitcast(bits, self.vector_type(4, 8))
        spread = self.shuffle(as_bytes, [j // 8 for j in range(lanes)])  # lane j holds byte j // 8 ...
        selected = builder.and_(spread, ir.Constant(spread.type, [1 << (j % 8) for j in range(lanes)]))  # ... bit j % 8
        is_set = builder.icmp_unsigned("!=", selected, self.constant(0, lanes, 8))
        return builder.select(is_set, added, vec)

    def lookup16(self, table, indices):
        """table[indices] per lane: a constant table of 16 int8 values, <32 x i8> indices in 0..15."""
        if self.avx2:  # vpshufb looks up within each 128-bit half, so the table goes in both halves
            both_halves = ir.Constant(indices.type, [int(value) for value in table] * 2)
            return self._x86("llvm.x86.avx2.pshuf.b", [both_halves, indices], indices.type)
        result = self.constant(0, indices.type.count, 8)
        for i, value in enumerate(table):
            hit = self.builder.icmp_unsigned("==", indices, self.constant(i, indices.type.count, 8))
            result = self.builder.select(hit, self.constant(int(value), indices.type.count, 8), result)
        return result

    def scale_pairs(self, pairs, scales):
        """<16 x i16> * <16 x i16> -> <8 x i32>: adjacent products summed."""
        if self.avx2:
            return self._x86("llvm.x86.avx2.pmadd.wd", [pairs, scales], self.vector_type(8, 32))
        return self._pairwise_add(self.builder.mul(self.widen(pairs, 32), self.widen(scales, 32)))

    # -- four products at a time: <32 x i8> x <32 x i8> -> <8 x i32>, lane i the sum of the products of
    # bytes 4i..4i+3 (plus lane i of `start`, if given) --
    #
    # Where the target has VNNI this is one vpdpbusd (u8 x s8 products, summed in int32 without
    # saturation); elsewhere scale_pairs(dot_pairs(...), ones), whose lanes are the same sums. Both are
    # exact in the ranges dot_pairs is (unsigned quants <= 127), so every lane is the same integer.

    def _vpdpbusd(self, start, unsigned_bytes, signed_bytes):
        """256-bit (32 bytes) or, with avx512_vnni, 512-bit (64 bytes)."""
        lanes = unsigned_bytes.type.count // 4
        if start is None:
            start = self.constant(0, lanes, 32)
        if ll_version_major() >= 22:  # LLVM 22 takes the bytes as <N x i8>; older ones as <N/4 x i32>
            args = [start, unsigned_bytes, signed_bytes]
        else:
            args = [start, self.bitcast(unsigned_bytes, lanes, 32), self.bitcast(signed_bytes, lanes, 32)]
        return self._x86(f"llvm.x86.avx512.vpdpbusd.{32 * lanes}", args, self.vector_type(lanes, 32))

    def dot_quads(self, unsigned_bytes, signed_bytes, start=None):
        """<32 x i8> (as unsigned, <= 127) * <32 x i8> (signed) -> <8 x i32> (+ start)."""
        if self.vnni:
            return self._vpdpbusd(start, unsigned_bytes, signed_bytes)
        sums = self.scale_pairs(self.dot_pairs(unsigned_bytes, signed_bytes), self.constant(1, 16, 16))
        return sums if start is None else self.builder.add(start, sums)

    def dot_quads_signed(self, x, y, start=None, magnitude=None):
        """<32 x i8> * <32 x i8>, both signed -> <8 x i32> (+ start); the ranges and `magnitude` of
        dot_pairs_signed."""
        if self.vnni:
            signed = self._x86("llvm.x86.avx2.psign.b", [y, x], y.type)
            return self._vpdpbusd(start, self.magnitude(x) if magnitude is None else magnitude, signed)
        sums = self.scale_pairs(self.dot_pairs_signed(x, y, magnitude), self.constant(1, 16, 16))
        return sums if start is None else self.builder.add(start, sums)


    # -- whole rows: float accumulation across blocks, as llama.cpp's AVX2 kernels do --

    def load_f16_splat(self, array_type, array, byte_index, lanes: int = 8):
        """The little-endian float16 at array[byte_index : byte_index + 2] (a uint8 array), converted to
        float32 and broadcast to `lanes` lanes.

        Why a broadcast rather than a scalar: LLVM loads a lone half into a vector register with vpinsrw,
        which merges into (so waits for) whatever that register last held, often a float accumulator:
        measured 7 cycles a Q8_0 block instead of 4. A broadcast load writes the whole register.
        """
        data = self._data(array_type, array)
        pointer = self.builder.bitcast(self.builder.gep(data, [byte_index]), ir.IntType(16).as_pointer())
        bits = self.splat(self.builder.load(pointer, align=1), lanes)
        halves = self.builder.bitcast(bits, ir.VectorType(ir.HalfType(), lanes))
        return self.builder.fpext(halves, ir.VectorType(ir.FloatType(), lanes))

    def load_e8m0_half_splat(self, array_type, array, byte_index, lanes: int = 8):
        """The E8M0 exponent e at array[byte_index] (a uint8 array) as float32 2^(e - 128) (ggml's
        E8M0_TO_FP32_HALF: e 0 and 1 give the subnormals 2^-128 and 2^-127), broadcast to `lanes` lanes:
        the bits (e - 1) << 23, or 0x00200000 << e below e = 2. Exact, as the scalar quant.mxfp4.scale_of."""
        builder, i32 = self.builder, ir.IntType(32)
        data = self._data(array_type, array)
        e = builder.zext(builder.load(builder.gep(data, [byte_index])), i32)
        normal = builder.shl(builder.sub(e, i32(1)), i32(23))
        subnormal = builder.shl(i32(0x00200000), e)
        bits = builder.select(builder.icmp_unsigned("<", e, i32(2)), subnormal, normal)
        return self.splat(builder.bitcast(bits, ir.FloatType()), lanes)

    def prefetch(self, array_type, array, byte_index, distance=None):
        """Hint the cache to fetch the line `distance` (default PREFETCH_BYTES) bytes past
        array[byte_index] into the level PREFETCH_LOCALITY says (never faults)."""
        if distance is None:
            distance = PREFETCH_BYTES
        data = self._data(array_type, array)
        pointer = self.builder.gep(data, [self.offset(byte_index, distance)])
        i8p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i8p, ir.IntType(32), ir.IntType(32), ir.IntType(32)])
        fn = cgutils.get_or_insert_function(self.builder.module, fnty, "llvm.prefetch.p0i8")
        i32 = ir.IntType(32)
        self.builder.call(fn, [self.builder.bitcast(pointer, i8p), i32(0), i32(PREFETCH_LOCALITY), i32(1)])

    def store_dequantized(self, out_type, out, index, quants, signed: bool, steps, offsets=None):
        """out[index : index + 32] = step * float(q) [- offset], lane by lane, as IEEE float32 operations
        without fast-math flags (so each lane equals the scalar reference exactly).

        quants: <32 x i8> (signed or unsigned); steps and offsets: (first 16 lanes, last 16 lanes) pairs of
        float32 scalars (K-quant scales change every 16 or 32 elements)."""
        builder = self.builder
        lanes = quants.type.count
        floats_type = ir.VectorType(ir.FloatType(), lanes)

        def halves(pair):
            first, last = (self.splat(value, lanes // 2) for value in pair)
            return self.join(first, last)

        values = (builder.sitofp if signed else builder.uitofp)(quants, floats_type)
        result = builder.fmul(halves(steps), values)
        if offsets is not None:
            result = builder.fsub(result, halves(offsets))
        data = self._data(out_type, out)
        pointer = builder.bitcast(builder.gep(data, [index]), floats_type.as_pointer())
        builder.store(result, pointer, align=4)

    def load_scalar(self, array_type, array, index):
        data = self._data(array_type, array)
        return self.builder.load(self.builder.gep(data, [index]))

    def splat(self, value, lanes: int):
        vec = ir.Constant(ir.VectorType(value.type, lanes), ir.Undefined)
        vec = self.builder.insert_element(vec, value, ir.Constant(ir.IntType(32), 0))
        return self.builder.shuffle_vector(vec, vec, self._lane_list([0] * lanes))



def grid_dot_intrinsic(block_terms, n_weight_rows: int, n_act_rows: int):
    """An intrinsic grid_dot(weights, r0, aqs, ad, asum, t0, n_blocks) -> UniTuple(float32, R*T) for
    R = n_weight_rows, T = n_act_rows: the dot products of weight rows r0..r0+R-1 (weights: uint8[N,
    row_bytes]) with activation rows t0..t0+T-1 (aqs, ad, asum: [rows, ...] in the pairing format, or 1D
    for a single activation, t0 then ignored), in the order (r0, t0), (r0, t0+1), ..., (r0+1, t0), ...

    block_terms(v, w, aqs, ad, asum, b, prefetch) emits block b's (ints, scale[, extra]) for one weight
    row and one activation row given as element pointers (prefetch: a row pointer to prefetch ahead of,
    or None) (VectorCode methods take pointers with
    array_type None); it is the same function the type's one-row row_dot uses, and VectorCode.grid_sum
    keeps each dot's float order, so every result equals that row_dot's bit for bit."""

    @intrinsic
    def grid_dot(typingctx, weights, r0, aqs, ad, asum, t0, n_blocks):
        n_dots = n_weight_rows * n_act_rows
        sig = types.UniTuple(types.float32, n_dots)(weights, r0, aqs, ad, asum, t0, n_blocks)

        def codegen(context, builder, signature, args):
            weights_, r0_, aqs_, ad_, asum_, t0_, n_blocks_ = args
            w_type, _, aqs_type, ad_type, asum_type, _, _ = signature.args
            v = VectorCode(context, builder)
            rows = [v.row_pointer(w_type, weights_, v.offset(r0_, i)) for i in range(n_weight_rows)]
            acts = [
                tuple(v.row_pointer(t, a, v.offset(t0_, j)) for t, a in ((aqs_type, aqs_), (ad_type, ad_), (asum_type, asum_)))
                for j in range(n_act_rows)
            ]

            # Prefetch: each weight row asks for the line PREFETCH_BYTES past its own block, once (with
            # its first activation row).
            def block(b, i):
                w_row, t = divmod(i, n_act_rows)
                return block_terms(v, rows[w_row], *acts[t], b, rows[w_row] if t == 0 else None)

            totals = v.grid_sum(n_blocks_, block, n_dots, block_sums=getattr(block_terms, "block_sums", False))
            return context.make_tuple(builder, signature.return_type, totals)

        return sig, codegen

    return grid_dot


def apart_dot_intrinsic(block_terms, count: int):
    """An intrinsic apart_dot(weights, r0, step, aqs, ad, asum, n_blocks) -> UniTuple(float32, count):
    the dot products of weight rows r0, r0 + step, ..., r0 + (count - 1) * step (weights: uint8[N,
    row_bytes]) with one activation (aqs, ad, asum: 1D, the pairing format), each equal to the type's
    row_dot bit for bit (grid_sum keeps each dot's order). The rows are read side by side: a matvec that
    gives them a part of the matrix apart streams `count` sequential runs of it at once. No software
    prefetch: the hardware follows the runs (Q8_0's output matrix in Gemma's decode: ~5% a token over one
    row at a time without it, 1-2% with the row kernel's prefetch)."""

    @intrinsic
    def apart_dot(typingctx, weights, r0, step, aqs, ad, asum, n_blocks):
        if not (isinstance(weights, types.Array) and weights.ndim == 2 and isinstance(aqs, types.Array) and aqs.ndim == 1):
            return None
        sig = types.UniTuple(types.float32, count)(weights, r0, step, aqs, ad, asum, n_blocks)

        def codegen(context, builder, signature, args):
            weights_, r0_, step_, aqs_, ad_, asum_, n_blocks_ = args
            w_type, _, _, aqs_type, ad_type, asum_type, _ = signature.args
            v = VectorCode(context, builder)
            step_ = v.resize(step_, r0_.type.width)
            rows = [v.row_pointer(w_type, weights_, builder.add(r0_, builder.mul(step_, ir.Constant(step_.type, k))))
                    for k in range(count)]
            act = tuple(v.row_pointer(t, a, r0_) for t, a in ((aqs_type, aqs_), (ad_type, ad_), (asum_type, asum_)))

            def block(b, i):
                return block_terms(v, rows[i], *act, b, None)

            totals = v.grid_sum(n_blocks_, block, count, block_sums=getattr(block_terms, "block_sums", False))
            return context.make_tuple(builder, signature.return_type, totals)

        return sig, codegen

    return apart_dot
