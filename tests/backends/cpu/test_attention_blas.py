"""Prefill attention through BLAS (query blocks against the keys they see, one fused softmax pass)
against a float64 NumPy reference and the decode kernel, on random inputs."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from localllm.backends.cpu import attention_decode, kernels
from localllm.backends.cpu.attention_blas import BlasAttention

NO_SINKS = np.full(64, -np.inf, dtype=np.float32)  # attention without sinks (the kernels read one per head)


def reference(q, cache_k, cache_v, start, scale, window):
    """float64 softmax(scale q.k) v over the keys each query position sees."""
    n_tokens, n_head, head_dim = q.shape
    group = n_head // cache_k.shape[1]
    keys, values = cache_k.astype(np.float64), cache_v.astype(np.float64)
    out = np.zeros((n_tokens, n_head, head_dim))
    for t in range(n_tokens):
        pos = start + t
        first = max(0, pos - window + 1) if window > 0 else 0
        for h in range(n_head):
            s = keys[first : pos + 1, h // group] @ q[t, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ values[first : pos + 1, h // group]
    return out


def random_case(seed, n_tokens, n_head, n_kv, head_dim, start):
    rng = np.random.default_rng(seed)
    q = (2 * rng.standard_normal((n_tokens, n_head, head_dim))).astype(np.float32)
    n_ctx = start + n_tokens + 7  # positions past the chunk hold garbage the op must not read
    cache_k = rng.standard_normal((n_ctx, n_kv, head_dim)).astype(np.float16)
    cache_v = rng.standard_normal((n_ctx, n_kv, head_dim)).astype(np.float16)
    cache_k[start + n_tokens :] = np.float16(1e4)
    cache_v[start + n_tokens :] = np.float16(np.nan)
    return q, cache_k, cache_v


CASES = [  # n_tokens, n_head, n_kv, head_dim, start, window
    (200, 4, 1, 32, 0, 0),  # causal from an empty cache, several blocks
    (200, 4, 1, 32, 0, 50),  # sliding window narrower than a block
    (150, 8, 2, 16, 37, 0),  # GQA groups of 4, a chunk after cached positions
    (150, 8, 2, 16, 37, 100),  # ... with a window reaching back into the cache
    (70, 6, 3, 8, 300, 64),  # window shorter than the cached prefix: the oldest keys are never read
    (9, 4, 4, 8, 3, 2),  # group 1, tiny
    (64, 2, 1, 8, 0, 1),  # window 1: each query sees only itself
    (130, 4, 1, 256, 0, 512),  # Gemma 3 270M's shape
]


@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("case", CASES)
def test_blas_attention_matches_float64_reference(case, block):
    n_tokens, n_head, n_kv, head_dim, start, window = case
    q, cache_k, cache_v = random_case(sum(case) + block, n_tokens, n_head, n_kv, head_dim, start)
    out = np.full(q.shape, np.nan, np.float32)
    BlasAttention(block)(q, cache_k, cache_v, start, 0.3, window, out)
    expected = reference(q, cache_k, cache_v, start, 0.3, window)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("case", CASES)
def test_blas_attention_matches_decode_kernel(case):
    n_tokens, n_head, n_kv, head_dim, start, window = case
    q, cache_k, cache_v = random_case(sum(case), n_tokens, n_head, n_kv, head_dim, start)
    out = np.zeros(q.shape, np.float32)
    BlasAttention()(q, cache_k, cache_v, start, 0.3, window, out, 0.0, NO_SINKS[: q.shape[1]])
    expected = np.zeros(q.shape, np.float32)
    scores = np.empty((n_tokens * n_head, start + n_tokens), np.float32)
    attention_decode.attention(q, cache_k.view(np.uint16), cache_v.view(np.uint16), start, np.float32(0.3), np.float32(0.0), NO_SINKS, window, expected, scores, 4)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_blas_attention_independent_of_thread_count():
    q, cache_k, cache_v = random_case(5, 150, 8, 2, 16, 37)
    before = numba.get_num_threads()
    results = []
    try:
        for threads in {1, numba.config.NUMBA_NUM_THREADS}:
            numba.set_num_threads(threads)
            out = np.zeros(q.shape, np.float32)
            BlasAttention(32)(q, cache_k, cache_v, 37, 0.3, 60, out)
            results.append(out)
    finally:
        numba.set_num_threads(before)
    for out in results[1:]:
        np.testing.assert_array_equal(out, results[0])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_blas_attention_with_two_workers_equals_one(case, causal):
    """Blocks shared between Numba's threads (BLAS on one thread each) give every block exactly its
    result, and that result is NumPy's matmul's (the path where NumPy's BLAS function cannot be found)."""
    import threadpoolctl

    from localllm.backends.cpu import blas_sgemm

    assert blas_sgemm.address() is not None  # NumPy's wheels ship OpenBLAS: the parallel path runs here
    n_tokens, n_head, n_kv, head_dim, start, window = case
    window = window if causal else 0
    q, cache_k, cache_v = random_case(sum(case) + 1, n_tokens, n_head, n_kv, head_dim, start)
    sinks = np.random.default_rng(sum(case)).normal(0, 1, n_head).astype(np.float32)
    results = []
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        for workers in (1, 2, 3):
            out = np.full(q.shape, np.nan, np.float32)
            BlasAttention(32, workers=workers)(q, cache_k, cache_v, start, 0.3, window, out, 0.0, sinks, causal)
            results.append(out)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(blas_sgemm, "address", lambda: None)
            out = np.full(q.shape, np.nan, np.float32)
            BlasAttention(32, workers=2)(q, cache_k, cache_v, start, 0.3, window, out, 0.0, sinks, causal)
            results.append(out)
    for out in results[1:]:
        np.testing.assert_array_equal(out, results[0])


def test_shares_give_each_job_once_the_largest_first_to_the_least_loaded():
    from localllm.backends.cpu.attention_blas import _shares

    jobs = [(0, 0), (0, 64), (0, 128), (0, 192)]
    order, bounds = _shares(jobs, [64, 128, 192, 256], 2)
    shares = [sorted(map(tuple, order[bounds[w] : bounds[w + 1]].tolist())) for w in range(2)]
    assert shares == [[(0, 0), (0, 192)], [(0, 64), (0, 128)]]  # 320 each
    order, bounds = _shares(jobs, [64, 128, 192, 256], 3)
    assert sorted(map(tuple, order.tolist())) == sorted(jobs) and list(bounds) == [0, 1, 2, 4]
