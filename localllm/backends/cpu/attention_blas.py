"""Prefill attention through BLAS: per KV head, the queries in blocks of BLOCK positions; each block's
scores Q K^T as one matrix product against only the keys that block can see (causal: up to its last
position; sliding window: from its first position's first key), softmaxed in one Numba pass
(kernels.masked_softmax_rows: scale, mask, max, exp, sum, normalise), then times V. At T = 512 from an
empty cache that is ~0.6 of the full T x T products. Decode (a few queries) stays on the Numba kernel.

The exp is kernels._exp_nonpositive (Numba has no vectorised exp without SVML), within an ulp of the
true value but not always NumPy's last bit; results match a float64 reference to ~1e-6 relative."""

from __future__ import annotations

import threading

import numpy as np

from . import kernels

# Query positions per block. Smaller blocks skip more of the masked triangle but make smaller matrix
# products. Gemma 3 270M's 18 layers at T = 512 (4 heads, 1 KV head, D 256), one BLAS thread, CPU time,
# medians of 15 alternating: 193 ms before blocking, 98 with blocks of 32, 100 of 64, 109 of 128, 128
# of 256. 64 rather than 32: the same here, and twice the rows per product for a second BLAS thread.
BLOCK = 64


class BlasAttention:
    """Reusable scratch for the scores and the float32 copies of the keys and values.

    `workers`: threads that take the (KV head, query block) products between them. With BLAS on one
    thread (CPUBackend: a model whose matrix products are all integer), two workers run two blocks at
    once: NumPy's matmul and the Numba softmax release the GIL, and every block is computed exactly as
    it is alone (the same single-threaded BLAS call), so the result does not depend on the count.

    The workers take the blocks from one queue, the latest (causal: the most keys) first, rather than a
    fixed share each: the pool's thread often starts late, its core still held by an OpenMP worker
    spinning after the last Numba region (backends/cpu/threads.py), and fixed shares were uneven besides
    (blocks 0 and 2 against 1 and 3). Gemma 3 270M, T = 256, per layer inside a prefill: the pool's
    thread began 0.77 ms after the call (0.18 with OMP_WAIT_POLICY=PASSIVE); docs/performance.md."""

    def __init__(self, block: int = BLOCK, workers: int = 1):
        self.block = block
        self.workers = workers
        self._pool = None
        self._scratch: dict[tuple[str, int], np.ndarray] = {}

    def _buffer(self, name: str, worker: int, size: int) -> np.ndarray:
        buf = self._scratch.get((name, worker))
        if buf is None or buf.size < size:
            buf = self._scratch[(name, worker)] = np.empty(size, dtype=np.float32)
        return buf[:size]

    def __call__(self, q, cache_k, cache_v, start: int, scale: float, window: int, out, softcap: float = 0.0,
                 sinks=None, causal: bool = True) -> None:
        """q float32[T, Hq, D]; cache float16[n_ctx, Hkv, D] (positions < start + T filled);
        out float32[T, Hq, D]. Query t sits at position start + t. softcap, sinks (float32[Hq], -inf for
        none): see masked_softmax_rows. Not `causal` (an encoder; window 0): every query sees all
        start + T keys."""
        n_tokens, n_head, head_dim = q.shape
        n_kv = cache_k.shape[1]
        window = int(window)
        if sinks is None:
            sinks = np.full(n_head, -np.inf, dtype=np.float32)
        # the first key any query sees: only keys from there on are converted to float32
        lo = max(0, start - window + 1) if window > 0 else 0
        n_keys = start + n_tokens
        kv = self._buffer("kv", 0, n_kv * 2 * (n_keys - lo) * head_dim).reshape(n_kv, 2, n_keys - lo, head_dim)
        k_bits, v_bits = cache_k.view(np.uint16), cache_v.view(np.uint16)
        for g in range(n_kv):
            kernels.f16_head_to_f32(k_bits, g, lo, kv[g, 0])  # float16 -> float32, exact
            kernels.f16_head_to_f32(v_bits, g, lo, kv[g, 1])
        # the latest query blocks first: under a causal mask they see the most keys
        jobs = [(g, t0) for t0 in reversed(range(0, n_tokens, self.block)) for g in range(n_kv)]
        workers = min(self.workers, len(jobs))
        args = (q, kv, lo, start, np.float32(scale), np.float32(softcap), window, out, sinks, causal)
        if workers <= 1:
            self._blocks(jobs, 0, *args)
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="localllm-attention")
        queue = _JobQueue(jobs)
        futures = [self._pool.submit(self._blocks, queue, w, *args) for w in range(1, workers)]
        self._blocks(queue, 0, *args)  # the caller takes jobs too, while the pool's threads start
        for future in futures:
            future.result()

    def _blocks(self, jobs, worker: int, q, kv, lo: int, start: int, scale, softcap, window: int, out, sinks,
                causal: bool = True) -> None:
        """The (KV head g, query block from t0) jobs (a list, or a _JobQueue shared with other workers),
        on this worker's scratch."""
        n_tokens, n_head, head_dim = q.shape
        n_kv = kv.shape[0]
        group = n_head // n_kv
        block = self.block
        n_keys = start + n_tokens
        max_rows = min(block, n_tokens) * group
        max_cols = min(n_keys - lo, min(block, n_tokens) + (window - 1 if window > 0 else n_keys))
        scores = self._buffer("scores", worker, max_rows * max_cols)
        direct = n_kv == 1 and out.flags.c_contiguous  # out[t0:t1] is then the block's [rows, D] output
        staged = None if direct else self._buffer("out", worker, max_rows * head_dim)
        for g, t0 in jobs:
            heads = slice(g * group, (g + 1) * group)
            t1 = min(t0 + block, n_tokens)
            rows = (t1 - t0) * group
            first_pos = start + t0
            k0 = max(lo, first_pos - window + 1) if window > 0 else 0  # keys [k0, k1) cover the block
            k1 = start + t1 if causal else n_keys
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


class _JobQueue:
    """Jobs handed out one at a time, in order, to whichever worker asks next (iterate it)."""

    def __init__(self, jobs: list):
        self._jobs = iter(jobs)
        self._lock = threading.Lock()

    def __iter__(self):
        return self

    def __next__(self):
        with self._lock:
            return next(self._jobs)
