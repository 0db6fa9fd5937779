"""F16's CPU kernels: float_grid's dot products on F16 weight rows against float32 activations."""

from __future__ import annotations

from numba import prange

from ....jit import exact_kernel
from .float_grid import GRID_A, GRID_W, MIN_ROWS, TILE, FloatDots

DOTS = FloatDots("f16")
dots_1x1, dots_4x1, dots_4x4 = DOTS.dots_1x1, DOTS.dots_4x1, DOTS.dots_4x4


@exact_kernel
def vec_dot(w, x):
    """w: uint8[row_bytes] weight row; x: float32[n] activation (float_grid's order)."""
    return dots_1x1(w, 0, x, 0, x.shape[0])[0]


@exact_kernel(parallel=True)
def matvec_tiles(weights, out, x):
    """out[t, r] = vec_dot(weights[r], x[t]) for r < N - N % TILE: groups of GRID_W weight rows in
    parallel, GRID_A activation rows at a time, then the last T % GRID_A one by one."""
    n_rows, n = x.shape
    for g in prange((weights.shape[0] - weights.shape[0] % TILE) // GRID_W):
        r0 = g * GRID_W
        t = 0
        while t + GRID_A <= n_rows:
            sums = dots_4x4(weights, r0, x, t, n)
            for i in range(GRID_W):
                for j in range(GRID_A):
                    out[t + j, r0 + i] = sums[i * GRID_A + j]
            t += GRID_A
        while t < n_rows:
            sums = dots_4x1(weights, r0, x[t], 0, n)
            for i in range(GRID_W):
                out[t, r0 + i] = sums[i]
            t += 1
