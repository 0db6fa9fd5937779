"""Products of float weight matrices (F32, F16, BF16) with float32 activations, 16 weight rows as the
lanes of a vector: these types' matrix kernel (KernelRecord.matrix), which takes every product of a
matrix at every batch size, and their one-row vec_dot.

One order for every output: x[t] . w[r] is a single chain of fused multiply-adds over k = 0, 1, ...,
K - 1 in order, starting from +0: acc = fma(w[r, k], x[t, k], acc), each weight widened to float32
exactly (F16: vcvtph2ps; BF16: its 16 bits moved to the top of a word). The kernels differ only in how
many chains they run side by side, so every output has the same bits in all of them, at every batch
size and on every vector target:
- vec_dot: one chain (a row and an activation);
- on re-laid panels (`pack`: panel p holds rows 16p..16p+15 k-major, the 16 rows' weights at each k
  side by side): the grid, GRID_P panels x GRID_T activation rows = 24 vectors of 16 chains, each
  weight vector loaded once for GRID_T rows and each activation element broadcast to 16 rows (prompts);
  and decode, STREAMS panels a part of the matrix apart a step, so that each thread reads STREAMS runs
  of the matrix side by side;
- on the file's rows (the basic tier, or LOCALLLM_REPACK=0): 16 rows at a time, each 16 x 16 block of
  weights transposed in registers;
- the last N % 16 rows: one chain each.
The LLVM code of each shape and kind is float_panels_ir.py's.

Why rows as lanes: a dot product with its lanes along the row (float_grid, before) ends in a horizontal
sum of 16 lanes and needs a grid of 4 x 4 dots to reuse its loads; it ran at 76-87% of the fused
multiply-adds' peak on one Zen 4 thread (44-51 of 58.5 GMAC/s at Gemma 3 270M's shapes). Here no dot ends
in a horizontal sum and 24 accumulators hide the FMA's latency: 90-97% (53-57; docs/performance.md). A
chain is a less balanced sum than 16 lanes added by halves; its error bound (K u) stays far below the
weights' own rounding (F16's 11 significant bits, BF16's 8) at every K of the models we run.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ....jit import exact_kernel
from .float_panels_ir import GRID_P, GRID_T, PANEL
from .float_panels_ir import bf16_1x1, bf16_1x6, bf16_4x1, bf16_4x2, bf16_4x3, bf16_4x4, bf16_4x5, bf16_4x6
from .float_panels_ir import f16_1x1, f16_1x6, f16_4x1, f16_4x2, f16_4x3, f16_4x4, f16_4x5, f16_4x6
from .float_panels_ir import f32_1x1, f32_1x6, f32_4x1, f32_4x2, f32_4x3, f32_4x4, f32_4x5, f32_4x6
from .float_panels_ir import bf16_chain, bf16_rows1, bf16_rows6, f16_chain, f16_rows1, f16_rows6, f32_chain, f32_rows1, f32_rows6

STREAMS = 4  # decode: panels this many parts of the matrix apart, read side by side

# The weight kinds, as the kernels take them (a constant at each type's call site; float_panels_ir.KINDS
# names them in this order).
F32, F16, BF16 = 0, 1, 2
ELEMENT_BYTES = (4, 2, 2)

NOT_PACKED = np.zeros((0, 0), dtype=np.uint8)  # the matrix kernel's `packed` when it reads the file's rows


def pack(weights: np.ndarray, kind: int) -> np.ndarray:
    """The first N - N % 16 rows of weights (uint8[N, K * element bytes]) re-laid as panels:
    uint8[N // 16, K * 16 * element bytes], panel p's bytes at k the weights of rows 16p..16p+15 at k."""
    element = np.uint32 if ELEMENT_BYTES[kind] == 4 else np.uint16
    n_panels = weights.shape[0] // PANEL
    rows = np.ascontiguousarray(weights[: n_panels * PANEL]).view(element)  # [16 P, K] (a view of the mapped rows)
    panels = np.empty((n_panels, rows.shape[1] * PANEL), dtype=element)
    _pack_into(rows, panels)
    return panels.view(np.uint8)


@exact_kernel(parallel=True)
def _pack_into(rows, panels):
    """panels[p, 16 k + l] = rows[16 p + l, k] (NumPy's transpose copy of the same took ~10x longer:
    1.5 s for Gemma 3's 335 MB F16 output matrix)."""
    for p in prange(panels.shape[0]):
        for k in range(rows.shape[1]):
            for lane in range(PANEL):
                panels[p, k * PANEL + lane] = rows[p * PANEL + lane, k]


# ----- the kernels, the weight kind a constant argument -----

@exact_kernel
def float_dot(w, x, kind):
    """vec_dot of the kind: w uint8[K * element] weight row, x float32[>= K] activation; one chain."""
    if kind == F32:
        return f32_chain(w, x)
    if kind == F16:
        return f16_chain(w, x)
    return bf16_chain(w, x)


@exact_kernel
def _grid_wide(packed, p0, step, x, t0, out, kind):
    """GRID_P panels (p0, p0 + step, ...) x GRID_T activation rows from t0."""
    if kind == F32:
        f32_4x6(packed, p0, step, x, t0, out)
    elif kind == F16:
        f16_4x6(packed, p0, step, x, t0, out)
    else:
        bf16_4x6(packed, p0, step, x, t0, out)


@exact_kernel
def _grid_panels(packed, p0, step, x, t0, out, kind):
    """GRID_P panels x one activation row."""
    if kind == F32:
        f32_4x1(packed, p0, step, x, t0, out)
    elif kind == F16:
        f16_4x1(packed, p0, step, x, t0, out)
    else:
        bf16_4x1(packed, p0, step, x, t0, out)


@exact_kernel
def _grid_last(packed, p0, x, t0, n_t, out, kind):
    """GRID_P panels x the last n_t < GRID_T activation rows, at once (so that each of the 4 n_t chains
    of a step is independent: one row alone runs at half the FMAs' rate, bound by their latency)."""
    if kind == F32:
        if n_t == 5:
            f32_4x5(packed, p0, 1, x, t0, out)
        elif n_t == 4:
            f32_4x4(packed, p0, 1, x, t0, out)
        elif n_t == 3:
            f32_4x3(packed, p0, 1, x, t0, out)
        elif n_t == 2:
            f32_4x2(packed, p0, 1, x, t0, out)
        else:
            f32_4x1(packed, p0, 1, x, t0, out)
    elif kind == F16:
        if n_t == 5:
            f16_4x5(packed, p0, 1, x, t0, out)
        elif n_t == 4:
            f16_4x4(packed, p0, 1, x, t0, out)
        elif n_t == 3:
            f16_4x3(packed, p0, 1, x, t0, out)
        elif n_t == 2:
            f16_4x2(packed, p0, 1, x, t0, out)
        else:
            f16_4x1(packed, p0, 1, x, t0, out)
    elif n_t == 5:
        bf16_4x5(packed, p0, 1, x, t0, out)
    elif n_t == 4:
        bf16_4x4(packed, p0, 1, x, t0, out)
    elif n_t == 3:
        bf16_4x3(packed, p0, 1, x, t0, out)
    elif n_t == 2:
        bf16_4x2(packed, p0, 1, x, t0, out)
    else:
        bf16_4x1(packed, p0, 1, x, t0, out)


@exact_kernel
def _grid_rows(packed, p, x, t0, out, kind):
    """One panel x GRID_T activation rows."""
    if kind == F32:
        f32_1x6(packed, p, 1, x, t0, out)
    elif kind == F16:
        f16_1x6(packed, p, 1, x, t0, out)
    else:
        bf16_1x6(packed, p, 1, x, t0, out)


@exact_kernel
def _grid_one(packed, p, x, t0, out, kind):
    """One panel x one activation row."""
    if kind == F32:
        f32_1x1(packed, p, 1, x, t0, out)
    elif kind == F16:
        f16_1x1(packed, p, 1, x, t0, out)
    else:
        bf16_1x1(packed, p, 1, x, t0, out)


@exact_kernel
def _file_rows(weights, r0, x, t0, out, wide, kind):
    """The file's rows r0..r0+15 x GRID_T activation rows (wide) or one."""
    if kind == F32:
        if wide:
            f32_rows6(weights, r0, x, t0, out)
        else:
            f32_rows1(weights, r0, x, t0, out)
    elif kind == F16:
        if wide:
            f16_rows6(weights, r0, x, t0, out)
        else:
            f16_rows1(weights, r0, x, t0, out)
    elif wide:
        bf16_rows6(weights, r0, x, t0, out)
    else:
        bf16_rows1(weights, r0, x, t0, out)


@exact_kernel(parallel=True)
def _decode_packed(packed, x, out, kind):
    """out[0, :16 P] for one activation row: step i takes panel i of each of STREAMS parts of the
    matrix, the last P % STREAMS panels one by one."""
    n_panels = packed.shape[0]
    q = n_panels // STREAMS
    for i in prange(q):
        _grid_panels(packed, i, q, x, 0, out, kind)
    for p in range(STREAMS * q, n_panels):
        _grid_one(packed, p, x, 0, out, kind)


@exact_kernel(parallel=True)
def _prompt_packed(packed, x, out, kind):
    """out[:, :16 P] for several activation rows: groups of GRID_P panels in parallel (then the last
    P % GRID_P panels alone), GRID_T activation rows at a time, then the last T % GRID_T together (one
    by one for the last panels)."""
    n_panels, n_rows = packed.shape[0], x.shape[0]
    n_groups = n_panels // GRID_P
    for u in prange(n_groups + n_panels % GRID_P):
        t = 0
        if u < n_groups:
            while t + GRID_T <= n_rows:
                _grid_wide(packed, u * GRID_P, 1, x, t, out, kind)
                t += GRID_T
            if t < n_rows:
                _grid_last(packed, u * GRID_P, x, t, n_rows - t, out, kind)
        else:
            p = n_groups * GRID_P + u - n_groups
            while t + GRID_T <= n_rows:
                _grid_rows(packed, p, x, t, out, kind)
                t += GRID_T
            while t < n_rows:
                _grid_one(packed, p, x, t, out, kind)
                t += 1


@exact_kernel(parallel=True)
def _from_file_rows(weights, x, out, kind):
    """out[:, :N - N % 16] from the file's rows, 16 rows at a time in parallel."""
    n_rows = x.shape[0]
    for p in prange(weights.shape[0] // PANEL):
        t = 0
        while t + GRID_T <= n_rows:
            _file_rows(weights, p * PANEL, x, t, out, True, kind)
            t += GRID_T
        while t < n_rows:
            _file_rows(weights, p * PANEL, x, t, out, False, kind)
            t += 1


@exact_kernel
def panels_matmul(weights, packed, x, out, kind):
    """out[T, N] = x[T, K] @ W.T in this module's order: the first N - N % 16 rows from `packed`
    (pack(weights, kind)) unless it is empty (NOT_PACKED: then from the file's rows), the last N % 16
    rows one chain each."""
    if packed.shape[0] > 0:
        if x.shape[0] == 1:
            _decode_packed(packed, x, out, kind)
        else:
            _prompt_packed(packed, x, out, kind)
    else:
        _from_file_rows(weights, x, out, kind)
    for r in range(weights.shape[0] - weights.shape[0] % PANEL, weights.shape[0]):
        for t in range(x.shape[0]):
            out[t, r] = float_dot(weights[r], x[t], kind)


def suits(weights: np.ndarray) -> bool:
    """Every matrix (the order does not depend on its shape or on the target)."""
    return weights.ndim == 2
