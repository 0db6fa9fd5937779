"""Quantized matrix products on the device, one compiled kernel set per weight type.

Decode (T < gemm_min_rows activation rows): `matvec`, one group of `lanes` threads (a warp) per weight
row. Lane l decodes units l, l + lanes, ... of the row straight from the quantized bytes (the weights
are read once, in place) and dots each with the float32 activation rows; the lanes' partial sums are
added in shared memory. The activation stays float32 (the CPU quantizes it to 8 bits for an integer dot;
this is at least as accurate). Every activation row is summed in the same order whatever T is, so
out[t] does not depend on the other rows (what `matmul_rows` promises).

Prefill (T >= gemm_min_rows): compute-bound, so a slab of weight rows is dequantized to float32 into a
reused device scratch and multiplied by a shared-memory tiled GEMM, slab after slab.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from .blocks import UNIT, UNIT_DECODERS
from .launch import MAX_THREADS, MAX_TILE, MAX_TILE_PADDED, MAX_VEC_T

# Upper bound of the dequantized slab (float32 elements): 64 MiB.
SLAB_ELEMENTS = 16 * 1024 * 1024


@lru_cache(maxsize=None)
def kernels_for(qtype: str):
    """(matvec, dequant_rows, gather_rows) kernels reading weights of `qtype`."""
    unit, _ = UNIT_DECODERS[qtype]
    return _make_matvec(unit), _make_dequant(unit), _make_gather(unit)


def _make_matvec(unit):
    @cuda.jit
    def matvec(w, k, n_units, x, out, bias, has_bias):
        """w: weights [N, ...]; x float32[T, K], T <= MAX_VEC_T; out float32[T, N]; bias float32[N].
        Block (lanes, rows_per_block): threadIdx.y picks the row, threadIdx.x the lane."""
        lane = cuda.threadIdx.x
        slot = cuda.threadIdx.y
        lanes = cuda.blockDim.x
        row = cuda.blockIdx.x * cuda.blockDim.y + slot
        n_tok = x.shape[0]
        buf = cuda.local.array(UNIT, np.float32)
        acc = cuda.local.array(MAX_VEC_T, np.float32)
        for t in range(MAX_VEC_T):
            acc[t] = np.float32(0.0)
        if row < out.shape[1]:
            for u in range(lane, n_units, lanes):
                unit(w, row, u, k, buf)
                base = u * UNIT
                width = min(UNIT, k - base)
                for t in range(n_tok):
                    s = np.float32(0.0)
                    for j in range(width):
                        s += buf[j] * x[t, base + j]
                    acc[t] += s
        # partial[slot, t, lane]: tree sum over the lanes (every thread reaches every barrier)
        partial = cuda.shared.array(MAX_THREADS, np.float32)
        first = slot * MAX_VEC_T * lanes
        for t in range(n_tok):
            partial[first + t * lanes + lane] = acc[t]
        cuda.syncthreads()
        half = lanes // 2
        while half > 0:
            if lane < half:
                for t in range(n_tok):
                    partial[first + t * lanes + lane] += partial[first + t * lanes + lane + half]
            cuda.syncthreads()
            half //= 2
        if lane == 0 and row < out.shape[1]:
            extra = bias[row] if has_bias else np.float32(0.0)
            for t in range(n_tok):
                out[t, row] = partial[first + t * lanes] + extra

    return matvec


def _make_dequant(unit):
    @cuda.jit
    def dequant_rows(w, k, n_units, first_row, slab):
        """slab float32[R, K] <- rows first_row .. first_row + R of w; one (row, unit) per thread."""
        buf = cuda.local.array(UNIT, np.float32)
        n_rows = slab.shape[0]
        for job in range(cuda.grid(1), n_rows * n_units, cuda.gridsize(1)):
            r = job // n_units
            u = job % n_units
            unit(w, first_row + r, u, k, buf)
            base = u * UNIT
            for j in range(min(UNIT, k - base)):
                slab[r, base + j] = buf[j]

    return dequant_rows


def _make_gather(unit):
    @cuda.jit
    def gather_rows(w, k, n_units, ids, out):
        """out float32[T, K] <- rows ids[T] (range-checked by the caller) of w; one (token, unit) per thread."""
        buf = cuda.local.array(UNIT, np.float32)
        for job in range(cuda.grid(1), ids.shape[0] * n_units, cuda.gridsize(1)):
            t = job // n_units
            u = job % n_units
            unit(w, ids[t], u, k, buf)
            base = u * UNIT
            for j in range(min(UNIT, k - base)):
                out[t, base + j] = buf[j]

    return gather_rows


@cuda.jit
def gemm_xwt(x, slab, out, col0, bias, has_bias):
    """out[t, col0 + n] = sum_k x[t, k] * slab[n, k] (+ bias[col0 + n]).

    x float32[T, K]; slab float32[R, K]; out float32[T, N]. Block (tile, tile), grid
    (ceil(R / tile), ceil(T / tile)): each thread one output; x and slab tiles staged in shared memory
    (the slab tile padded by a column so that reading it by rows does not hit one bank)."""
    tile = cuda.blockDim.x
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    t = cuda.blockIdx.y * tile + ty
    n = cuda.blockIdx.x * tile + tx
    n_load = cuda.blockIdx.x * tile + ty  # the slab row this thread stages
    xs = cuda.shared.array((MAX_TILE, MAX_TILE), np.float32)
    ws = cuda.shared.array((MAX_TILE, MAX_TILE_PADDED), np.float32)
    n_tok, k = x.shape
    n_rows = slab.shape[0]
    acc = np.float32(0.0)
    for k0 in range(0, k, tile):
        kk = k0 + tx
        xs[ty, tx] = x[t, kk] if t < n_tok and kk < k else np.float32(0.0)
        ws[ty, tx] = slab[n_load, kk] if n_load < n_rows and kk < k else np.float32(0.0)
        cuda.syncthreads()
        for i in range(tile):
            acc += xs[ty, i] * ws[tx, i]
        cuda.syncthreads()
    if t < n_tok and n < n_rows:
        out[t, col0 + n] = acc + (bias[col0 + n] if has_bias else np.float32(0.0))
