"""The code generation of float_panels.py's kernels (F32, F16, BF16 weights, 16 rows as the lanes of a
vector): the LLVM IR of a grid of panels x activation rows on re-laid panels, of 16 file rows with their
16 x 16 blocks transposed in registers, and of vec_dot's single chain, as Numba intrinsics, one per
weight kind and shape (the module-level names below, which the kernels call with the kind a constant).
float_panels.py's docstring gives the order every output follows and why."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import vector

PANEL = 16  # weight rows per panel: the float32 lanes of one AVX-512 register
GRID_P, GRID_T = 4, 6  # the prompt grid: panels x activation rows (24 accumulators of 32 registers)
KINDS = ("f32", "f16", "bf16")  # the weight kinds, in the order of float_panels' F32, F16, BF16


def _stored(kind: str, builder, pointer):
    """16 consecutive weights at `pointer` as stored: <16 x float> for f32, <16 x i16> for f16 / bf16."""
    if kind == "f32":
        return builder.load(builder.bitcast(pointer, ir.VectorType(ir.FloatType(), PANEL).as_pointer()), align=4)
    return builder.load(builder.bitcast(pointer, ir.VectorType(ir.IntType(16), PANEL).as_pointer()), align=2)


def _widened(kind: str, builder, stored):
    """<16 x float> from _stored's vector, each weight widened exactly."""
    f32x16 = ir.VectorType(ir.FloatType(), PANEL)
    if kind == "f32":
        return stored
    if kind == "f16":
        return builder.fpext(builder.bitcast(stored, ir.VectorType(ir.HalfType(), PANEL)), f32x16)
    words = builder.shl(builder.zext(stored, ir.VectorType(ir.IntType(32), PANEL)),
                        ir.Constant(ir.VectorType(ir.IntType(32), PANEL), [16] * PANEL))
    return builder.bitcast(words, f32x16)


def _vector(kind: str, builder, pointer):
    """<16 x float> from 16 consecutive weights at `pointer` (float* for f32, i16* for f16 / bf16)."""
    return _widened(kind, builder, _stored(kind, builder, pointer))


def _scalar(kind: str, builder, pointer):
    """float from one weight at `pointer`, widened as _vector does."""
    if kind == "f32":
        return builder.load(pointer)
    short = builder.load(pointer)
    if kind == "f16":
        return builder.fpext(builder.bitcast(short, ir.HalfType()), ir.FloatType())
    return builder.bitcast(builder.shl(builder.zext(short, ir.IntType(32)), ir.Constant(ir.IntType(32), 16)), ir.FloatType())


def _element(kind: str):
    """The LLVM type of one stored weight: float for f32, the 16 bits of f16 / bf16."""
    return ir.FloatType() if kind == "f32" else ir.IntType(16)


def _i64(builder, value):
    return builder.sext(value, ir.IntType(64)) if value.type.width < 64 else value


def _rows_of(context, builder, array_type, array, firsts, element):
    """Pointers (element*) to the given rows of a 2D array (row stride from the array; the elements of a
    row contiguous)."""
    arr = context.make_array(array_type)(context, builder, array)
    stride = cgutils.unpack_tuple(builder, arr.strides)[0]
    base = builder.bitcast(arr.data, ir.IntType(8).as_pointer())
    return [builder.bitcast(builder.gep(base, [builder.mul(_i64(builder, r), stride)]), element.as_pointer()) for r in firsts]


def _columns(context, builder, array_type, array):
    return cgutils.unpack_tuple(builder, context.make_array(array_type)(context, builder, array).shape)[1]


def _broadcast(builder, value):
    """<16 x float> with every lane `value`."""
    f32x16 = ir.VectorType(ir.FloatType(), PANEL)
    one = builder.insert_element(ir.Constant(f32x16, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(f32x16, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), PANEL), [0] * PANEL))


def _fma(builder):
    f32x16 = ir.VectorType(ir.FloatType(), PANEL)
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32x16, [f32x16] * 3), "llvm.fma.v16f32")


def _transposed(builder, rows):
    """The 16 x 16 transpose of 16 <16 x float> (rows[r][c] -> result[c][r]): four butterfly stages,
    stage b (1, 2, 4, 8) exchanging, between rows r and r + b (bit b of r clear), the elements whose
    row and column differ in bit b."""
    index = ir.VectorType(ir.IntType(32), PANEL)
    rows = list(rows)
    for b in (1, 2, 4, 8):
        low_mask = [c if not c & b else PANEL + c - b for c in range(PANEL)]  # row r: its own or r + b's
        high_mask = [PANEL + c if c & b else c + b for c in range(PANEL)]  # row r + b
        for r in range(PANEL):
            if r & b:
                continue
            a, other = rows[r], rows[r + b]
            rows[r] = builder.shuffle_vector(a, other, ir.Constant(index, low_mask))
            rows[r + b] = builder.shuffle_vector(a, other, ir.Constant(index, high_mask))
    return rows


def _store_sums(builder, accs, out_rows, first_column):
    """Each accumulator accs[j] (16 sums) to out_rows[j][first_column : first_column + 16]."""
    f32x16 = ir.VectorType(ir.FloatType(), PANEL)
    for acc, row in zip(accs, out_rows):
        builder.store(builder.load(acc), builder.bitcast(builder.gep(row, [first_column]), f32x16.as_pointer()), align=4)


def panels_per_loop(context, n_p: int, n_t: int) -> int:
    """How many of a grid's n_p panels one loop over K takes (each output's chain is the same either
    way): all where their n_p x n_t accumulators fit the target's vector registers beside a weight
    vector and a broadcast (AVX-512: 32 registers of 16 floats, the 4 x 6 grid's 24 accumulators), else
    as many as fit (AVX2: 16 registers of 8 floats, a <16 x float> accumulator takes two; the 4 x 6 grid
    in one loop needed 48 and ran at 23-27 GMAC/s on a Zen 4 against 53-55 for AVX-512, one panel a
    loop fits in 12)."""
    features = vector._target_features(context)
    wide = vector.VECTOR_ISA == "auto" and "+avx512f" in features
    registers, lanes = (32, 16) if wide else (16, 8)
    accumulator_registers = (registers - 4) * lanes // PANEL
    return max(1, min(n_p, accumulator_registers // n_t))


def grid_intrinsic(kind: str, n_p: int, n_t: int):
    """grid(packed, p0, step, x, t0, out): out[t0 + j, 16 p : 16 p + 16] for the panels p = p0 + i * step
    (i < n_p) of `packed` (uint8[P, K * 16 * element]) and the activation rows t0 + j (j < n_t) of x
    (float32[T, K]), each lane one chain; the panels in one loop over K, or in groups
    (panels_per_loop)."""

    @intrinsic
    def grid(typingctx, packed, p0, step, x, t0, out):
        sig = types.void(packed, p0, step, x, t0, out)

        def codegen(context, builder, signature, args):
            packed_, p0_, step_, x_, t0_, out_ = args
            p_type, _, _, x_type, _, o_type = signature.args
            i64 = ir.IntType(64)
            panels = [builder.add(_i64(builder, p0_), builder.mul(_i64(builder, step_), i64(i))) for i in range(n_p)]
            t_rows = [builder.add(_i64(builder, t0_), i64(j)) for j in range(n_t)]
            w_rows = _rows_of(context, builder, p_type, packed_, panels, _element(kind))
            x_rows = _rows_of(context, builder, x_type, x_, t_rows, ir.FloatType())
            out_rows = _rows_of(context, builder, o_type, out_, t_rows, ir.FloatType())
            n_k = _i64(builder, _columns(context, builder, x_type, x_))
            per_loop = panels_per_loop(context, n_p, n_t)
            for first in range(0, n_p, per_loop):
                group = range(first, min(n_p, first + per_loop))
                _grid_loop(builder, kind, [w_rows[i] for i in group], x_rows, out_rows,
                           [builder.mul(panels[i], i64(PANEL)) for i in group], n_k)
            return context.get_dummy_value()

        return sig, codegen

    return grid


def _grid_loop(builder, kind: str, w_rows, x_rows, out_rows, first_columns, n_k):
    """One loop over k < n_k: the panels at w_rows (element*) times the activation rows at x_rows
    (float*), a chain per lane; then each panel's sums to out_rows at its first column."""
    i64 = ir.IntType(64)
    fma = _fma(builder)
    zero = ir.Constant(ir.VectorType(ir.FloatType(), PANEL), [0.0] * PANEL)
    accs = [[cgutils.alloca_once_value(builder, zero) for _ in x_rows] for _ in w_rows]
    with cgutils.for_range(builder, n_k) as loop:
        k = loop.index
        ws = [_vector(kind, builder, builder.gep(row, [builder.mul(k, i64(PANEL))])) for row in w_rows]
        for j, x_row in enumerate(x_rows):
            xb = _broadcast(builder, builder.load(builder.gep(x_row, [k])))
            for i, w in enumerate(ws):
                builder.store(builder.call(fma, [w, xb, builder.load(accs[i][j])]), accs[i][j])
    for acc, first_column in zip(accs, first_columns):
        _store_sums(builder, acc, out_rows, first_column)


def rows_intrinsic(kind: str, n_t: int):
    """rows(weights, r0, x, t0, out): out[t0 + j, r0 : r0 + 16] for the file's rows r0..r0+15 of
    `weights` (uint8[N, K * element]), j < n_t, each lane one chain: every 16 x 16 block of weights
    transposed in registers, the last K % 16 columns gathered one weight at a time."""

    @intrinsic
    def rows(typingctx, weights, r0, x, t0, out):
        sig = types.void(weights, r0, x, t0, out)

        def codegen(context, builder, signature, args):
            w_, r0_, x_, t0_, out_ = args
            w_type, _, x_type, _, o_type = signature.args
            i64 = ir.IntType(64)
            f32x16 = ir.VectorType(ir.FloatType(), PANEL)
            first = _i64(builder, r0_)
            w_rows = _rows_of(context, builder, w_type, w_, [builder.add(first, i64(r)) for r in range(PANEL)], _element(kind))
            t_rows = [builder.add(_i64(builder, t0_), i64(j)) for j in range(n_t)]
            x_rows = _rows_of(context, builder, x_type, x_, t_rows, ir.FloatType())
            out_rows = _rows_of(context, builder, o_type, out_, t_rows, ir.FloatType())
            fma = _fma(builder)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(f32x16, [0.0] * PANEL)) for _ in range(n_t)]
            n = _i64(builder, _columns(context, builder, x_type, x_))

            def step(k, weights_at_k):
                for j in range(n_t):
                    xb = _broadcast(builder, builder.load(builder.gep(x_rows[j], [k])))
                    builder.store(builder.call(fma, [weights_at_k, xb, builder.load(accs[j])]), accs[j])

            # the next 16 rows into L2, as many bytes a step as a step reads: 16 rows read side by side
            # defeat the hardware prefetchers (Gemma 3's F16 output matrix, decode on one thread: 7-9 GB/s
            # without, 14-16 prefetching into L1, 21-24 into L2; 25 from the caches)
            next_rows = builder.bitcast(_rows_of(context, builder, w_type, w_, [builder.add(first, i64(PANEL))], _element(kind))[0],
                                        ir.IntType(8).as_pointer())
            block_bytes = PANEL * PANEL * {"f32": 4, "f16": 2, "bf16": 2}[kind]
            prefetch = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()] + [ir.IntType(32)] * 3), "llvm.prefetch.p0i8")
            with cgutils.for_range(builder, builder.udiv(n, i64(PANEL))) as loop:
                at = builder.mul(loop.index, i64(PANEL))
                ahead = builder.gep(next_rows, [builder.mul(loop.index, i64(block_bytes))])
                for line in range(0, block_bytes, 64):
                    builder.call(prefetch, [builder.gep(ahead, [i64(line)]), ir.IntType(32)(0), ir.IntType(32)(2), ir.IntType(32)(1)])
                # transposed as stored (16-bit lanes for f16 / bf16: half the shuffle width), then widened
                stored = _transposed(builder, [_stored(kind, builder, builder.gep(row, [at])) for row in w_rows])
                block = [_widened(kind, builder, v) for v in stored]
                for c in range(PANEL):
                    step(builder.add(at, i64(c)), block[c])
            tail_start = builder.sub(n, builder.urem(n, i64(PANEL)))
            with cgutils.for_range(builder, builder.urem(n, i64(PANEL))) as loop:
                k = builder.add(tail_start, loop.index)
                gathered = ir.Constant(f32x16, ir.Undefined)
                for r, row in enumerate(w_rows):
                    gathered = builder.insert_element(gathered, _scalar(kind, builder, builder.gep(row, [k])), ir.Constant(ir.IntType(32), r))
                step(k, gathered)
            _store_sums(builder, accs, out_rows, first)
            return context.get_dummy_value()

        return sig, codegen

    return rows


def chain_intrinsic(kind: str):
    """chain(w, x) -> float32: one weight row (uint8[K * element]) and one activation (float32[>= K]),
    one chain over the row's K weights."""

    @intrinsic
    def chain(typingctx, w, x):
        sig = types.float32(w, x)

        def codegen(context, builder, signature, args):
            w_, x_ = args
            w_type, x_type = signature.args
            w_arr = context.make_array(w_type)(context, builder, w_)
            x_arr = context.make_array(x_type)(context, builder, x_)
            w_ptr = builder.bitcast(w_arr.data, _element(kind).as_pointer())
            x_ptr = builder.bitcast(x_arr.data, ir.FloatType().as_pointer())
            size = {"f32": 4, "f16": 2, "bf16": 2}[kind]
            n = builder.udiv(_i64(builder, cgutils.unpack_tuple(builder, w_arr.shape)[0]), ir.Constant(ir.IntType(64), size))
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.FloatType(), [ir.FloatType()] * 3), "llvm.fma.f32")
            acc = cgutils.alloca_once_value(builder, ir.Constant(ir.FloatType(), 0.0))
            with cgutils.for_range(builder, n) as loop:
                k = loop.index
                product = [_scalar(kind, builder, builder.gep(w_ptr, [k])), builder.load(builder.gep(x_ptr, [k]))]
                builder.store(builder.call(fma, product + [builder.load(acc)]), acc)
            return builder.load(acc)

        return sig, codegen

    return chain


SHAPES = [(GRID_P, t) for t in range(1, GRID_T + 1)] + [(1, GRID_T), (1, 1)]
GRIDS = {(kind, n_p, n_t): grid_intrinsic(kind, n_p, n_t) for kind in KINDS for n_p, n_t in SHAPES}
_ROWS = {(kind, n_t): rows_intrinsic(kind, n_t) for kind in KINDS for n_t in (GRID_T, 1)}
_CHAINS = {kind: chain_intrinsic(kind) for kind in KINDS}

f32_4x6, f32_4x5, f32_4x4, f32_4x3, f32_4x2, f32_4x1, f32_1x6, f32_1x1 = (GRIDS["f32", p, t] for p, t in sorted(SHAPES, reverse=True))
f16_4x6, f16_4x5, f16_4x4, f16_4x3, f16_4x2, f16_4x1, f16_1x6, f16_1x1 = (GRIDS["f16", p, t] for p, t in sorted(SHAPES, reverse=True))
bf16_4x6, bf16_4x5, bf16_4x4, bf16_4x3, bf16_4x2, bf16_4x1, bf16_1x6, bf16_1x1 = (GRIDS["bf16", p, t] for p, t in sorted(SHAPES, reverse=True))
f32_rows6, f32_rows1, f16_rows6, f16_rows1, bf16_rows6, bf16_rows1 = (_ROWS[k, t] for k in KINDS for t in (GRID_T, 1))
f32_chain, f16_chain, bf16_chain = (_CHAINS[k] for k in KINDS)
