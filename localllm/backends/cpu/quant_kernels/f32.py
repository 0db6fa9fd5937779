"""F32's CPU kernels: float_panels' chains of fused multiply-adds on F32 weight rows against float32
activations, 16 rows as the lanes of a vector (every product of an F32 matrix takes `matmul`)."""

from __future__ import annotations

import numpy as np

from ....jit import exact_kernel
from . import float_panels
from .float_panels import F32, NOT_PACKED, float_dot, panels_matmul


@exact_kernel
def vec_dot(w, x):
    """w: uint8[row_bytes] weight row; x: float32[n] activation (float_panels' order: one chain)."""
    return float_dot(w, x, F32)


def pack(weights: np.ndarray) -> np.ndarray:
    """The matrix's rows re-laid as float_panels' panels."""
    return float_panels.pack(weights, F32)


def matmul(weights: np.ndarray, x: np.ndarray, out: np.ndarray, threads: int, packed: np.ndarray = NOT_PACKED) -> None:
    """out[T, N] = x[T, K] @ W.T (MatrixKernel.matmul), from `pack`'s panels or the file's rows."""
    panels_matmul(weights, packed, x, out, F32)
