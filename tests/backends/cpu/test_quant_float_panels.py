"""The float weight types' kernels (backends/cpu/quant_kernels/float_panels.py: F32, F16, BF16): vec_dot
in its documented order (one chain of fused multiply-adds), checked against an emulation of that order
in NumPy (each fused multiply-add done in float64, where the product of two float32 values is exact, then
rounded to float32); the panels' layout against a NumPy statement of it; the matrix kernel against
vec_dot bit for bit at every batch size (each step of the grid, the last rows of a batch, the decode's
panels a part of the matrix apart), from the panels and from the file's rows, on one thread and two;
special values; the error bound of a chain against float64; and the CPU backend's use of the kernel for
every product of these types' matrices, in both tiers, with and without re-laid panels (BF16 where the
CPU has no AMX: test_amx.py checks it there)."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from quant_rows import bits, isa_paths

from localllm import quant
from localllm.backends.base import Weight
from localllm.backends.cpu import CPUBackend
from localllm.backends.cpu.matmul import BLAS_MIN_ROWS, MatmulScratch, TiledWeights, matmul, matmul_rows, matrix_kernel
from localllm.backends.cpu.quant_kernels import amx, float_panels, float_panels_ir, kernel_record, vector

TYPES = ("F32", "F16", "BF16")
KIND = {"F32": float_panels.F32, "F16": float_panels.F16, "BF16": float_panels.BF16}


def _fma32(a, b, c):
    """float32 fma: a * b is exact in float64; the sum rounded once more to float32 (a double rounding
    that differs from one rounding only when the float64 sum lands on a float32 midpoint: not for these
    random inputs)."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


def _emulated_chain(w: np.ndarray, x: np.ndarray) -> np.float32:
    """The documented order: acc = fma(w[k], x[k], acc) for k = 0, 1, ..., from +0."""
    acc = np.float32(0.0)
    for k in range(w.shape[0]):
        acc = _fma32(w[k], x[k], acc)
    return acc


def _rows(name, rng, n_rows, k, scale=1.0):
    return quant.get(name).quantize(rng.normal(0, scale, (n_rows, k)).astype(np.float32)).reshape(n_rows, -1)


def _values(name, raw):
    return np.stack([quant.get(name).dequantize(row).reshape(-1) for row in raw]).astype(np.float32)


def _vec_dots(name, raw, x):
    vec_dot = kernel_record(name).vec_dot
    return np.array([[vec_dot(raw[r], x[t]) for r in range(raw.shape[0])] for t in range(x.shape[0])], np.float32)


def _panels(name, raw, x, packed: bool):
    kernel = kernel_record(name).matrix
    out = np.full((x.shape[0], raw.shape[0]), np.nan, dtype=np.float32)
    if packed:
        kernel.matmul(raw, x, out, numba.get_num_threads(), kernel.pack(raw))
    else:
        kernel.matmul(raw, x, out, numba.get_num_threads())
    return out


@pytest.fixture
def no_amx(monkeypatch):
    """BF16 through the panels even on a CPU with AMX (its own order there: test_amx.py)."""
    monkeypatch.setattr(amx, "suits", lambda weights: False)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("k", [5, 16, 640, 647])
def test_vec_dot_follows_the_documented_order(name, k):
    rng = np.random.default_rng(k)
    raw = _rows(name, rng, 4, k)
    values = _values(name, raw)
    x = rng.normal(0, 1, (4, k)).astype(np.float32)
    for r in range(4):
        got = kernel_record(name).vec_dot(raw[r], x[r])
        np.testing.assert_array_equal(bits(np.float32(got)), bits(_emulated_chain(values[r], x[r])), err_msg=f"{name} K={k} row {r}")


@pytest.mark.parametrize("name", TYPES)
def test_pack_lays_each_panel_k_major(name):
    rng = np.random.default_rng(7)
    raw = _rows(name, rng, 37, 24)  # two panels; the last 5 rows stay out
    size = raw.shape[1] // 24
    packed = float_panels.pack(raw, KIND[name])
    assert packed.shape == (2, 24 * 16 * size)
    for p in range(2):
        for k in range(24):
            want = raw[16 * p : 16 * p + 16, k * size : (k + 1) * size].reshape(-1)
            np.testing.assert_array_equal(packed[p, k * 16 * size : (k + 1) * 16 * size], want)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n_rows", [5, 37, 147, 160])
def test_every_batch_size_layout_and_thread_count_gives_vec_dots_bits(name, n_rows, no_amx):
    # 5 rows: no panel, a chain each; 37: 2 panels alone and 5 chains; 147: 9 panels (decode: 2 steps of
    # 4 panels 2 apart, then 1 alone; prompts: 2 groups of 4, then 1 alone) and 3 chains; 160: 10 panels
    rng = np.random.default_rng(n_rows)
    for k in (16, 647):
        raw = _rows(name, rng, n_rows, k)
        x = rng.normal(0, 2, (13, k)).astype(np.float32)
        want = _vec_dots(name, raw, x)
        for threads in (1, 2):
            with _threads(threads):
                for t in (1, 2, 3, 4, 5, 6, 7, 11, 12, 13):
                    for packed in (True, False):
                        got = _panels(name, raw, x[:t], packed)
                        np.testing.assert_array_equal(bits(got), bits(want[:t]), err_msg=f"{name} N={n_rows} K={k} T={t} packed={packed} threads={threads}")


def _grid_caller(grid):
    """A fresh compile of one grid intrinsic (its code made now, for vector.VECTOR_ISA as it is)."""

    def call(packed, p0, step, x, t0, out):
        grid(packed, p0, step, x, t0, out)

    return numba.njit(call)


@pytest.mark.parametrize("name", TYPES)
def test_every_grid_shape_gives_vec_dots_bits_on_every_isa(name):
    # On targets without AVX-512 a grid's panels go through K in groups that fit 16 registers
    # (panels_per_loop); each output is still its one chain. 9 panels, every grid shape from panel 1,
    # panels 2 apart; K with a tail past a multiple of 16.
    rng = np.random.default_rng(29)
    k = 37
    raw = _rows(name, rng, 9 * 16, k)
    x = rng.normal(0, 2, (8, k)).astype(np.float32)
    want = _vec_dots(name, raw, x)
    packed = float_panels.pack(raw, KIND[name])
    kind = float_panels_ir.KINDS[KIND[name]]
    saved = vector.VECTOR_ISA
    try:
        for isa in isa_paths():
            vector.VECTOR_ISA = isa
            for n_p, n_t in float_panels_ir.SHAPES:
                call = _grid_caller(float_panels_ir.GRIDS[kind, n_p, n_t])
                out = np.full_like(want, np.nan)
                call(packed, 1, 2, x, 1, out)
                for i in range(n_p):
                    columns = slice(16 * (1 + 2 * i), 16 * (2 + 2 * i))
                    np.testing.assert_array_equal(bits(out[1 : 1 + n_t, columns]), bits(want[1 : 1 + n_t, columns]),
                                                  err_msg=f"{name} {isa} {n_p}x{n_t} panel {1 + 2 * i}")
                assert np.isnan(out[0]).all() and np.isnan(out[1 + n_t :]).all()
    finally:
        vector.VECTOR_ISA = saved


def test_grids_split_their_panels_where_the_registers_are_fewer():
    from numba.core.registry import cpu_target

    context = cpu_target.target_context
    saved = vector.VECTOR_ISA
    try:
        vector.VECTOR_ISA = "avx2"  # 16 registers of 8 floats: one panel of 6 rows (12), two of 3 (12)
        assert [float_panels_ir.panels_per_loop(context, 4, t) for t in (6, 5, 4, 3, 2, 1)] == [1, 1, 1, 2, 3, 4]
    finally:
        vector.VECTOR_ISA = saved


class _threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.before = numba.get_num_threads()
        numba.set_num_threads(min(self.n, numba.config.NUMBA_NUM_THREADS))

    def __exit__(self, *exc):
        numba.set_num_threads(self.before)


@pytest.mark.parametrize("name", TYPES)
def test_special_values_take_the_same_path_everywhere(name, no_amx):
    # infinities, NaNs, the smallest normal and subnormal values of each type, and zeros of both signs
    k = 48
    specials = np.array([np.inf, -np.inf, np.nan, 6e-8, -6e-8, 1e-40, 0.0, -0.0, 65504.0, 3e38], np.float32)
    rng = np.random.default_rng(1)
    values = rng.choice(specials, size=(18, k)).astype(np.float32)
    values[::3] = rng.normal(0, 1, (6, k))
    raw = quant.get(name).quantize(values).reshape(18, -1)
    x = rng.normal(0, 1, (7, k)).astype(np.float32)
    x[1, ::5] = 0.0
    want = _vec_dots(name, raw, x)
    assert np.isnan(want).any() and np.isfinite(want).any()
    for packed in (True, False):
        got = _panels(name, raw, x, packed)
        # A NaN's sign is not part of the contract: which of two NaN operands an FMA passes on depends
        # on the operand order LLVM picks for it.
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        finite = ~np.isnan(want)
        np.testing.assert_array_equal(bits(got[finite]), bits(want[finite]))


@pytest.mark.parametrize("name", TYPES)
def test_a_chain_stays_within_its_error_bound(name, no_amx):
    # recursive summation: |error| <= gamma_K * sum |w x|, gamma_K = K u / (1 - K u), u = 2^-24
    rng = np.random.default_rng(11)
    k = 4096
    raw = _rows(name, rng, 32, k, scale=0.05)
    x = rng.normal(0, 1, (3, k)).astype(np.float32)
    w = _values(name, raw).astype(np.float64)
    exact = x.astype(np.float64) @ w.T
    bound = k * 2.0**-24 / (1 - k * 2.0**-24) * (np.abs(x.astype(np.float64)) @ np.abs(w).T)
    got = _panels(name, raw, x, packed=True)
    assert (np.abs(got - exact) <= bound).all()
    assert np.abs(got - exact).max() > 0  # float32 sums: not the float64 products


@pytest.mark.parametrize("name", TYPES)
def test_every_product_of_a_matrix_takes_the_kernel(name, no_amx):
    rng = np.random.default_rng(4)
    raw = _rows(name, rng, 24, 64)
    assert matrix_kernel(quant.get(name), raw) is kernel_record(name).matrix
    x = rng.normal(0, 1, (BLAS_MIN_ROWS + 3, 64)).astype(np.float32)
    want = _vec_dots(name, raw, x)
    for rows in (1, 3, BLAS_MIN_ROWS + 3):  # the last: where types without multi-row kernels take BLAS
        for product in (matmul, matmul_rows):
            out = np.zeros((rows, 24), np.float32)
            product(quant.get(name), raw, x[:rows], out, MatmulScratch())
            np.testing.assert_array_equal(bits(out), bits(want[:rows]), err_msg=f"{product.__name__} rows={rows}")


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("repack", [True, False])
def test_the_backend_computes_the_same_bits_in_both_tiers_and_layouts(name, repack, no_amx):
    rng = np.random.default_rng(5)
    raw = _rows(name, rng, 50, 96)
    x = rng.normal(0, 1, (40, 96)).astype(np.float32)
    want = _vec_dots(name, raw, x)
    backend = CPUBackend(threads=2, repack=repack)
    weight = backend.upload(Weight("w", name, (96, 50), raw))
    for basic in (True, False):
        backend.basic_tier = basic
        for rows in (1, 2, 7, 40):
            out = np.zeros((rows, 50), np.float32)
            backend.matmul(weight, x[:rows], out)
            np.testing.assert_array_equal(bits(out), bits(want[:rows]), err_msg=f"basic={basic} rows={rows}")
    assert isinstance(backend._layout_of(weight), TiledWeights) == repack
