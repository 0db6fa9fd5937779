"""The CPU backend's gated activations against float64 NumPy."""

from __future__ import annotations

import numpy as np

from localllm.backends.cpu import kernels


def test_swiglu_is_silu_times_up_to_float32_rounding_and_finite_at_the_extremes():
    rng = np.random.default_rng(0)
    gate = np.concatenate([(rng.standard_normal((3, 14336)) * 6), np.full((1, 14336), 0.0)]).astype(np.float32)
    gate[3, :12] = [-1e4, -200, -90, -87.5, -30, -1e-30, 1e-30, 30, 87.5, 90, 200, 1e4]
    up = rng.standard_normal(gate.shape).astype(np.float32)
    out = np.empty_like(gate)
    kernels.gated_act(gate, up, out, False, kernels.gelu_table())
    g = gate.astype(np.float64)
    with np.errstate(over="ignore"):
        want = g / (1.0 + np.exp(-g)) * up
    assert np.isfinite(out).all()
    # a few float32 roundings (exp within 1.2 ulp, a division, two products): relative 1e-6, or an
    # absolute 1e-30 where SiLU itself underflows (gate far below zero)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-30)


def test_in_place_gives_the_out_of_place_bits_for_both_activations():
    """The decoder writes the activation over the gate (out is gate): the in-place row functions must
    compute exactly what the out-of-place ones do."""
    rng = np.random.default_rng(1)
    gate = (rng.standard_normal((5, 4096)) * 8).astype(np.float32)
    gate[0, :6] = [0.0, -9.99, 9.99, -10.0, 10.0, 1e-33]
    up = rng.standard_normal(gate.shape).astype(np.float32)
    table = kernels.gelu_table()
    for gelu in (False, True):
        out = np.empty_like(gate)
        kernels.gated_act(gate, up, out, gelu, table)
        x = gate.copy()
        kernels.gated_act(x, up, x, gelu, table)
        np.testing.assert_array_equal(x.view(np.uint32), out.view(np.uint32))
        assert not np.array_equal(out, gate)  # it did compute something
