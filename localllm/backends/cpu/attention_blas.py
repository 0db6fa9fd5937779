"""Prefill attention through BLAS: per KV head, scores = Q K^T as one matrix product, masked (causal and
sliding window), softmaxed, then times V. O(T x n_keys) work like the Numba kernel, but in GEMMs, which
is what a batch of hundreds of queries needs; decode (a few queries) stays on the Numba kernel."""

from __future__ import annotations

import numpy as np


class BlasAttention:
    """Reusable scratch for the scores and the float32 copies of one head's keys and values."""

    def __init__(self):
        self._scores = np.empty(0, dtype=np.float32)
        self._kv = np.empty(0, dtype=np.float32)

    def _buffer(self, name: str, size: int) -> np.ndarray:
        buf = getattr(self, name)
        if buf.size < size:
            buf = np.empty(size, dtype=np.float32)
            setattr(self, name, buf)
        return buf[:size]

    def __call__(self, q, cache_k, cache_v, start: int, scale: float, window: int, out) -> None:
        """q float32[T, Hq, D]; cache float16[n_ctx, Hkv, D] (positions < start + T filled);
        out float32[T, Hq, D]. Query t sits at position start + t."""
        n_tokens, n_head, head_dim = q.shape
        n_kv = cache_k.shape[1]
        group = n_head // n_kv
        n_keys = start + n_tokens
        positions = np.arange(start, n_keys)[:, None]
        keys = np.arange(n_keys)[None, :]
        allowed = keys <= positions
        if window > 0:
            allowed &= keys > positions - window
        bias = np.where(allowed, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)  # [T, n_keys]
        kv = self._buffer("_kv", 2 * n_keys * head_dim).reshape(2, n_keys, head_dim)
        scores = self._buffer("_scores", n_tokens * group * n_keys).reshape(n_tokens, group, n_keys)
        for g in range(n_kv):
            kv[0] = cache_k[:n_keys, g]  # float16 -> float32, exact
            kv[1] = cache_v[:n_keys, g]
            heads = slice(g * group, (g + 1) * group)
            np.matmul(q[:, heads].reshape(n_tokens * group, head_dim), kv[0].T, out=scores.reshape(n_tokens * group, n_keys))
            scores *= np.float32(scale)
            scores += bias[:, None, :]
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            out[:, heads] = np.matmul(scores.reshape(n_tokens * group, n_keys), kv[1]).reshape(n_tokens, group, head_dim)
