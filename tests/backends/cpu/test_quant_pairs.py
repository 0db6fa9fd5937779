"""The batched decode's pair kernels (backends/cpu/quant_kernels/pairs.py) give each row exactly the one-row vec_dot's value.

For every type with pair kernels, on every instruction-set path (VectorCode's "auto", "avx2", "generic",
compiled uncached as in test_quant_isa), the driver's matvec_rows over T = 1..17 activation rows is
compared bit for bit with vec_dot of each (weight row, activation row), on
- 39 weight rows: a chunk of CHUNK_ROWS and one of the 23 left (its last call overlapping the one
  before), and 3 weight rows (fewer than a call takes: vec_dot);
- K = 640 (the spread layout, where Q8_0 takes its weights as unsigned bytes from per-lane starts) and
  K = 1408 (44 blocks: a group of four pairs past SPREAD_MAX_BYTES, the compact layout);
so every kernel (8, 4, 2 activation rows; both layouts), both ends of a chunk and odd T's self-paired
last row are met.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from quant_rows import bits, isa_paths, random_rows

from localllm import quant
from localllm.backends.cpu.drivers import drivers
from localllm.backends.cpu.matmul import BatchActivation
from localllm.backends.cpu.quant_kernels import kernel_record, kernel_records, pairs, vector

PAIR_TYPES = [record.name for record in kernel_records() if record.pairs is not None]
N_WEIGHT_ROWS = 2 * pairs.CHUNK_ROWS + 7
FEW_WEIGHT_ROWS = pairs.PAIR_ROWS - 1
MAX_T = 17
assert {"Q4_0", "Q5_0", "Q8_0", "IQ4_NL"} <= set(PAIR_TYPES)  # the list is not silently empty


def _run_under(isa, fn, *args):
    saved = vector.VECTOR_ISA
    vector.VECTOR_ISA = isa
    try:
        return fn(*args)
    finally:
        vector.VECTOR_ISA = saved


def test_the_two_sizes_take_the_two_layouts():
    assert 640 // 32 * pairs.SPREAD_BLOCK_BYTES <= pairs.SPREAD_MAX_BYTES
    assert 1408 // 32 * pairs.SPREAD_BLOCK_BYTES > pairs.SPREAD_MAX_BYTES
    assert N_WEIGHT_ROWS % pairs.PAIR_ROWS != 0


@pytest.mark.parametrize("k", [640, 1408])
@pytest.mark.parametrize("name", PAIR_TYPES)
def test_pair_drivers_equal_vec_dot_for_every_batch_size_and_isa(name, k):
    rng = np.random.default_rng(31)
    qt = quant.get(name)
    raw = random_rows(name, N_WEIGHT_ROWS, k, rng, extremes=False)
    raw[1] = random_rows(name, 1, k, rng)[0]  # one row with the extreme scales and quants
    x = rng.standard_normal((MAX_T, k)).astype(np.float32)
    batch = BatchActivation(qt.act, MAX_T, k).quantize(x)
    expected = np.array([[kernel_record(qt).vec_dot(row, *(a[t] for a in batch)) for row in raw] for t in range(MAX_T)], dtype=np.float32)
    source = drivers(qt).matvec_rows.py_func
    for isa in isa_paths():
        matvec_rows = numba.njit(fastmath=True)(source)
        for t in range(1, MAX_T + 1):
            out = np.full((t, raw.shape[0]), np.nan, dtype=np.float32)
            _run_under(isa, matvec_rows, raw, out, *(a[:t] for a in batch))
            np.testing.assert_array_equal(bits(out), bits(expected[:t]), err_msg=f"{name} K={k} T={t} on {isa}")
            few = np.full((t, FEW_WEIGHT_ROWS), np.nan, dtype=np.float32)
            _run_under(isa, matvec_rows, raw[:FEW_WEIGHT_ROWS], few, *(a[:t] for a in batch))
            np.testing.assert_array_equal(bits(few), bits(expected[:t, :FEW_WEIGHT_ROWS]), err_msg=f"{name} K={k} T={t} on {isa}, 3 rows")


def test_pair_activations_per_lane_starts():
    # Q8_0's spread layout: lane j of a row's block holds -128 times the sum of its activation bytes 4j..4j+3.
    rng = np.random.default_rng(32)
    k, t = 64, 3
    qs = rng.integers(-127, 128, (t, k), dtype=np.int8)
    d = rng.random((t, k // 32), dtype=np.float32)
    s = qs.reshape(t, -1, 32).sum(axis=2, dtype=np.int32)
    n_pairs, nb = 2, k // 32
    pq = np.empty((n_pairs, nb * 64), np.int8)
    pd = np.empty((n_pairs, nb * 16), np.float32)
    ps = np.empty((n_pairs, nb * 16), np.int32)
    pairs.pair_activations(qs, d, s, 0, 128, pq, pd, ps)
    for p in range(n_pairs):
        for b in range(nb):
            for half in range(2):
                row = min(2 * p + half, t - 1)
                quads = qs[row, 32 * b : 32 * b + 32].reshape(8, 4).sum(axis=1, dtype=np.int32)
                np.testing.assert_array_equal(ps[p, 16 * b + 8 * half : 16 * b + 8 * half + 8], -128 * quads)
                np.testing.assert_array_equal(pd[p, 16 * b + 8 * half : 16 * b + 8 * half + 8], d[row, b])
                np.testing.assert_array_equal(pq[p, 64 * b + 32 * half : 64 * b + 32 * half + 32], qs[row, 32 * b : 32 * b + 32])
