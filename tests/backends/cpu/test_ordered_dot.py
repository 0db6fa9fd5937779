"""backends/cpu/quant_kernels/lanes.dot_f32_f16_lanes sums in the order its docstring states, bit for bit.

The decode attention's q.k products go through it so that every compilation of the attention kernels
gives the same bits (scripts/check_cold_warm.py). The expected values are a NumPy float32 emulation of
the stated order: DOT_LANES running sums (each a product rounded to float32, then a sum), added up by
halves, then the tail elements in order."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from localllm.backends.cpu import attention_decode
from localllm.backends.cpu.quant_kernels.lanes import DOT_LANES, axpy4_f16_lanes, axpy_f16_lanes, dot4_f32_f16_lanes, dot_f32_f16_lanes


@numba.njit(cache=False)
def _lanes_dot(a, bits):
    return dot_f32_f16_lanes(a, bits, a.shape[0] - a.shape[0] % DOT_LANES)


@numba.njit(cache=False)
def _lanes_dot4(a, bits):
    n_full = a.shape[1] - a.shape[1] % DOT_LANES
    return dot4_f32_f16_lanes(a[0], a[1], a[2], a[3], bits, n_full)


@numba.njit(cache=False)
def _lanes_axpy(w, bits, y):
    axpy_f16_lanes(w[0], bits, y.shape[1] - y.shape[1] % DOT_LANES, y[0])


@numba.njit(cache=False)
def _lanes_axpy4(w, bits, y):
    axpy4_f16_lanes(w[0], w[1], w[2], w[3], bits, y.shape[1] - y.shape[1] % DOT_LANES, y[0], y[1], y[2], y[3])


def _emulated(a, b16, n_full):
    b = b16.astype(np.float32)
    sums = np.zeros(DOT_LANES, np.float32)
    for start in range(0, n_full, DOT_LANES):
        sums = sums + a[start:start + DOT_LANES] * b[start:start + DOT_LANES]  # float32 product, then sum
    width = DOT_LANES
    while width > 1:
        width //= 2
        sums = sums[:width] + sums[width:2 * width]
    return sums[0]


def _operands(n, seed):
    rng = np.random.default_rng(seed)
    # magnitudes over several decades, so that a different summation order gives different bits
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(np.float32)
    b16 = (rng.standard_normal(n) * 10.0 ** rng.integers(-2, 3, n)).astype(np.float16)
    return a, b16


@pytest.mark.parametrize("n", [16, 64, 256, 272])
def test_lanes_dot_sums_in_the_stated_order(n):
    for seed in range(20):
        a, b16 = _operands(n, seed)
        n_full = n - n % DOT_LANES
        got = _lanes_dot(a, b16.view(np.uint16))
        assert np.float32(got).view(np.uint32) == _emulated(a, b16, n_full).view(np.uint32)


def test_the_order_is_visible_in_the_bits():
    """Negative control: a plain left-to-right float32 sum of the same products differs in some cases,
    so the test above does check the order and not only the value."""
    differ = 0
    for seed in range(20):
        a, b16 = _operands(256, seed)
        products = a * b16.astype(np.float32)
        sequential = np.float32(0.0)
        for p in products:
            sequential = np.float32(sequential + p)
        differ += np.float32(_lanes_dot(a, b16.view(np.uint16))) != sequential
    assert differ > 0


def test_head_dot_adds_the_tail_in_order():
    a, b16 = _operands(70, 3)  # 64 through the lanes, 6 after
    expected = _emulated(a, b16, 64)
    for x, y in zip(a[64:], b16[64:].astype(np.float32)):
        expected = np.float32(expected + np.float32(x * y))
    assert np.float32(attention_decode._dot_f16(a, b16.view(np.uint16))) == expected


def test_lanes_dot_refuses_strided_operands():
    a, b16 = _operands(64, 0)
    with pytest.raises(numba.core.errors.TypingError):
        _lanes_dot(a[::2], b16.view(np.uint16)[::2])


@pytest.mark.parametrize("n", [16, 128, 272])
def test_four_row_dot_gives_each_row_the_one_row_bits(n):
    for seed in range(10):
        rows = np.stack([_operands(n, 100 * seed + r)[0] for r in range(4)])
        _, b16 = _operands(n, seed)
        n_full = n - n % DOT_LANES
        got = _lanes_dot4(rows, b16.view(np.uint16))
        for r in range(4):
            assert np.float32(got[r]).view(np.uint32) == _emulated(rows[r], b16, n_full).view(np.uint32)


@pytest.mark.parametrize("n", [16, 128, 272])
def test_lane_axpys_are_a_rounded_product_then_a_sum_per_element(n):
    """Expected: NumPy float32 y + (w * x), elementwise; the elements past the last full DOT_LANES
    are left alone (the kernels' scalar tail does them)."""
    n_full = n - n % DOT_LANES
    for seed in range(10):
        rng = np.random.default_rng(seed)
        _, b16 = _operands(n, seed)
        y = (rng.standard_normal((4, n)) * 10.0 ** rng.integers(-3, 4, (4, n))).astype(np.float32)
        w = (rng.standard_normal(4) * 10.0 ** rng.integers(-3, 3, 4)).astype(np.float32)
        x = b16.astype(np.float32)
        want = y.copy()
        want[:, :n_full] = y[:, :n_full] + w[:, None] * x[None, :n_full]  # float32 product, then float32 sum
        one = y.copy()
        _lanes_axpy(w, b16.view(np.uint16), one)
        np.testing.assert_array_equal(one[0].view(np.uint32), want[0].view(np.uint32))
        np.testing.assert_array_equal(one[1:].view(np.uint32), y[1:].view(np.uint32))
        four = y.copy()
        _lanes_axpy4(w, b16.view(np.uint16), four)
        np.testing.assert_array_equal(four.view(np.uint32), want.view(np.uint32))
