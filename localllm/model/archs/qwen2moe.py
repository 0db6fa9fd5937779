"""Qwen2-MoE: `general.architecture = qwen2moe` (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B).

Attention as Qwen2 (archs/qwen2.py): NeoX RoPE, Q/K/V biases. Every feed-forward is routed experts plus
a shared expert (model/moe.py), as llama.cpp's src/models/qwen2moe.cpp: softmax over the router's scores,
the top `expert_used_count` weighted by their probabilities as they are (not renormalised), experts
`expert_feed_forward_length` wide (default: feed_forward_length / expert_used_count); then the shared
expert (`ffn_{gate,up,down}_shexp`, `expert_shared_feed_forward_length` wide, default
feed_forward_length) times sigmoid(ffn_gate_inp_shexp . x), added last.
"""

from __future__ import annotations

from ..moe import MixtureOfExperts
from .qwen2 import Qwen2


class Qwen2Moe(MixtureOfExperts, Qwen2):
    MOE_SHARED = True
    MOE_FF_FROM_USED = True
