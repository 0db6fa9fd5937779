"""BF16's CPU kernels: on AMX's tiles where the CPU has them and the matrix suits them (amx.py, its own
order), else float_panels' chains of fused multiply-adds on BF16 weight rows against float32
activations, 16 rows as the lanes of a vector. Either way every product of a BF16 matrix takes `matmul`,
which of the two decided by the matrix's shape and the machine alone."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ....jit import exact_kernel
from . import amx, float_panels
from .float_panels import BF16, float_dot, panels_matmul


@exact_kernel
def vec_dot(w, x):
    """w: uint8[row_bytes] weight row; x: float32[n] activation (float_panels' order: one chain)."""
    return float_dot(w, x, BF16)


def suits(weights: np.ndarray) -> bool:
    return float_panels.suits(weights)


def pack(weights: np.ndarray) -> np.ndarray:
    """AMX's tiles or float_panels' panels, as `matmul` reads them."""
    return amx.pack(weights) if amx.suits(weights) else float_panels.pack(weights, BF16)


def matmul(weights: np.ndarray, x: np.ndarray, out: np.ndarray, threads: int, packed: Optional[np.ndarray] = None) -> None:
    """out[T, N] = x[T, K] @ W.T (MatrixKernel.matmul), from `pack`'s copy or (packed None) the file's rows."""
    if amx.suits(weights):
        amx.matmul(weights, x, out, threads, amx.NOT_PACKED if packed is None else packed)
    else:
        panels_matmul(weights, float_panels.NOT_PACKED if packed is None else packed, x, out, BF16)
