"""Gemma 3 (text): `general.architecture = gemma3`.

GGUF storage conventions relied on (llama.cpp's converter):
- RMS-norm weights already include Gemma's +1 offset (the converter adds 1): used as stored.
- Four norms per block: attn_norm, post_attention_norm, ffn_norm, post_ffw_norm; per-head Q/K norms.
- RoPE NeoX pairing. Sliding-window pattern 5 local : 1 global (layer il is global when (il+1) % 6 == 0).
  Local layers: window `gemma3.attention.sliding_window`, RoPE base 10,000, no frequency scaling.
  Global layers: full context, RoPE base `gemma3.rope.freq_base`, linear scaling `rope.scaling.factor`.
- Embeddings are scaled by sqrt(n_embd); the output projection is tied to token_embd.
- Feed-forward: GELU (tanh approximation) gate. Queries scaled by 1/sqrt(head_dim)
  (1/sqrt(n_embd/n_head) for the 27B model, whose query_pre_attn_scalar differs).
"""

from __future__ import annotations

import math

import numpy as np

from ..decoder import Buffers, Decoder, KVCache
from ..weights import TensorSpec

LOCAL_ROPE_BASE = 10000.0
GLOBAL_EVERY = 6


class Gemma3(Decoder):
    ROPE_NEOX = True
    ACTIVATION = "gelu_tanh"
    QK_NORM = True

    def read_extra(self, reader) -> None:
        self.sliding_window = reader.metadata.get_int(reader.arch_key("attention.sliding_window"), 0, min=0)

    def is_global(self, il: int) -> bool:
        return (il + 1) % GLOBAL_EVERY == 0

    def layer_window(self, il: int) -> int:
        return 0 if self.is_global(il) else self.sliding_window

    def layer_rope(self, il: int) -> tuple[float, float]:
        if self.is_global(il):
            return self.hp.rope_base, self.hp.rope_freq_scale
        return LOCAL_ROPE_BASE, 1.0

    def attention_scale(self) -> float:
        if self.hp.n_layer == 62:  # Gemma 3 27B: query_pre_attn_scalar = n_embd / n_head
            return 1.0 / math.sqrt(self.hp.n_embd / self.hp.n_head)
        return 1.0 / math.sqrt(self.hp.head_dim)

    def block_specs(self, il: int) -> list[TensorSpec]:
        p, e = f"blk.{il}.", self.hp.n_embd
        return super().block_specs(il) + [
            TensorSpec(p + "post_attention_norm.weight", (e,), vector=True),
            TensorSpec(p + "post_ffw_norm.weight", (e,), vector=True),
        ]

    def embed(self, tokens: np.ndarray, b: Buffers) -> None:
        super().embed(tokens, b)
        self.ops.scale(b.x, math.sqrt(self.hp.n_embd), b.x)

    def block(self, il: int, b: Buffers, start: int, cache: KVCache) -> None:
        """x += post_norm(attn(norm(x))); x += post_ffw_norm(ffn(norm(x)))."""
        ops, w, eps, p = self.ops, self.w, self.hp.eps, f"blk.{il}."
        ops.rms_norm(b.x, w[p + "attn_norm.weight"], eps, b.h)
        self.attention(il, b, start, cache)
        ops.rms_norm(b.o, w[p + "post_attention_norm.weight"], eps, b.o)
        ops.add(b.x, b.o, b.x)
        ops.rms_norm(b.x, w[p + "ffn_norm.weight"], eps, b.h)
        self.feed_forward(il, b)
        ops.rms_norm(b.o, w[p + "post_ffw_norm.weight"], eps, b.o)
        ops.add(b.x, b.o, b.x)
