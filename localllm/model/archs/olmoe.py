"""OLMoE: `general.architecture = olmoe` (OLMoE-1B-7B).

As llama.cpp's src/models/olmoe.cpp: pre-norm blocks; NeoX RoPE; RMS norms of Q and K over whole rows
(`attn_q_norm`/`attn_k_norm` as long as the projections) before RoPE; no biases. Every feed-forward is
routed experts (model/moe.py): softmax over the router's scores, the top `expert_used_count` weighted by
their probabilities as they are (not renormalised), SiLU-gated experts `feed_forward_length` wide.
"""

from __future__ import annotations

from ..decoder import Decoder
from ..moe import MixtureOfExperts


class Olmoe(MixtureOfExperts, Decoder):
    ROPE_NEOX = True
    ACTIVATION = "silu"
    QK_NORM = "rows"
