"""Qwen3.5's mixtures of experts: `general.architecture = qwen35moe` (Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B).

Layers as Qwen3.5 (archs/qwen35.py): gated delta nets, every `full_attention_interval`-th layer a gated
attention. Every feed-forward is routed experts plus a shared expert (model/moe.py), as llama.cpp's
src/models/qwen35moe.cpp: softmax over the router's scores, the top `expert_used_count` renormalised to
sum 1, SiLU-gated experts `expert_feed_forward_length` wide (default: feed_forward_length /
expert_used_count); the shared expert (`ffn_{gate,up,down}_shexp`, `expert_shared_feed_forward_length`
wide, default feed_forward_length) times sigmoid(ffn_gate_inp_shexp . x), added last.
"""

from __future__ import annotations

from ..moe import MixtureOfExperts
from .qwen35 import Qwen35


class Qwen35Moe(MixtureOfExperts, Qwen35):
    MOE_NORM_WEIGHTS = True
    MOE_SHARED = True
    MOE_FF_FROM_USED = True
