"""Qwen2 / Qwen2.5 -> GGUF `qwen2`, Qwen3 (dense) -> GGUF `qwen3`.

Conventions (llama.cpp's Qwen2Model / Qwen3Model converters): no Q/K permutation (the engine uses NeoX
RoPE pairing, which is HF's rotate_half); norm weights as stored; Qwen2 keeps its q/k/v biases
(`attn_q.bias` …); Qwen3 has per-head q_norm/k_norm (`attn_q_norm.weight`, `attn_k_norm.weight`) and
an explicit head_dim, written as `qwen3.attention.key_length`/`value_length`.
"""

from __future__ import annotations

from .family import Family


class Qwen2Family(Family):
    ARCH = "qwen2"
    HF_ARCHITECTURES = ("Qwen2ForCausalLM",)
    PREFERS_SPM = False

    def allows_bias(self, flag: str) -> bool:
        return flag == "attention_bias"  # Qwen2 always has q/k/v biases


class Qwen3Family(Family):
    ARCH = "qwen3"
    HF_ARCHITECTURES = ("Qwen3ForCausalLM",)
    PREFERS_SPM = False


FAMILIES = (Qwen2Family, Qwen3Family)
