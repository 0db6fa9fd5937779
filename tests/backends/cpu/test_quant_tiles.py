"""The K-quant tile kernels (backends/cpu/quant_kernels/q2_k_tiles.py, q3_k_tiles.py, q4_k_tiles.py,
q5_k_tiles.py, q6_k_tiles.py: weight rows as vector lanes, prefill) against the one-row vec_dot, bit for bit: tiles of 16 rows with the last N % 16 rows left to the row kernels (through
matmul_rows), batches across the kernel's steps (four activation rows at a time, then one; chunks of CHUNK = 256),
extreme activations and weights, and every VectorCode instruction-set path (uncached copies compiled
under each VECTOR_ISA, as in test_quant_isa.py)."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
from quant_rows import bits, compiled_for_isa, isa_paths, random_rows
from test_quant_kquant_rows import _activations, _expected

from localllm import quant
from localllm.backends.cpu.matmul import BatchActivation, MatmulScratch, matmul_rows
from localllm.backends.cpu.quant_kernels import kernel_record, kernel_records, q2_k_tiles, q3_k_tiles, q4_k_tiles, q5_k_tiles, q6_k_tiles, vector

MODULES = {"Q2_K": q2_k_tiles, "Q3_K": q3_k_tiles, "Q4_K": q4_k_tiles, "Q5_K": q5_k_tiles, "Q6_K": q6_k_tiles}
TYPES = sorted(MODULES)


def _weights(name, rng, n_rows, k):
    """Every byte pattern and special scale (random_rows), then ordinary rows."""
    special = random_rows(name, min(n_rows, 13), k, rng)
    ordinary = quant.get(name).quantize(rng.normal(0, 0.05, (n_rows - special.shape[0], k)).astype(np.float32))
    return np.concatenate([special, ordinary.reshape(-1, special.shape[1])])


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("k", [256, 2048, 4608])
def test_tiles_equal_vec_dot_across_the_kernels_steps(name, k):
    QT = quant.get(name)
    rng = np.random.default_rng(k + 7)
    raw = _weights(name, rng, 32, k)
    assert MODULES[name].CHUNK == 256  # the batch sizes below cross its boundary
    for n_rows in (1, 3, 4, 5, 16, 19, 64, 255, 256, 257, 262):
        batch = BatchActivation(QT.act, n_rows, k).quantize(_activations(rng, n_rows, k, 3.0))
        out = np.full((n_rows, raw.shape[0]), np.nan, dtype=np.float32)
        MODULES[name].matvec_tiles(raw, out, *batch)
        np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw, batch)), err_msg=f"{name} K={k} T={n_rows}")


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n_weights", [16, 21, 47])
def test_matmul_rows_takes_tiles_and_the_rest_by_rows(name, n_weights):
    QT = quant.get(name)
    rng = np.random.default_rng(n_weights)
    k = 1024
    raw = _weights(name, rng, n_weights, k)
    min_rows = kernel_record(name).tiles.min_rows
    for n_rows in (min_rows - 1, min_rows, 37):
        x = _activations(rng, n_rows, k, 1.0)
        batch = BatchActivation(QT.act, n_rows, k).quantize(x)
        out = np.full((n_rows, n_weights), np.nan, dtype=np.float32)
        matmul_rows(QT, raw, x, out, MatmulScratch())
        np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw, batch)), err_msg=f"{name} N={n_weights} T={n_rows}")


@pytest.mark.parametrize("name", TYPES)
def test_matmul_rows_calls_the_tile_kernel_from_min_rows_where_available(name, monkeypatch):
    # Same bits either way, so only a spy shows whether the dispatch took the tiles: where the target
    # has them, a batch of MIN_ROWS rows must (or the speed is lost silently), one row fewer must not.
    calls = []
    kernel = MODULES[name].matvec_tiles
    assert kernel_record(name).tiles.matvec is kernel
    spy = dataclasses.replace(kernel_record(name).tiles, matvec=lambda *args: calls.append(args[1].shape[0]) or kernel(*args))
    record = dataclasses.replace(kernel_record(name), tiles=spy)
    cpu_matmul = sys.modules["localllm.backends.cpu.matmul"]  # the module (the package exports a function of that name)
    monkeypatch.setattr(cpu_matmul, "kernel_record", lambda qt: record if qt.name == name else kernel_record(qt))
    QT = quant.get(name)
    rng = np.random.default_rng(5)
    raw = _weights(name, rng, 32, 512)
    rows_from = cpu_matmul.tile_rows_from(spy)  # AVX-512 VNNI: min_rows; AVX2: narrow_min_rows
    min_rows = rows_from or spy.min_rows
    for n_rows in (min_rows - 1, min_rows):
        x = _activations(rng, n_rows, 512, 1.0)
        out = np.empty((n_rows, 32), dtype=np.float32)
        matmul_rows(QT, raw, x, out, MatmulScratch())
        np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw, BatchActivation(QT.act, n_rows, 512).quantize(x))))
    assert calls == ([min_rows] if rows_from is not None else [])
    if q4_k_tiles.available():
        assert rows_from == spy.min_rows


@pytest.mark.parametrize("wide, narrow", [(True, True), (True, False), (False, True), (False, False)])
def test_every_tile_kernel_runs_on_both_targets_and_leaves_no_product_to_blas(wide, narrow, monkeypatch):
    # Every type with tiles (the K-quants, IQ4_XS, legacy_tiles' six) has them on AVX-512 VNNI and on
    # AVX2; those without multi-row kernels (Q2_K, Q3_K, IQ4_XS, Q4_1, Q5_1) send long prompts through
    # dequantization and BLAS where the target has no fast tiles, and never where it has.
    cpu_matmul = sys.modules["localllm.backends.cpu.matmul"]
    monkeypatch.setattr(cpu_matmul, "_tiles_available", lambda: wide)
    monkeypatch.setattr(cpu_matmul, "_narrow_tiles_available", lambda: narrow)
    tiled = [record for record in kernel_records() if record.tiles is not None]
    assert {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q4_0", "Q5_0", "Q4_1", "Q5_1", "Q8_0", "IQ4_NL"} <= {r.name for r in tiled}
    for record in tiled:
        tiles = record.tiles
        want = tiles.min_rows if wide else tiles.narrow_min_rows if narrow else None
        assert (want is not None) == (wide or narrow), record.name
        assert cpu_matmul.tile_rows_from(tiles) == want, record.name
        assert cpu_matmul.has_fast_tiles(record.qt) == (want is not None), record.name
        if not record.has_multirow_kernels:
            assert cpu_matmul.blas_min_rows(record.qt) == (cpu_matmul.INTEGER_ALWAYS if want else cpu_matmul.BLAS_MIN_ROWS), record.name


@pytest.mark.parametrize("name", TYPES)
def test_tiles_equal_vec_dot_on_every_isa(name):
    QT = quant.get(name)
    rng = np.random.default_rng(41)
    k = 512
    raw = _weights(name, rng, 21, k)
    batches = [BatchActivation(QT.act, n, k).quantize(_activations(rng, n, k, 2.0)) for n in (5, 16, 66)]
    expected = [_expected(QT, raw, batch) for batch in batches]
    saved = vector.VECTOR_ISA
    try:
        for isa in isa_paths():
            vector.VECTOR_ISA = isa
            tiles = compiled_for_isa(MODULES[name].matvec_tiles)  # compiled now, for isa
            for batch, want in zip(batches, expected):
                n_rows = batch[0].shape[0]
                out = np.full((n_rows, raw.shape[0]), np.nan, dtype=np.float32)
                tiles(raw, out, *batch)
                np.testing.assert_array_equal(bits(out[:, :16]), bits(want[:, :16]), err_msg=f"{name} {isa} T={n_rows}")
    finally:
        vector.VECTOR_ISA = saved
