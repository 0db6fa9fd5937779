"""The multi-row K-quant kernels (backends/cpu/quant_kernels/kquant_rows.py, through the batched decode driver) against the
one-row vec_dot, bit for bit.

The server's batched decode needs a row's result not to depend on the batch, so every out[t, r] of
matvec_rows must be the very float vec_dot(w[r], aqs[t], ad[t], asum[t]) gives: batches of T = 1..35
(groups of sixteen, of eight, a tail group of eight or four repeating the last row, a pair, a lone row),
rows of 256..14336, extreme
activations (quants at -127 and 127, the largest 16- and 32-element sums, all zero) and weights (every
byte pattern, zero blocks, special float16 scales); and the same on every VectorCode instruction-set
path (uncached copies compiled under each VECTOR_ISA, as in test_quant_isa.py).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from quant_rows import bits, isa_paths, random_rows

from localllm import quant
from localllm.backends.cpu.drivers import row_drivers
from localllm.backends.cpu.matmul import BatchActivation
from localllm.backends.cpu.quant_kernels import kernel_record, kernel_records, vector

TYPES = sorted(record.name for record in kernel_records() if record.rows is not None)


def _activations(rng, n_rows, k, scale):
    x = (rng.standard_normal((n_rows, k)) * scale).astype(np.float32)
    x[0, :3] = [-1e5, 1e5, 0.0]  # quants at -127 and 127
    if n_rows > 2:
        x[1] = 1.0  # every quant 127: the largest sums (2032 per 16, 4064 per 32)
        x[2] = -3.0
    if n_rows > 4:
        x[3] = 0.0  # an all-zero row (scale 0)
    return x


def _expected(qt, raw, batch):
    n_rows = batch[0].shape[0]
    return np.array([[kernel_record(qt).vec_dot(row, *(a[t] for a in batch)) for row in raw] for t in range(n_rows)], dtype=np.float32)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("k", [256, 2048])
def test_matvec_rows_equals_vec_dot_for_every_batch_size(name, k):
    rng = np.random.default_rng(k + 1)
    qt = quant.get(name)
    raw = random_rows(name, 13, k, rng)
    matvec_rows = row_drivers(qt).matvec_rows
    for n_rows in list(range(1, 18)) + [24, 29, 35]:
        batch = BatchActivation(qt.act, n_rows, k).quantize(_activations(rng, n_rows, k, 3.0))
        out = np.full((n_rows, raw.shape[0]), np.nan, dtype=np.float32)
        matvec_rows(raw, out, *batch)
        np.testing.assert_array_equal(bits(out), bits(_expected(qt, raw, batch)), err_msg=f"{name} K={k} T={n_rows}")


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("k", [4096, 4608, 14336])
@pytest.mark.parametrize("scale", [0.01, 1.0, 1e4])
def test_matvec_rows_equals_vec_dot_on_long_rows(name, k, scale):
    # Rows longer than the driver's CHUNK blocks go in ranges of blocks, the float sums carried over.
    rng = np.random.default_rng(k)
    qt = quant.get(name)
    raw = np.concatenate([random_rows(name, 5, k, rng), qt.quantize(rng.normal(0, 0.05, (3, k)).astype(np.float32))])
    # eight; and a lone row, a pair, a group of four, a group of eight repeating T - 1; sixteen, and
    # sixteen followed by each of those
    for n_rows in (8, 9, 10, 11, 13, 16, 17, 26, 29, 35):
        batch = BatchActivation(qt.act, n_rows, k).quantize(_activations(rng, n_rows, k, scale))
        out = np.empty((n_rows, raw.shape[0]), dtype=np.float32)
        row_drivers(qt).matvec_rows(raw, out, *batch)
        np.testing.assert_array_equal(bits(out), bits(_expected(qt, raw, batch)), err_msg=f"{name} K={k} T={n_rows}")


@pytest.mark.parametrize("name", TYPES)
def test_matvec_rows_equals_vec_dot_on_every_isa(name):
    rng = np.random.default_rng(31)
    qt = quant.get(name)
    k = 512
    raw = random_rows(name, 9, k, rng)
    batches = [BatchActivation(qt.act, n, k).quantize(_activations(rng, n, k, 2.0)) for n in (2, 3, 8, 13, 16, 19)]
    expected = [_expected(qt, raw, batch) for batch in batches]
    saved = vector.VECTOR_ISA
    try:
        for isa in isa_paths():
            vector.VECTOR_ISA = isa
            matvec_rows = numba.njit(fastmath=True)(row_drivers(qt).matvec_rows.py_func)  # compiled now, for isa
            for batch, want in zip(batches, expected):
                out = np.empty((batch[0].shape[0], raw.shape[0]), dtype=np.float32)
                matvec_rows(raw, out, *batch)
                np.testing.assert_array_equal(bits(out), bits(want), err_msg=f"{name} {isa} T={batch[0].shape[0]}")
    finally:
        vector.VECTOR_ISA = saved


@pytest.mark.parametrize("name", TYPES)
def test_packing_repeats_the_last_row(name):
    # Groups past the batch repeat row T - 1, so the kernels' extra lanes are real rows' values.
    pack = kernel_record(name).rows.pack
    rng = np.random.default_rng(32)
    qs = rng.integers(-127, 128, (5, 512), dtype=np.int8)
    d = rng.random((5, 2), dtype=np.float32)
    s = qs.reshape(5, -1, 16).sum(axis=2, dtype=np.int32)
    pq, pd, ps = pack(qs, d, s, 3, 1, 4)
    rows = [3, 4, 4, 4]
    assert pq.ctypes.data % 64 == 0 and ps.ctypes.data % 64 == 0
    np.testing.assert_array_equal(pq.reshape(2, 4, 256), qs.reshape(5, 2, 256)[rows].transpose(1, 0, 2))
    np.testing.assert_array_equal(pd.reshape(2, 4), d[rows].T)
    per_row = ps.shape[1] // 8
    sums = s.reshape(5, 2, 16)[rows].transpose(1, 0, 2)
    if per_row == 8:
        sums = sums.reshape(2, 4, 8, 2).sum(axis=3)
    np.testing.assert_array_equal(ps.reshape(2, 4, per_row), sums)
