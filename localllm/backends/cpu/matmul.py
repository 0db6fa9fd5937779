"""Quantized matrix products on the CPU.

Decode (few rows of activations): the activation row is quantized once to the weight type's pairing
format, then each output element is one `vec_dot` over a quantized weight row, rows split across threads.
Prefill (many activation rows): compute-bound, so weight tiles are dequantized to float32 into a reused
scratch buffer and multiplied through BLAS (NumPy's matmul); the weights stay quantized in memory.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ...quant import QuantType
from ...quant.activation import QuantizedActivation

# Above this many activation rows a matmul goes through dequantized tiles + BLAS.
BLAS_MIN_ROWS = 8
TILE_ROWS = 512

_matvec_cache: dict[str, object] = {}
_dequant_cache: dict[str, object] = {}


def _make_matvec(vec_dot, n_act_arrays: int):
    """A parallel driver over weight rows for one type's vec_dot (out[r] = vec_dot(W[r], act...))."""
    if n_act_arrays == 1:

        @numba.njit(parallel=True, cache=True, nogil=True, fastmath=True)
        def matvec1(weights, out, a0):
            """weights uint8[N, row_bytes]; a0 float32[K]; out float32[N]."""
            for r in prange(weights.shape[0]):
                out[r] = vec_dot(weights[r], a0)

        return matvec1

    @numba.njit(parallel=True, cache=True, nogil=True, fastmath=True)
    def matvec3(weights, out, a0, a1, a2):
        """weights uint8[N, row_bytes]; (a0, a1, a2) the quantized activation; out float32[N]."""
        for r in prange(weights.shape[0]):
            out[r] = vec_dot(weights[r], a0, a1, a2)

    return matvec3


def _make_dequant_rows(dequantize_row):
    @numba.njit(parallel=True, cache=True, nogil=True)
    def dequant_rows(weights, start, out):
        """weights uint8[N, row_bytes]; out float32[R, K] <- rows start..start+R of weights."""
        for r in prange(out.shape[0]):
            dequantize_row(weights[start + r], out[r])

    return dequant_rows


def _make_gather_rows(dequantize_row):
    @numba.njit(cache=True, nogil=True)
    def gather_rows(weights, ids, out):
        """weights uint8[V, row_bytes]; ids int[T] (already range-checked); out float32[T, K]."""
        for t in range(ids.shape[0]):
            dequantize_row(weights[ids[t]], out[t])

    return gather_rows


_gather_cache: dict[str, object] = {}


def gather_rows_kernel(qt: QuantType):
    kernel = _gather_cache.get(qt.name)
    if kernel is None:
        kernel = _gather_cache[qt.name] = _make_gather_rows(qt.dequantize_row)
    return kernel


def matvec_kernel(qt: QuantType):
    kernel = _matvec_cache.get(qt.name)
    if kernel is None:
        kernel = _make_matvec(qt.vec_dot, 1 if qt.act == "f32" else 3)
        _matvec_cache[qt.name] = kernel
    return kernel


def dequant_rows_kernel(qt: QuantType):
    kernel = _dequant_cache.get(qt.name)
    if kernel is None:
        kernel = _make_dequant_rows(qt.dequantize_row)
        _dequant_cache[qt.name] = kernel
    return kernel


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
