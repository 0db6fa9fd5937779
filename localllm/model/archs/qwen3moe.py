"""Qwen3-MoE: `general.architecture = qwen3moe` (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B).

Attention as Qwen3 (archs/qwen3.py): NeoX RoPE, per-head RMS norms of Q and K, no biases, head_dim from
`attention.key_length`. Every feed-forward is routed experts (model/moe.py), as llama.cpp's
src/models/qwen3moe.cpp: softmax over the router's scores (`ffn_gate_inp`), the top `expert_used_count`
renormalised to sum 1, SiLU-gated experts `expert_feed_forward_length` wide (default: feed_forward_length
/ expert_used_count), no shared expert.
"""

from __future__ import annotations

from ..moe import MixtureOfExperts
from .qwen3 import Qwen3


class Qwen3Moe(MixtureOfExperts, Qwen3):
    MOE_NORM_WEIGHTS = True
    MOE_FF_FROM_USED = True
