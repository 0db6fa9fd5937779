"""F32's CPU kernels: float_grid's dot products on F32 weight rows against float32 activations."""

from __future__ import annotations

from ....jit import exact_kernel
from .float_grid import F32, MIN_ROWS, float_dot, float_matvec, float_matvec_tiles  # noqa: F401 (MIN_ROWS: the record's)


@exact_kernel
def vec_dot(w, x):
    """w: uint8[row_bytes] weight row; x: float32[n] activation (float_grid's order)."""
    return float_dot(w, x, F32)


@exact_kernel
def matvec(weights, out, x):
    """out[r] = vec_dot(weights[r], x) for every row r, four rows a part of the matrix apart a step (float_grid.float_matvec)."""
    float_matvec(weights, out, x, F32)


@exact_kernel
def matvec_tiles(weights, out, x):
    """out[t, r] = vec_dot(weights[r], x[t]) for r < N - N % 16 (float_grid.float_matvec_tiles)."""
    float_matvec_tiles(weights, out, x, F32)
