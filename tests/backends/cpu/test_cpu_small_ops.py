"""The CPU backend's decode-step shortcuts compute what the general paths compute, bit for bit: the serial
twins of the small-op kernels (run without touching Numba's thread count) against the parallel kernels,
and the one-row matrix product through its per-weight plan against the general matmul."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest

from localllm import quant
from localllm.backends.base import Weight
from localllm.backends.cpu import CPUBackend, attention_decode, kernels
from localllm.backends.cpu.matmul import MatmulScratch, matmul


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(11)


@pytest.fixture(scope="module")
def backend():
    """One backend for every weight below, so their plans live side by side."""
    return CPUBackend(threads=2)


def test_rms_norm_serial_twin_matches_the_parallel_kernel_also_in_place(rng):
    x = (rng.standard_normal((5, 640)) * 3).astype(np.float32)
    weight = rng.standard_normal(640).astype(np.float32)
    want = np.empty_like(x)
    kernels.rms_norm(x, weight, np.float32(1e-6), want)
    got = np.empty_like(x)
    kernels.rms_norm_serial(x, weight, np.float32(1e-6), got)
    np.testing.assert_array_equal(bits(got), bits(want))
    in_place = x.copy()
    kernels.rms_norm_serial(in_place, weight, np.float32(1e-6), in_place)
    np.testing.assert_array_equal(bits(in_place), bits(want))
    assert not np.array_equal(want, x)


@pytest.mark.parametrize("neox", [True, False])
def test_rope_serial_twin_matches_the_parallel_kernel(rng, neox):
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)
    inv_freq = np.empty(32, dtype=np.float32)
    kernels.rope_inv_freqs(64, 10000.0, 1.0, np.empty(0, np.float32), inv_freq)
    positions = np.array([7, 8, 300], dtype=np.int32)
    cos = np.empty((3, 32), dtype=np.float32)
    sin = np.empty_like(cos)
    kernels.rope_table(positions, inv_freq, cos, sin)
    want, got = x.copy(), x.copy()
    kernels.rope(want, cos, sin, neox)
    kernels.rope_serial(got, cos, sin, neox)
    np.testing.assert_array_equal(bits(got), bits(want))
    assert not np.array_equal(want, x)


@pytest.mark.parametrize("gelu", [True, False])
def test_gated_act_serial_twin_matches_the_parallel_kernel_in_and_out_of_place(rng, gelu):
    gate = (rng.standard_normal((3, 2048)) * 4).astype(np.float32)
    up = rng.standard_normal(gate.shape).astype(np.float32)
    table = kernels.gelu_table()
    want = np.empty_like(gate)
    kernels.gated_act(gate, up, want, gelu, table)
    got = np.empty_like(gate)
    kernels.gated_act_serial(gate, up, got, gelu, table)
    np.testing.assert_array_equal(bits(got), bits(want))
    in_place = gate.copy()
    kernels.gated_act_serial(in_place, up, in_place, gelu, table)
    np.testing.assert_array_equal(bits(in_place), bits(want))


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("heads_per_job", [1, 4])
def test_attention_serial_twin_matches_the_parallel_kernel(rng, window, heads_per_job):
    n_ctx, n_kv, head_dim, start = 32, 2, 64, 9
    q = rng.standard_normal((3, 8, head_dim)).astype(np.float32)
    cache_k = rng.standard_normal((n_ctx, n_kv, head_dim)).astype(np.float16).view(np.uint16)
    cache_v = rng.standard_normal((n_ctx, n_kv, head_dim)).astype(np.float16).view(np.uint16)
    scores = np.empty((3 * 8, start + 3), dtype=np.float32)
    want = np.empty_like(q)
    attention_decode.attention(q, cache_k, cache_v, start, np.float32(0.125), np.float32(0.0), np.full(q.shape[1], -np.inf, np.float32), window, want, scores, heads_per_job)
    got = np.empty_like(q)
    attention_decode.attention_serial(q, cache_k, cache_v, start, np.float32(0.125), np.float32(0.0), np.full(q.shape[1], -np.inf, np.float32), window, got, scores, heads_per_job)
    np.testing.assert_array_equal(bits(got), bits(want))


@numba.njit(cache=False, fastmath=False)
def _softmax_reference(row, best):
    """The formula without the shortcut for underflowing arguments: exp of every one."""
    total = np.float32(0.0)
    for j in range(row.shape[0]):
        e = np.float32(math.exp(row[j] - best))
        row[j] = e
        total += e
    return np.float32(1.0) / total


def test_softmax_skips_only_exps_that_round_to_zero():
    # arguments from 0 down past the float32 underflow of exp (about -103.97), densely around the
    # shortcut's threshold, plus -inf and NaN
    near = np.nextafter(np.float32(-104.0), np.float32(0.0)) - np.arange(-2000, 2000, dtype=np.float32) * np.float32(1e-5)
    args = np.concatenate([np.linspace(-200, 0, 20001, dtype=np.float32), near, np.float32([-np.inf, -1e30, np.nan])])
    for best in (np.float32(0.0), np.float32(3.5)):
        row = args + best
        want_row = row.copy()
        want = _softmax_reference(want_row, best)
        got_row = row.copy()
        got = attention_decode._softmax_in_place(got_row, 0, row.shape[0] - 1, best, np.float32(-np.inf))
        np.testing.assert_array_equal(got_row.view(np.uint32), want_row.view(np.uint32))
        assert np.float32(got).view(np.uint32) == np.float32(want).view(np.uint32)
    assert np.isnan(got_row[-1]) and got_row[-2] == 0.0 and got_row[-3] == 0.0


def test_heads_per_job_groups_unless_that_idles_a_thread(monkeypatch):
    backend = CPUBackend(threads=1)
    monkeypatch.setattr(backend.thread_policy, "numba_now", lambda: 2)
    assert backend._heads_per_job(1, 32, 8, parallel=True) == 4  # Llama-3-8B: 8 jobs of four heads
    assert backend._heads_per_job(1, 4, 1, parallel=True) == 1  # Gemma 3 270M: one job of four would idle a thread
    assert backend._heads_per_job(2, 4, 1, parallel=True) == 4  # two rows: two jobs
    assert backend._heads_per_job(1, 4, 1, parallel=False) == 4  # the serial twin: one thread anyway


@pytest.mark.parametrize("group, head_dim", [(1, 64), (2, 64), (4, 128), (5, 64), (8, 32), (4, 72), (7, 48)])
def test_attention_grouped_heads_give_the_one_head_bits(rng, group, head_dim):
    """Four query heads that share a key head attend together (_attend4) with the bits each gets alone:
    heads_per_job changes only how the work is split. With attention sinks (gpt-oss), each head its own.
    Checked against the float64 formula too."""
    n_kv, n_tokens, start, window = 2, 3, 40, 0
    n_head = group * n_kv
    q = rng.standard_normal((n_tokens, n_head, head_dim)).astype(np.float32)
    k16 = rng.standard_normal((64, n_kv, head_dim)).astype(np.float16)
    v16 = rng.standard_normal((64, n_kv, head_dim)).astype(np.float16)
    scores = np.empty((n_tokens * n_head, start + n_tokens), dtype=np.float32)
    sinks = rng.normal(1.0, 1.0, n_head).astype(np.float32)
    results = {}
    for heads_per_job in (1, 4):
        for kernel in (attention_decode.attention, attention_decode.attention_serial):
            out = np.empty_like(q)
            kernel(q, k16.view(np.uint16), v16.view(np.uint16), start, np.float32(0.125), np.float32(0.0), sinks, window,
                   out, scores, heads_per_job)
            results[heads_per_job, kernel] = out
    first = results[1, attention_decode.attention]
    for out in results.values():
        np.testing.assert_array_equal(bits(out), bits(first))
    k, v = k16.astype(np.float64), v16.astype(np.float64)
    for t in range(n_tokens):
        for h in range(n_head):
            keys, values = k[: start + t + 1, h // group], v[: start + t + 1, h // group]
            s = keys @ q[t, h].astype(np.float64) * 0.125
            top = max(s.max(), float(sinks[h]))
            p = np.exp(s - top)
            np.testing.assert_allclose(first[t, h], p @ values / (p.sum() + np.exp(sinks[h] - top)), rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "qtype, n_out, k",
    [
        ("Q8_0", 48, 256),  # under SMALL_MATVEC_BYTES: one thread
        ("Q5_0", 512, 640),
        ("Q4_K", 256, 1024),
        ("Q6_K", 128, 512),
        ("F16", 64, 128),
    ],
)
def test_one_row_matmul_through_its_plan_equals_the_general_path(rng, backend, qtype, n_out, k):
    qt = quant.get(qtype)
    weights = qt.quantize((rng.standard_normal((n_out, k)) * 0.1).astype(np.float32)).reshape(n_out, -1)
    w = Weight(f"blk.0.{qtype}.weight", qtype, (k, n_out), weights)
    for _ in range(2):  # the first call makes the plan, the second uses it
        x = rng.standard_normal((1, k)).astype(np.float32)
        want = np.empty((1, n_out), dtype=np.float32)
        matmul(qt, weights, x, want, MatmulScratch())
        got = np.empty_like(want)
        backend.matmul(w, x, got)
        np.testing.assert_array_equal(bits(got), bits(want))
    bias = rng.standard_normal(n_out).astype(np.float32)
    backend.matmul(w, x, got, bias)
    np.testing.assert_array_equal(bits(got), bits(want + bias))


def test_rope_frequency_factors_of_a_freed_array_are_not_served_to_a_new_one(rng):
    """The inverse frequencies are cached per frequency-factor array, by id: a freed array's id is
    reused by the next one CPython allocates in its place (same size), which then got the old factors'
    frequencies. The cache now holds the array, so its id stays taken."""
    from localllm.backends.cpu import CPUBackend

    backend = CPUBackend(threads=1)
    positions = np.arange(3, dtype=np.int32)
    x = rng.standard_normal((3, 2, 16)).astype(np.float32)
    for trial in range(20):
        factors = np.full(8, 1.0 + trial, dtype=np.float32)
        got, want = x.copy(), x.copy()
        backend.rope(got, positions, 16, 10000.0, True, factors)
        CPUBackend(threads=1).rope(want, positions, 16, 10000.0, True, factors)  # no cache yet
        np.testing.assert_array_equal(got, want)
        del factors  # (before the fix, the next trial's array usually took this one's id)
