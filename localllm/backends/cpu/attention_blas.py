"""Prefill attention through BLAS: per KV head, the queries in blocks of BLOCK positions; each block's
scores Q K^T as one matrix product against only the keys that block can see (causal: up to its last
position; sliding window: from its first position's first key), softmaxed in one Numba pass
(kernels.masked_softmax_rows: scale, mask, max, exp, sum, normalise), then times V. At T = 512 from an
empty cache that is ~0.6 of the full T x T products. Decode (a few queries) stays on the Numba kernel.

The exp is kernels._exp_nonpositive (Numba has no vectorised exp without SVML), within an ulp of the
true value but not always NumPy's last bit; results match a float64 reference to ~1e-6 relative."""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ...jit import exact_kernel
from . import blas_sgemm, kernels

# Query positions per block. Smaller blocks skip more of the masked triangle but make smaller matrix
# products. Gemma 3 270M's 18 layers at T = 512 (4 heads, 1 KV head, D 256), one BLAS thread, CPU time,
# medians of 15 alternating: 193 ms before blocking, 98 with blocks of 32, 100 of 64, 109 of 128, 128
# of 256. 64 rather than 32: the same here, and twice the rows per product for a second BLAS thread.
BLOCK = 64


class BlasAttention:
    """Reusable scratch for the scores and the float32 copies of the keys and values.

    `workers`: threads that take the (KV head, query block) products between them, each calling BLAS
    on one thread (CPUBackend: a model whose matrix products are all integer, so BLAS has one thread).
    They are Numba's OpenMP workers, in one parallel loop that calls NumPy's own OpenBLAS directly
    (blas_sgemm.py; NumPy's matmul from a Python thread pool before: that thread waited ~0.8 ms for a
    core still held by a spinning OpenMP worker, docs/performance.md). The blocks are shared out by
    their products' sizes before the loop (the largest first, each to the least loaded worker), and
    every block is computed exactly as alone, so the result does not depend on the count.

    `numpy_only` (the basic tier, tiers.py: that parallel kernel is compiled in the background), or where
    NumPy's BLAS is not an OpenBLAS whose function can be found: one thread runs every block through
    NumPy's matmul, with the same result."""

    def __init__(self, block: int = BLOCK, workers: int = 1):
        self.block = block
        self.workers = workers
        self.numpy_only = False
        self._scratch: dict[str, np.ndarray] = {}

    def _buffer(self, name: str, size: int) -> np.ndarray:
        buf = self._scratch.get(name)
        if buf is None or buf.size < size:
            buf = self._scratch[name] = np.empty(size, dtype=np.float32)
        return buf[:size]

    def __call__(self, q, cache_k, cache_v, start: int, scale: float, window: int, out, softcap: float = 0.0,
                 sinks=None, causal: bool = True) -> None:
        """q float32[T, Hq, D]; cache float16[n_ctx, Hkv, D] (positions < start + T filled);
        out float32[T, Hq, D]. Query t sits at position start + t. softcap, sinks (float32[Hq], -inf for
        none): see masked_softmax_rows. Not `causal` (an encoder; window 0): every query sees all
        start + T keys."""
        n_tokens, n_head, head_dim = q.shape
        n_kv = cache_k.shape[1]
        group = n_head // n_kv
        window = int(window)
        if sinks is None:
            sinks = np.full(n_head, -np.inf, dtype=np.float32)
        # the first key any query sees: only keys from there on are converted to float32
        lo = max(0, start - window + 1) if window > 0 else 0
        n_keys = start + n_tokens
        kv = self._buffer("kv", n_kv * 2 * (n_keys - lo) * head_dim).reshape(n_kv, 2, n_keys - lo, head_dim)
        k_bits, v_bits = cache_k.view(np.uint16), cache_v.view(np.uint16)
        for g in range(n_kv):
            kernels.f16_head_to_f32(k_bits, g, lo, kv[g, 0])  # float16 -> float32, exact
            kernels.f16_head_to_f32(v_bits, g, lo, kv[g, 1])
        jobs = [(g, t0) for t0 in range(0, n_tokens, self.block) for g in range(n_kv)]
        block_rows = min(self.block, n_tokens) * group  # the score rows of a block, at most
        max_keys = min(n_keys - lo, min(self.block, n_tokens) + (window - 1 if window > 0 else n_keys))  # its keys
        args = (q, kv, lo, start, np.float32(scale), np.float32(softcap), window, out, sinks, causal)
        function = None if self.numpy_only else blas_sgemm.address()
        if function is None:
            self._numpy_blocks(jobs, block_rows * max_keys, *args)
            return
        workers = max(1, min(self.workers, numba.get_num_threads(), len(jobs)))
        # shared by the size of their products: rows times keys (the head size is every block's)
        sizes = [self._block_size(t0, n_tokens, group, start, lo, window, causal) for _, t0 in jobs]
        order, bounds = _shares(jobs, sizes, workers)
        q = np.ascontiguousarray(q)
        direct = n_kv == 1 and out.flags.c_contiguous  # out[t0:t1] is then the block's [rows, D] output
        scores = self._buffer("scores", workers * block_rows * max_keys).reshape(workers, -1)
        staged = 0 if direct else workers * block_rows * head_dim
        staged_q = self._buffer("q", staged).reshape(workers, -1)
        staged_o = self._buffer("out", staged).reshape(workers, -1)
        row_sinks = np.tile(sinks.reshape(n_kv, group), (1, min(self.block, n_tokens)))  # non-causal: a sink per row
        _run_shares(function, order, bounds, self.block, direct, q, kv, lo, start, np.float32(scale), np.float32(softcap),
                    window, out, sinks, row_sinks, causal, scores, staged_q, staged_o)

    def _block_size(self, t0: int, n_tokens: int, group: int, start: int, lo: int, window: int, causal: bool) -> int:
        """Rows times keys of the block from t0."""
        t1, k0, k1 = _query_block(t0, self.block, n_tokens, start, lo, window, causal)
        return (t1 - t0) * group * (k1 - k0)

    def _numpy_blocks(self, jobs, scores_size: int, q, kv, lo: int, start: int, scale, softcap, window: int, out,
                      sinks, causal: bool = True) -> None:
        """The (KV head g, query block from t0) jobs on the calling thread, through NumPy's matmul."""
        n_tokens, n_head, head_dim = q.shape
        group = n_head // kv.shape[0]
        block = self.block
        n_keys = start + n_tokens
        scores = self._buffer("scores", scores_size)
        direct = kv.shape[0] == 1 and out.flags.c_contiguous
        staged = None if direct else self._buffer("out", min(block, n_tokens) * group * head_dim)
        for g, t0 in jobs:
            heads = slice(g * group, (g + 1) * group)
            t1, k0, k1 = _query_block(t0, block, n_tokens, start, lo, window, causal)
            rows = (t1 - t0) * group
            first_pos = start + t0
            s = scores[: rows * (k1 - k0)].reshape(rows, k1 - k0)
            qb = q[t0:t1, heads].reshape(rows, head_dim)  # a view when n_kv == 1
            np.matmul(qb, kv[g, 0, k0 - lo : k1 - lo].T, out=s)
            if causal:
                kernels.masked_softmax_rows(s, first_pos, group, k0, scale, softcap, window, sinks[heads])
            else:  # every row as the last position's (group = all rows): all keys seen; each row's head's sink
                kernels.masked_softmax_rows(s, n_keys - 1, rows, k0, scale, softcap, 0, np.tile(sinks[heads], t1 - t0))
            if direct:
                np.matmul(s, kv[g, 1, k0 - lo : k1 - lo], out=out[t0:t1].reshape(rows, head_dim))
            else:
                o = staged[: rows * head_dim].reshape(rows, head_dim)
                np.matmul(s, kv[g, 1, k0 - lo : k1 - lo], out=o)
                out[t0:t1, heads] = o.reshape(t1 - t0, group, head_dim)


@exact_kernel
def _query_block(t0, block, n_tokens, start, lo, window, causal):
    """The query block from t0 as (t1, k0, k1): its queries t0 <= t < t1 (positions start + t), and the
    keys [k0, k1) that cover them. Causal: up to its last position; a sliding window (window > 0) from
    its first position's first key, never before lo (the first key converted). Not causal: all of
    start + n_tokens keys. The one place this geometry is written: the NumPy path, the parallel loop
    and the shares' sizes all call it."""
    t1 = min(t0 + block, n_tokens)
    k0 = max(lo, start + t0 - window + 1) if window > 0 else 0
    k1 = start + t1 if causal else start + n_tokens
    return t1, k0, k1


def _shares(jobs: list, sizes: list, workers: int) -> tuple[np.ndarray, np.ndarray]:
    """The jobs shared between `workers`, the largest first, each to the worker with the least so far:
    (int64[n_jobs, 2] the jobs worker by worker, int64[workers + 1] where each worker's start)."""
    loads = [0] * workers
    taken: list[list] = [[] for _ in range(workers)]
    for i in sorted(range(len(jobs)), key=lambda i: -sizes[i]):
        w = loads.index(min(loads))
        taken[w].append(jobs[i])
        loads[w] += sizes[i]
    order = np.array([job for share in taken for job in share], dtype=np.int64).reshape(-1, 2)
    bounds = np.cumsum([0] + [len(share) for share in taken]).astype(np.int64)
    return order, bounds


@exact_kernel
def _address(array):
    """The address of an array's data as a signed integer (ctypes.data is unsigned, and Numba makes the
    sum of unsigned and signed integers a float)."""
    return np.int64(array.ctypes.data)


@exact_kernel(parallel=True)
def _run_shares(function, order, bounds, block, direct, q, kv, lo, start, scale, softcap, window, out, sinks, row_sinks,
                causal, scores, staged_q, staged_o):
    """Worker w's jobs order[bounds[w]:bounds[w + 1]], (KV head g, query block from t0) each, as
    BlasAttention._numpy_blocks computes them (the same BLAS calls), in one parallel loop over the
    workers; scores, staged_q and staged_o are float32[workers, ...] scratch rows (the staged ones
    unused when `direct`: one KV head, out C-contiguous). q C-contiguous [T, Hq, D]; kv float32
    [Hkv, 2, keys from lo, D]."""
    n_tokens, n_head, head_dim = q.shape
    group = n_head // kv.shape[0]
    span = kv.shape[2]
    n_keys = start + n_tokens
    floats = 4  # bytes of a float32: the BLAS operands are addresses
    for w in prange(bounds.shape[0] - 1):
        s_at = _address(scores) + w * scores.shape[1] * floats
        for j in range(bounds[w], bounds[w + 1]):
            g, t0 = order[j, 0], order[j, 1]
            t1, k0, k1 = _query_block(t0, block, n_tokens, start, lo, window, causal)
            rows = (t1 - t0) * group
            first_pos = start + t0
            n_k = k1 - k0
            if direct:
                q_at = _address(q) + t0 * n_head * head_dim * floats
                o_at = _address(out) + t0 * n_head * head_dim * floats
            else:  # the block's heads gathered into [rows, D]
                staged_q[w, : rows * head_dim].reshape((t1 - t0, group, head_dim))[:] = q[t0:t1, g * group : (g + 1) * group]
                q_at = _address(staged_q) + w * staged_q.shape[1] * floats
                o_at = _address(staged_o) + w * staged_o.shape[1] * floats
            k_at = _address(kv) + ((2 * g * span) + k0 - lo) * head_dim * floats
            v_at = _address(kv) + (((2 * g + 1) * span) + k0 - lo) * head_dim * floats
            blas_sgemm.sgemm(function, True, rows, n_k, head_dim, q_at, head_dim, k_at, head_dim, s_at, n_k)
            s = scores[w, : rows * n_k].reshape((rows, n_k))
            if causal:
                kernels.masked_softmax_rows(s, first_pos, group, k0, scale, softcap, window, sinks[g * group : (g + 1) * group])
            else:  # every row as the last position's (group = all rows): all keys seen; each row's head's sink
                kernels.masked_softmax_rows(s, n_keys - 1, rows, k0, scale, softcap, 0, row_sinks[g, :rows])
            blas_sgemm.sgemm(function, False, rows, head_dim, n_k, s_at, n_k, v_at, head_dim, o_at, head_dim)
            if not direct:
                out[t0:t1, g * group : (g + 1) * group] = staged_o[w, : rows * head_dim].reshape((t1 - t0, group, head_dim))
