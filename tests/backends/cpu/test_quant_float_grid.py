"""The float weight types' kernels (backends/cpu/quant_kernels/float_grid.py: F32, F16, BF16): vec_dot in
its documented order, checked against an emulation of that order in NumPy (each fused multiply-add done in
float64, where the product of two float32 values is exact, then rounded to float32), the grid kernel
(matvec_tiles) against vec_dot bit for bit across its steps (4 x 4 dots, then single activation rows), the
decode's matvec (four rows a step) likewise,
row lengths with and without a 16-element tail, special values, and the dispatch from matmul_rows."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
from quant_rows import bits

from localllm import quant
from localllm.backends.cpu.matmul import MatmulScratch, matmul_rows, matvec_kernel
from localllm.backends.cpu.quant_kernels import TileKernel, kernel_record
from localllm.backends.cpu.quant_kernels.float_grid import LANES, MIN_ROWS
from localllm.backends.cpu.quant_kernels.q4_k_tiles import available as tiles_available

TYPES = ("F32", "F16", "BF16")


def _fma32(a, b, c):
    """float32 fma, elementwise: a * b is exact in float64; the sum rounded once more to float32 (a
    double rounding that differs from one rounding only when the float64 sum lands on a float32 midpoint:
    never for these inputs, whose products have at most 48 significant bits)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _emulated_dot(w: np.ndarray, x: np.ndarray) -> np.float32:
    """The documented order: 16 running fma sums over 16-element chunks, added by halves, then the tail."""
    n = x.shape[0]
    full = n - n % LANES
    acc = np.zeros(LANES, np.float32)
    for at in range(0, full, LANES):
        acc = _fma32(w[at : at + LANES], x[at : at + LANES], acc)
    width = LANES
    while width > 1:
        width //= 2
        acc = (acc[:width] + acc[width : 2 * width]).astype(np.float32)
    total = acc[0]
    for j in range(full, n):
        total = _fma32(np.float32(w[j]), np.float32(x[j]), np.float32(total))
    return np.float32(total)


def _rows(name, rng, n_rows, k):
    return quant.get(name).quantize(rng.normal(0, 1, (n_rows, k)).astype(np.float32)).reshape(n_rows, -1)


def _weights_as_f32(name, raw):
    return np.stack([quant.get(name).dequantize(row).reshape(-1) for row in raw]).astype(np.float32)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("k", [5, 16, 640, 647])
def test_vec_dot_follows_the_documented_order(name, k):
    rng = np.random.default_rng(k)
    raw = _rows(name, rng, 6, k)
    values = _weights_as_f32(name, raw)
    x = rng.normal(0, 1, (6, k)).astype(np.float32)
    record = kernel_record(name)
    for r in range(6):
        got = record.vec_dot(raw[r], x[r])
        np.testing.assert_array_equal(bits(np.float32(got)), bits(_emulated_dot(values[r], x[r])), err_msg=f"{name} K={k} row {r}")


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("k", [16, 640, 2048 + 7])
def test_tiles_equal_vec_dot_across_the_kernels_steps(name, k):
    rng = np.random.default_rng(k + 3)
    n_weights = 37  # two tiles of 16 and a tail of 5 rows that the tile kernel leaves alone
    raw = _rows(name, rng, n_weights, k)
    record = kernel_record(name)
    for n_act in (1, 2, 3, 4, 5, 8, 9):
        x = rng.normal(0, 2, (n_act, k)).astype(np.float32)
        out = np.full((n_act, n_weights), np.nan, dtype=np.float32)
        record.tiles.matvec(raw, out, x)
        expected = np.array([[record.vec_dot(raw[r], x[t]) for r in range(n_weights)] for t in range(n_act)], np.float32)
        np.testing.assert_array_equal(bits(out[:, :32]), bits(expected[:, :32]), err_msg=f"{name} K={k} T={n_act}")
        assert np.isnan(out[:, 32:]).all()  # the tail rows are matmul_rows' (row kernels)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n_rows", [1, 3, 4, 9, 38])
def test_decode_matvec_equals_vec_dot_on_every_row(name, n_rows):
    # row i of each quarter together (float_matvec's step), the last N % 4 rows one by one
    rng = np.random.default_rng(n_rows)
    for k in (16, 647):
        raw = _rows(name, rng, n_rows, k)
        x = rng.normal(0, 1, k).astype(np.float32)
        out = np.full(n_rows, np.nan, dtype=np.float32)
        matvec_kernel(quant.get(name))(raw, out, x)
        expected = np.array([kernel_record(name).vec_dot(raw[r], x) for r in range(n_rows)], np.float32)
        np.testing.assert_array_equal(bits(out), bits(expected), err_msg=f"{name} K={k} N={n_rows}")


@pytest.mark.parametrize("name", TYPES)
def test_special_values_take_the_same_path_everywhere(name):
    # infinities, NaNs, the smallest normal and subnormal values of each type, and zeros of both signs
    k = 48
    specials = np.array([np.inf, -np.inf, np.nan, 6e-8, -6e-8, 1e-40, 0.0, -0.0, 65504.0, 3e38], np.float32)
    rng = np.random.default_rng(1)
    values = rng.choice(specials, size=(16, k)).astype(np.float32)
    values[::3] = rng.normal(0, 1, (6, k))
    raw = quant.get(name).quantize(values).reshape(16, -1)
    x = rng.normal(0, 1, (4, k)).astype(np.float32)
    x[1, ::5] = 0.0
    record = kernel_record(name)
    out = np.empty((4, 16), np.float32)
    record.tiles.matvec(raw, out, x)
    expected = np.array([[record.vec_dot(raw[r], x[t]) for r in range(16)] for t in range(4)], np.float32)
    # A NaN's sign is not part of the contract: which of two NaN operands an FMA passes on depends on the
    # operand order LLVM picks for it, which differed between a fresh compile and Numba's cached code.
    assert np.isnan(out).any()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_array_equal(bits(out[finite]), bits(expected[finite]))


@pytest.mark.parametrize("name", TYPES)
def test_matmul_rows_takes_the_grid_from_min_rows_where_available(name, monkeypatch):
    calls = []
    kernel = kernel_record(name).tiles.matvec
    spy = TileKernel(lambda *args: calls.append(args[1].shape[0]) or kernel(*args), MIN_ROWS)
    record = dataclasses.replace(kernel_record(name), tiles=spy, matrix=None)  # BF16 on AMX: test_amx.py
    cpu_matmul = sys.modules["localllm.backends.cpu.matmul"]
    monkeypatch.setattr(cpu_matmul, "kernel_record", lambda qt: record if qt.name == name else kernel_record(qt))
    rng = np.random.default_rng(2)
    raw = _rows(name, rng, 21, 64)
    x = rng.normal(0, 1, (MIN_ROWS, 64)).astype(np.float32)
    out = np.empty((MIN_ROWS, 21), np.float32)
    matmul_rows(quant.get(name), raw, x, out, MatmulScratch())
    expected = np.array([[record.vec_dot(raw[r], x[t]) for r in range(21)] for t in range(MIN_ROWS)], np.float32)
    np.testing.assert_array_equal(bits(out), bits(expected))
    assert calls == ([MIN_ROWS] if tiles_available() else [])
