"""Quantized matrix products on the CPU.

Decode (few rows of activations): the activation row is quantized once to the weight type's pairing
format, then each output element is one `vec_dot` over a quantized weight row, rows split across threads.
Prefill (many activation rows): compute-bound, so weight tiles are dequantized to float32 into a reused
scratch buffer and multiplied through BLAS (NumPy's matmul); the weights stay quantized in memory.
"""

from __future__ import annotations

import numpy as np

from ...quant import QuantType
from ...quant.activation import QuantizedActivation
from .drivers import drivers

# Above this many activation rows a matmul goes through dequantized tiles + BLAS.
BLAS_MIN_ROWS = 8
TILE_ROWS = 512


def gather_rows_kernel(qt: QuantType):
    return drivers(qt).gather_rows


def matvec_kernel(qt: QuantType):
    return drivers(qt).matvec


def dequant_rows_kernel(qt: QuantType):
    return drivers(qt).dequant_rows


class MatmulScratch:
    """Reusable buffers: one quantized activation per (pairing kind, K), one dequantization tile."""

    def __init__(self):
        self._acts: dict[tuple[str, int], QuantizedActivation] = {}
        self._tile = np.empty(0, dtype=np.float32)

    def activation(self, kind: str, k: int) -> QuantizedActivation:
        key = (kind, k)
        act = self._acts.get(key)
        if act is None:
            act = self._acts[key] = QuantizedActivation(kind, k)
        return act

    def tile(self, rows: int, k: int) -> np.ndarray:
        if self._tile.size < rows * k:
            self._tile = np.empty(rows * k, dtype=np.float32)
        return self._tile[: rows * k].reshape(rows, k)


def matmul(qt: QuantType, weights: np.ndarray, x: np.ndarray, out: np.ndarray, scratch: MatmulScratch) -> None:
    """out[T, N] = x[T, K] @ W.T for a quantized W (weights: uint8[N, row_bytes] holding N rows of K)."""
    n_tokens, k = x.shape
    if n_tokens >= BLAS_MIN_ROWS:
        dequant = dequant_rows_kernel(qt)
        n_rows = weights.shape[0]
        # BLAS owns the cores here (the backend runs Numba on one thread for batches: see
        # CPUBackend._threads_for), so tiles are dequantized on the calling thread.
        for start in range(0, n_rows, TILE_ROWS):
            rows = min(TILE_ROWS, n_rows - start)
            tile = scratch.tile(rows, k)
            dequant(weights, start, tile)
            np.matmul(x, tile.T, out=out[:, start : start + rows])
        return
    kernel = matvec_kernel(qt)
    act = scratch.activation(qt.act, k)
    for t in range(n_tokens):
        kernel(weights, out[t], *act.quantize(x[t]))
