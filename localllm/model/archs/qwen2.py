"""Qwen2 / Qwen2.5: `general.architecture = qwen2`.

GGUF storage conventions relied on: RoPE NeoX pairing (Q/K not permuted); biases on attn_q/k/v
(`attn_q.bias` …), none elsewhere; RMS-norm weights as stored; SiLU gate; output.weight may be
absent (tied embeddings in the small models).
"""

from __future__ import annotations

from ..decoder import Decoder


class Qwen2(Decoder):
    ROPE_NEOX = True
    ACTIVATION = "silu"
    QKV_BIAS = True
