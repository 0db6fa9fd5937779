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
