"""RoPE scaling: what llama.cpp derives from a file's `<arch>.rope.scaling.*` keys, turned into the
arguments of the backend's rope op for each layer.

llama.cpp (src/llama-context.cpp, ggml's rope_yarn) rotates pair i of a head by
theta_i = position * base^(-2i/n_rot) / ff_i, mixed with its interpolation freq_scale * theta_i by YaRN's
ramp r_i (theta = freq_scale theta_i (1 - r_i) + theta_i r_i; r_i = 0 without YaRN), and multiplies cos and
sin by an attention factor mscale. Here the ramp is folded into per-pair frequency divisors, so the
backend op only needs (base, divisors, freq_scale, mscale):
- linear: freq_scale = 1/factor.
- yarn: the ramp between YaRN's correction dims (beta_fast, beta_slow over the original context) and
  mscale = (1 + 0.1 ln factor) times the file's attention factor (the ratio of two such terms when
  `rope.scaling.yarn_log_multiplier` is set).
- longrope (Phi-3): the divisors are `rope_factors_long` when the context is longer than the original
  one, else `rope_factors_short`; mscale is `rope.scaling.attn_factor`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # llama.cpp's names


@dataclass(frozen=True)
class RopeScaling:
    kind: str  # one of SCALING_TYPES
    factor: float  # rope.scaling.factor (0: not given)
    orig_ctx: int  # rope.scaling.original_context_length (default: the trained context)
    attn_factor: float = 1.0  # rope.scaling.attn_factor
    beta_fast: float = 32.0  # rope.scaling.yarn_beta_fast
    beta_slow: float = 1.0  # rope.scaling.yarn_beta_slow
    log_mul: float = 0.0  # rope.scaling.yarn_log_multiplier (mscale_all_dim)

    @classmethod
    def from_reader(cls, reader, context_length: int) -> "RopeScaling":
        meta, key = reader.metadata, reader.arch_key
        factor = meta.get_float(key("rope.scaling.factor"), 0.0, min=0.0)
        if not factor:  # the older key
            factor = meta.get_float(key("rope.scale_linear"), 0.0, min=0.0)
        return cls(
            kind=meta.get_str(key("rope.scaling.type"), "linear", choices=SCALING_TYPES),
            factor=factor,
            orig_ctx=meta.get_int(key("rope.scaling.original_context_length"), context_length, min=1),
            attn_factor=meta.get_float(key("rope.scaling.attn_factor"), 1.0, above=0.0),
            beta_fast=meta.get_float(key("rope.scaling.yarn_beta_fast"), 32.0),
            beta_slow=meta.get_float(key("rope.scaling.yarn_beta_slow"), 1.0),
            log_mul=meta.get_float(key("rope.scaling.yarn_log_multiplier"), 0.0, min=0.0),
        )

    @property
    def freq_scale(self) -> float:
        """The frequency scale of the model's (global) layers: 1/factor unless the type is none."""
        return 1.0 / self.factor if self.factor and self.kind != "none" else 1.0

    @property
    def yarn(self) -> bool:
        return self.kind == "yarn"

    def base_mscale(self) -> float:
        """llama.cpp's yarn_attn_factor: the attention factor before YaRN's own correction (in rope_yarn)."""
        mscale = 1.0
        if self.yarn:
            factor = 1.0 / self.freq_scale
            if self.log_mul:
                mscale = _yarn_mscale(factor, 1.0) / _yarn_mscale(factor, self.log_mul)
            else:
                mscale = _yarn_mscale(factor, 1.0)
            mscale /= 1.0 + 0.1 * math.log(factor)  # rope_yarn multiplies it back
        return mscale * self.attn_factor


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class LayerRope:
    """The rope op's arguments for one layer."""

    base: float
    freq_scale: float
    divisors: Optional[np.ndarray]  # float32[n_rot/2] frequency divisors, or None
    mscale: float


def layer_rope(scaling: RopeScaling, n_rot: int, base: float, freq_scale: float, divisors: Optional[np.ndarray],
               yarn: Optional[bool] = None) -> LayerRope:
    """The rope op's arguments for a layer rotating at `base` and `freq_scale` with frequency divisors
    `divisors` (rope_freqs, LongRoPE's factors, or None); YaRN's ramp folded into the divisors when the
    file asks for YaRN (`yarn` overrides: some architectures turn it off on their local layers)."""
    mscale = scaling.base_mscale()
    if not (scaling.yarn if yarn is None else yarn):
        return LayerRope(base, freq_scale, divisors, mscale)
    low, high = yarn_corr_dims(n_rot, scaling.orig_ctx, base, scaling.beta_fast, scaling.beta_slow)
    pair = np.arange(n_rot // 2, dtype=np.float64)
    ramp = 1.0 - np.clip((pair - low) / max(0.001, high - low), 0.0, 1.0)  # 1: extrapolated, 0: interpolated
    multiplier = freq_scale * (1.0 - ramp) + ramp
    base_divisors = np.ones(n_rot // 2) if divisors is None else np.asarray(divisors, dtype=np.float64)
    mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    return LayerRope(base, 1.0, (base_divisors / multiplier).astype(np.float32), mscale)


def yarn_corr_dims(n_rot: int, orig_ctx: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """YaRN's correction range of pair indices (ggml_rope_yarn_corr_dims): pairs below the first are
    extrapolated, above the second interpolated."""
    def dim(n_turns: float) -> float:
        return n_rot * math.log(orig_ctx / (n_turns * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(dim(beta_fast))), min(n_rot - 1.0, math.ceil(dim(beta_slow)))
