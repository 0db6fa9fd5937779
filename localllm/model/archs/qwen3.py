"""Qwen3 (dense): `general.architecture = qwen3`.

GGUF storage conventions relied on: RoPE NeoX pairing; per-head RMS norm of Q and K before RoPE
(`attn_q_norm.weight`, `attn_k_norm.weight`, head_dim floats); no QKV bias; head_dim from
`qwen3.attention.key_length` (it is not n_embd / n_head); SiLU gate; output.weight may be absent (tied).
"""

from __future__ import annotations

from ..decoder import Decoder


class Qwen3(Decoder):
    ROPE_NEOX = True
    ACTIVATION = "silu"
    QK_NORM = True
