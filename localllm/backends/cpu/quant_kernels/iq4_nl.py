"""IQ4_NL's CPU kernels (format: localllm/quant/iq4_nl.py): the one-row dot product with a q8_0 activation,
the grid kernels (several dot products at once, each in vec_dot's order) and the row dequantizer in
vector code."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....jit import exact_kernel, fast_kernel, fma_f32, read_f16
from ....quant.iq4_nl import BLOCK, BLOCK_BYTES, KVALUES
from .vector import VectorCode


@intrinsic
def block_dot(typingctx, w, qs, aqs, a):
    """<KVALUES[indices], aqs[a : a+32]> for the 16 index bytes at w[qs:], as int32."""
    sig = types.int32(w, qs, aqs, a)

    def codegen(context, builder, signature, args):
        w_, qs_, aqs_, a_ = args
        v = VectorCode(context, builder)
        packed = v.load(signature.args[0], w_, qs_, 16)
        values = v.lookup16(KVALUES, v.join(v.and_(packed, 15), v.shr(packed, 4)))
        acts = v.load(signature.args[2], aqs_, a_, BLOCK)
        return v.sum(v.scale_pairs(v.dot_pairs_signed(values, acts), v.constant(1, 16, 16)))

    return sig, codegen


def _index_values(v: VectorCode, w, base):
    """The 32 table values of the block at w[base:] (an element pointer), <32 x i8>, element order."""
    packed = v.load(None, w, v.offset(base, 2), 16)
    return v.lookup16(KVALUES, v.join(v.and_(packed, 15), v.shr(packed, 4)))


def _grid_dots(n_weight_rows: int, n_act_rows: int):
    """An intrinsic grid_dot(weights, r0, aqs, ad, asum, t0, n_blocks) -> UniTuple(float32, R*T)
    (vector.grid_dot_intrinsic's signature and order): the dot products of weight rows r0..r0+R-1 with
    activation rows t0..t0+T-1 (or a 1D activation), each with vec_dot's operations in its order: per
    block the integer total, then acc = fma(float(total), d * ad, acc) on scalars. R*T independent float
    chains instead of one, and each weight block unpacked once for the T activation rows."""

    @intrinsic
    def grid_dot(typingctx, weights, r0, aqs, ad, asum, t0, n_blocks):
        n_dots = n_weight_rows * n_act_rows
        sig = types.UniTuple(types.float32, n_dots)(weights, r0, aqs, ad, asum, t0, n_blocks)

        def codegen(context, builder, signature, args):
            weights_, r0_, aqs_, ad_, _, t0_, n_blocks_ = args
            w_type, _, aqs_type, ad_type, _, _, _ = signature.args
            v = VectorCode(context, builder)
            f32 = ir.FloatType()
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32")
            rows = [v.row_pointer(w_type, weights_, v.offset(r0_, i)) for i in range(n_weight_rows)]
            acts = [(v.row_pointer(aqs_type, aqs_, v.offset(t0_, j)), v.row_pointer(ad_type, ad_, v.offset(t0_, j))) for j in range(n_act_rows)]
            accs = [cgutils.alloca_once_value(builder, ir.Constant(f32, 0.0)) for _ in range(n_dots)]
            ones = v.constant(1, 16, 16)
            with cgutils.for_range(builder, n_blocks_) as loop:
                b = loop.index
                base = builder.mul(b, ir.Constant(b.type, BLOCK_BYTES))
                for i, row in enumerate(rows):
                    values = _index_values(v, row, base)
                    d = builder.extract_element(v.load_f16_splat(None, row, base, 1), ir.Constant(ir.IntType(32), 0))
                    for j, (act, act_scale) in enumerate(acts):
                        quants = v.load(None, act, builder.mul(b, ir.Constant(b.type, BLOCK)), BLOCK)
                        total = v.sum(v.scale_pairs(v.dot_pairs_signed(values, quants), ones))
                        scale = builder.fmul(d, v.load_scalar(None, act_scale, b), flags=v.PINNED)
                        pointer = accs[i * n_act_rows + j]
                        builder.store(builder.call(fma, [builder.sitofp(total, f32), scale, builder.load(pointer)]), pointer)
            return context.make_tuple(builder, signature.return_type, [builder.load(pointer) for pointer in accs])

        return sig, codegen

    return grid_dot


dot_4x1 = _grid_dots(4, 1)
dot_1x4 = _grid_dots(1, 4)


@intrinsic
def dequantize_indices(typingctx, src, qs, step, out, o):
    """out[o : o+32] = step * KVALUES[index] for the 32 indices packed at src[qs : qs+16] (low nibbles
    first), each lane one IEEE float32 product (what the NumPy reference computes)."""
    sig = types.void(src, qs, step, out, o)

    def codegen(context, builder, signature, args):
        src_, qs_, step_, out_, o_ = args
        v = VectorCode(context, builder)
        packed = v.load(signature.args[0], src_, qs_, 16)
        values = v.lookup16(KVALUES, v.join(v.and_(packed, 15), v.shr(packed, 4)))
        step32 = context.cast(builder, step_, signature.args[2], types.float32)
        v.store_dequantized(signature.args[3], out_, o_, values, True, (step32, step32))
        return context.get_dummy_value()

    return sig, codegen


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*18] -> out: float32[nb*32], d * KVALUES[index] (quant.iq4_nl.dequantize_row's bits)."""
    for b in range(out.shape[0] // BLOCK):
        dequantize_indices(src, b * BLOCK_BYTES + 2, read_f16(src, b * BLOCK_BYTES), out, b * BLOCK)


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*18] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32]: q8_0 activation."""
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        total = block_dot(w, b * BLOCK_BYTES + 2, aqs, b * BLOCK)
        acc = fma_f32(np.float32(total), read_f16(w, b * BLOCK_BYTES) * ad[b], acc)  # in block order, everywhere
    return acc
