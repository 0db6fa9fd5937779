"""Llama (Llama 2, Llama 3/3.1/3.2, Mistral, TinyLlama) -> GGUF `llama`.

Conventions (llama.cpp's LlamaModel converter):
- Q and K projections (weights and biases) are permuted per head so that the engine's adjacent-pair
  RoPE equals HF's rotate_half RoPE (`permute_for_normal_rope`; K with the KV head count).
- Norm weights are written as stored (LlamaRMSNorm multiplies by w).
- `llama.vocab_size` and `llama.rope.dimension_count` (head_dim, else hidden_size / heads) are written.
- rope_type "llama3" (Llama 3.1+): no scaling keys; a `rope_freqs.weight` tensor of head_dim/2 factors
  that divide the RoPE frequencies, computed as llama.cpp does (wavelength bands of the original
  context, `factor`, `low_freq_factor`, `high_freq_factor`). rope_type "linear": scaling type + factor.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from .family import U32, Family, permute_for_normal_rope


class LlamaFamily(Family):
    ARCH = "llama"
    HF_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
    ROPE_TYPES = ("default", "linear", "llama3")

    def metadata(self):
        out = super().metadata()
        out += [(f"{self.ARCH}.vocab_size", int(self.need("vocab_size")), U32),
                (f"{self.ARCH}.rope.dimension_count", self.head_dim, U32)]
        return out

    def transform(self, gguf_name: str, data: np.ndarray) -> np.ndarray:
        if gguf_name.endswith(("attn_q.weight", "attn_q.bias")):
            return permute_for_normal_rope(data, self.n_head)
        if gguf_name.endswith(("attn_k.weight", "attn_k.bias")):
            return permute_for_normal_rope(data, self.n_head_kv)
        return data

    def extra_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        if self.rope_type() == "llama3":
            yield "rope_freqs.weight", llama3_rope_factors(self.rope_params(), self.rope_theta(), self.head_dim, self.config)


def llama3_rope_factors(params: dict, base: float, dim: int, config: dict) -> np.ndarray:
    """Per-frequency divisors [dim/2] for Llama 3.1 RoPE scaling: 1 for short wavelengths, `factor` for
    long ones, a smooth blend between (wavelength bands relative to the original context)."""
    factor = float(params.get("factor", 8.0))
    low = float(params.get("low_freq_factor", 1.0))
    high = float(params.get("high_freq_factor", 4.0))
    old_ctx = float(params.get("original_max_position_embeddings") or config.get("original_max_position_embeddings") or 8192)
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / float(freq)
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


FAMILIES = (LlamaFamily,)
