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

    def row_sum(self, n_blocks, block):
        """sum over b < n_blocks of scale_b * sum(ints_b) [+ extra_b], where block(b) returns (ints_b
        <8 x i32>, scale_b float or <8 x float>) or (ints_b, scale_b, extra_b float or None).

        The int32 lanes are converted and scaled as a vector and added into one float vector accumulator
        in block order, then summed by halving: the order of llama.cpp's AVX2 kernels (a fused
        multiply-add per block, then hsum_float_8); 14 of the 18 Q8_0 dot products in llama.cpp's
        reference vectors come out bit-identical. The order matters more than it seems: with the blocks
        split over two accumulators (no faster here, measured) Gemma 3's KL against llama.cpp's logits
        at a 6-token prompt doubled, 0.0066 -> 0.0122.
        Returns the float32 total.
        """
        return self.grid_sum(n_blocks, lambda b, i: block(b), 1)[0]

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

    def grid_sum(self, n_blocks, block, n_dots: int, lanes: int = 8, reduce: bool = True):
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
        """
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
