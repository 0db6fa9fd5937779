"""The IQ4_XS tile kernel (backends/cpu/quant_kernels/iq4_tiles.py: weight rows as vector lanes, prefill) against
the one-row vec_dot, bit for bit, as test_quant_tiles.py checks the K-quants': batches across the kernel's steps
(four activation rows at a time, then one; chunks of CHUNK = 256), extreme activations and weights, the last
N % 16 rows left to the row kernels (through matmul_rows), and every VectorCode instruction-set path (uncached
copies compiled under each VECTOR_ISA). IQ4_NL's tiles are legacy_tiles' (test_quant_tiles_legacy.py)."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
from quant_rows import bits, compiled_for_isa, isa_paths, random_rows
from test_quant_kquant_rows import _activations, _expected

from localllm import quant
from localllm.backends.cpu.matmul import BatchActivation, MatmulScratch, matmul_rows
from localllm.backends.cpu.quant_kernels import iq4_tiles, kernel_record, q4_k_tiles, vector

KERNELS = {"IQ4_XS": iq4_tiles.matvec_tiles_xs}
TYPES = sorted(KERNELS)
LENGTHS = {"IQ4_XS": [256, 2048, 4608]}  # whole super-blocks


def _weights(name, rng, n_rows, k):
    """Every byte pattern and special scale (random_rows), then ordinary rows."""
    special = random_rows(name, min(n_rows, 13), k, rng)
    ordinary = quant.get(name).quantize(rng.normal(0, 0.05, (n_rows - special.shape[0], k)).astype(np.float32))
    return np.concatenate([special, ordinary.reshape(-1, special.shape[1])])


def _with_extreme_indices(QT, raw):
    """raw with weight rows 13, 14 and 15 at the table's ends in every block (indices 0, 15, and 15 / 0
    alternating: the largest unsigned values and offsets, and on AVX2 the largest signed magnitudes)."""
    first_index_byte = 8  # after d and the scales
    blocks = raw.reshape(raw.shape[0], -1, QT.type_size)  # a view: the fills below go into raw
    for i, fill in ((13, 0x00), (14, 0xFF), (15, 0x0F)):
        blocks[i, :, first_index_byte:] = fill
    return raw


def _cases():
    return [(name, k) for name in TYPES for k in LENGTHS[name]]


@pytest.mark.parametrize(("name", "k"), _cases())
def test_tiles_equal_vec_dot_across_the_kernels_steps(name, k):
    QT = quant.get(name)
    rng = np.random.default_rng(k + 7)
    raw = _weights(name, rng, 32, k)
    assert iq4_tiles.CHUNK == 256  # the batch sizes below cross its boundary
    for n_rows in (1, 3, 4, 5, 16, 19, 64, 255, 256, 257, 262):
        batch = BatchActivation(QT.act, n_rows, k).quantize(_activations(rng, n_rows, k, 3.0))
        out = np.full((n_rows, raw.shape[0]), np.nan, dtype=np.float32)
        KERNELS[name](raw, out, *batch)
        np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw, batch)), err_msg=f"{name} K={k} T={n_rows}")


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("scale", [1e-3, 1e4])
def test_tiles_equal_vec_dot_on_extreme_weights_and_activations(name, scale):
    # Every quant at the table's ends (index 0 and 15: the largest unsigned values and offsets), with
    # activations from tiny to saturated (every quant at +-127: the largest 32-element sums).
    QT = quant.get(name)
    rng = np.random.default_rng(3)
    k = 1024
    raw = _with_extreme_indices(QT, _weights(name, rng, 16, k))
    x = _activations(rng, 9, k, scale)
    x[5] = np.where(np.arange(k) % 2, 1.0, -1.0)  # alternating +-127
    batch = BatchActivation(QT.act, 9, k).quantize(x)
    out = np.full((9, 16), np.nan, dtype=np.float32)
    KERNELS[name](raw, out, *batch)
    np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw, batch)), err_msg=f"{name} scale={scale}")


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n_weights", [16, 21, 47])
def test_matmul_rows_takes_tiles_and_the_rest_by_rows(name, n_weights):
    QT = quant.get(name)
    rng = np.random.default_rng(n_weights)
    k = 1024
    raw = _weights(name, rng, n_weights, k)
    for n_rows in (iq4_tiles.MIN_ROWS - 1, iq4_tiles.MIN_ROWS, 37):
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
    kernel = KERNELS[name]
    assert kernel_record(name).tiles.matvec is kernel
    spy = dataclasses.replace(kernel_record(name).tiles, matvec=lambda *args: calls.append(args[1].shape[0]) or kernel(*args))
    record = dataclasses.replace(kernel_record(name), tiles=spy)
    cpu_matmul = sys.modules["localllm.backends.cpu.matmul"]  # the module (the package exports a function of that name)
    monkeypatch.setattr(cpu_matmul, "kernel_record", lambda qt: record if qt.name == name else kernel_record(qt))
    QT = quant.get(name)
    rng = np.random.default_rng(5)
    raw = _weights(name, rng, 32, 512)
    rows_from = cpu_matmul.tile_rows_from(spy)  # AVX-512 VNNI: MIN_ROWS; AVX2: NARROW_MIN_ROWS
    min_rows = rows_from or iq4_tiles.MIN_ROWS
    for n_rows in (min_rows - 1, min_rows):
        x = _activations(rng, n_rows, 512, 1.0)
        out = np.empty((n_rows, 32), dtype=np.float32)
        matmul_rows(QT, raw, x, out, MatmulScratch())
        np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw, BatchActivation(QT.act, n_rows, 512).quantize(x))))
    assert calls == ([min_rows] if rows_from is not None else [])
    if q4_k_tiles.available():
        assert rows_from == iq4_tiles.MIN_ROWS


@pytest.mark.parametrize("name", TYPES)
def test_tiles_equal_vec_dot_on_every_isa(name):
    QT = quant.get(name)
    rng = np.random.default_rng(41)
    k = 512
    raw = _with_extreme_indices(QT, _weights(name, rng, 21, k))
    saturated = np.where(np.arange(k) % 2, 1.0, -1.0)[None].repeat(5, 0).astype(np.float32)  # alternating +-127
    batches = [BatchActivation(QT.act, n, k).quantize(_activations(rng, n, k, 2.0)) for n in (5, 16, 66)]
    batches.append(BatchActivation(QT.act, 5, k).quantize(saturated))
    expected = [_expected(QT, raw, batch) for batch in batches]
    saved = vector.VECTOR_ISA
    try:
        for isa in isa_paths():
            vector.VECTOR_ISA = isa
            tiles = compiled_for_isa(KERNELS[name])  # compiled now, for isa
            for batch, want in zip(batches, expected):
                n_rows = batch[0].shape[0]
                out = np.full((n_rows, raw.shape[0]), np.nan, dtype=np.float32)
                tiles(raw, out, *batch)
                np.testing.assert_array_equal(bits(out[:, :16]), bits(want[:, :16]), err_msg=f"{name} {isa} T={n_rows}")
    finally:
        vector.VECTOR_ISA = saved
