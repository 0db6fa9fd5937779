"""VectorCode's float accumulation across blocks (row_sum, grid_sum), in the order llama.cpp's AVX2
kernels use: a mixin of VectorCode (vector.py); it emits IR through VectorCode's own helpers."""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils


class FloatSums:
    # -- whole rows: float accumulation across blocks, as llama.cpp's AVX2 kernels do --

    def float_sum(self, vec):
        """Sum of the lanes of a float vector by halving (a short tree, not a serial chain)."""
        while vec.type.count > 1:
            half = vec.type.count // 2
            vec = self.builder.fadd(self.shuffle(vec, range(half)), self.shuffle(vec, range(half, 2 * half)), flags=self.PINNED)
        return self.builder.extract_element(vec, ir.Constant(ir.IntType(32), 0))

    def row_sum(self, n_blocks, block, block_sums: bool = False):
        """sum over b < n_blocks of scale_b * sum(ints_b) [+ extra_b], where block(b) returns (ints_b
        <8 x i32>, scale_b float or <8 x float>) or (ints_b, scale_b, extra_b float or None).

        The int32 lanes are converted and scaled as a vector and added into one float vector accumulator
        in block order, then summed by halving: the order of llama.cpp's AVX2 kernels (a fused
        multiply-add per block, then hsum_float_8); 14 of the 18 Q8_0 dot products in llama.cpp's
        reference vectors come out bit-identical. The order matters more than it seems: with the blocks
        split over two accumulators (no faster here, measured) Gemma 3's KL against llama.cpp's logits
        at a 6-token prompt doubled, 0.0066 -> 0.0122.
        Returns the float32 total. block_sums: grid_sum's.
        """
        return self.grid_sum(n_blocks, lambda b, i: block(b), 1, block_sums=block_sums)[0]

    # Float flags of the accumulation: set explicitly, because Numba's fast-math pass gives every float
    # operation that has no flags the full fast-math set, and with it LLVM may reorder a sum differently
    # in differently shaped kernels (measured: a 1x4 grid dot then differed from row_dot in the last bit).
    # With these, each dot's accumulation is the same operations in the same order in every kernel.
    PINNED = ("contract",)

    def _accumulate(self, acc, ints, scale, extra):
        """acc + float(ints) * scale [+ extra in lane 0], as one fused multiply-add per block (llama.cpp's
        _mm256_fmadd_ps); with a float extra term (a minimum's share) the sum is fma(...) then one add.
        On 16 lanes (two dots side by side, see grid_sum) extra is a pair, for lanes 0 and 8."""
        builder = self.builder
        vecf = acc.type
        lanes = vecf.count
        if not isinstance(scale.type, ir.VectorType):
            scale = self.splat(scale, lanes)
        fnty = ir.FunctionType(vecf, [vecf] * 3)
        fma = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.fma.v{lanes}f32")
        values = builder.sitofp(ints, vecf)
        if extra is None:
            return builder.call(fma, [values, scale, acc])
        extras = extra if isinstance(extra, (tuple, list)) else (extra,)
        start = ir.Constant(vecf, [0.0] * lanes)
        for k, value in enumerate(extras):
            start = builder.insert_element(start, value, ir.Constant(ir.IntType(32), 8 * k))
        return builder.fadd(acc, builder.call(fma, [values, scale, start]), flags=self.PINNED)

    def grid_sum(self, n_blocks, block, n_dots: int, lanes: int = 8, reduce: bool = True, block_sums: bool = False):
        """n_dots dot products at once, interleaved block by block: block(b, i) returns dot i's
        (ints, scale[, extra]) for block b, as row_sum's block(b) does. Returns the n_dots float32 totals.

        Each dot has its own accumulator, updated in row_sum's order with row_sum's operations, so each
        total equals what row_sum gives for that dot alone, bit for bit. Why interleave: row_sum's one
        float add chain waits on the add latency every block (a Q8_0 block's integer work is shorter
        than that), while n_dots independent chains overlap; and where dots share a weight row (several
        activation rows) or an activation (several weight rows), LLVM merges the identical loads and
        unpacking, so a weight block is unpacked once for all the activation rows it meets.

        lanes 16: each block(b, i) gives two dots side by side (lanes 0-7 and 8-15, every operation lane
        by lane, so each half is what 8 lanes give alone); returns 2 * n_dots totals, in that order.
        reduce False: the n_dots float accumulators instead, for the caller to sum in float_sum's order.
        block_sums: block(b, i)'s ints are summed whole (the block-sums order of a block_terms_kernel made
        with block_sums: _block_sums_grid).
        """
        if block_sums:
            return self._block_sums_grid(n_blocks, block, n_dots)
        builder = self.builder
        zero = ir.Constant(ir.VectorType(ir.FloatType(), lanes), [0.0] * lanes)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(n_dots)]
        with cgutils.for_range(builder, n_blocks) as loop:
            for i, acc_pointer in enumerate(accs):
                ints, scale, *extra = block(loop.index, i)
                extra = extra[0] if extra else None
                builder.store(self._accumulate(builder.load(acc_pointer), ints, scale, extra), acc_pointer)
        if not reduce:
            return [builder.load(acc_pointer) for acc_pointer in accs]
        totals = []
        for acc_pointer in accs:
            acc = builder.load(acc_pointer)
            for half in range(lanes // 8):
                totals.append(self.float_sum(self.shuffle(acc, range(8 * half, 8 * half + 8)) if lanes > 8 else acc))
        return totals

    def _block_sums_grid(self, n_blocks, block, n_dots: int):
        """grid_sum in the block-sums order: per dot one float chain a = fma(float(sum of the block's
        ints), scale, a), block after block, the n_dots chains side by side in one <n_dots x float>
        (the dots' lane sums reduced together: a few shuffles and adds for all of them, where a
        horizontal sum per dot cost as much as the block's products). The result has the bits of the
        eight-lane accumulation of legacy.block_totals (the sum in lane 0, zeros elsewhere) summed by
        float_sum, which the type's pair kernels still compute: lanes 1..7 each hold the chain p =
        fma(0.0, scale, p) (+0.0, or NaN once a scale is not finite), kept here as a second vector, and
        float_sum's halving of [a, p, p, p, p, p, p, p] is ((a + p) + (p + p)) + ((p + p) + (p + p))."""
        builder = self.builder
        floats = ir.VectorType(ir.FloatType(), n_dots)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(floats, [floats] * 3), f"llvm.fma.v{n_dots}f32")
        zeros = ir.Constant(floats, [0.0] * n_dots)
        chain, poison = cgutils.alloca_once_value(builder, zeros), cgutils.alloca_once_value(builder, zeros)
        with cgutils.for_range(builder, n_blocks) as loop:
            terms = [block(loop.index, i) for i in range(n_dots)]
            assert all(len(term) == 2 or term[2] is None for term in terms), "block sums take no extra term"
            scales = zeros
            for i, (_, scale, *_) in enumerate(terms):
                first = builder.extract_element(scale, ir.Constant(ir.IntType(32), 0)) if isinstance(scale.type, ir.VectorType) else scale
                scales = builder.insert_element(scales, first, ir.Constant(ir.IntType(32), i))
            totals = builder.sitofp(self._lane_totals([term[0] for term in terms]), floats)
            builder.store(builder.call(fma, [totals, scales, builder.load(chain)]), chain)
            builder.store(builder.call(fma, [zeros, scales, builder.load(poison)]), poison)
        a, p = builder.load(chain), builder.load(poison)
        twice = builder.fadd(p, p, flags=self.PINNED)
        total = builder.fadd(builder.fadd(builder.fadd(a, p, flags=self.PINNED), twice, flags=self.PINNED),
                             builder.fadd(twice, twice, flags=self.PINNED), flags=self.PINNED)
        return [builder.extract_element(total, ir.Constant(ir.IntType(32), i)) for i in range(n_dots)]

    def _lane_totals(self, vectors):
        """<n x i32>: lane i the (wrapping) sum of the lanes of vectors[i] (n a power of two up to 8,
        each vector <8 x i32>), by adding adjacent lanes: two vectors' pair sums into one vector until
        one holds every dot's lanes side by side (8 / n each), then adjacent lanes within it."""
        builder = self.builder
        n_dots = len(vectors)
        while len(vectors) > 1:
            merged = []
            for a, b in zip(vectors[0::2], vectors[1::2]):
                count = a.type.count
                evens = builder.shuffle_vector(a, b, self._lane_list(range(0, 2 * count, 2)))
                odds = builder.shuffle_vector(a, b, self._lane_list(range(1, 2 * count, 2)))
                merged.append(builder.add(evens, odds))
            vectors = merged
        (vec,) = vectors
        while vec.type.count > n_dots:
            count = vec.type.count
            vec = builder.add(self.shuffle(vec, range(0, count, 2)), self.shuffle(vec, range(1, count, 2)))
        return vec
