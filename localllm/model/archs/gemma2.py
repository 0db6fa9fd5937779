"""Gemma 2: `general.architecture = gemma2`.

GGUF storage conventions relied on (llama.cpp's converter and src/models/gemma2.cpp):
- RMS-norm weights already include Gemma's +1 offset (the converter adds 1): used as stored.
- Four norms per block: attn_norm, post_attention_norm, ffn_norm, post_ffw_norm; no Q/K norms.
- RoPE NeoX pairing, base `rope.freq_base` on every layer (`rope.freq_base_swa` for the local layers when
  present). Sliding window `attention.sliding_window` (4096 when absent) on every other layer: layer il
  is local when il is even, unless `attention.sliding_window_pattern` says otherwise.
- Soft-capping: attention scores become cap * tanh(score / cap) with `attn_logit_softcapping` (50 when
  absent), the logits likewise with `final_logit_softcapping` (30 when absent), as llama.cpp always does.
- Embeddings are scaled by sqrt(n_embd); the output projection is token_embd (an output.weight is
  ignored, as llama.cpp ignores it). Feed-forward: GELU (tanh approximation) gate. Queries scaled by
  1/sqrt(head_dim) (1/sqrt(n_embd/n_head) for the 27B model, 46 layers).
"""

from __future__ import annotations

import math

import numpy as np

from ..decoder import Buffers, Decoder, sliding_window_layers
from ..kv_cache import KVCache
from ..weights import TensorSpec

DEFAULT_WINDOW = 4096
WINDOW_PERIOD = 2
ATTN_SOFTCAP, FINAL_SOFTCAP = 50.0, 30.0
LAYERS_27B = 46


class Gemma2(Decoder):
    ROPE_NEOX = True
    ACTIVATION = "gelu_tanh"
    WINDOW_PERIOD = WINDOW_PERIOD
    LAYERS_27B = LAYERS_27B

    def read_extra(self, reader) -> None:
        meta, key = reader.metadata, reader.arch_key
        self.sliding_window = meta.get_int(key("attention.sliding_window"), DEFAULT_WINDOW, min=0)
        self.local = sliding_window_layers(reader, self.hp.n_layer, self.WINDOW_PERIOD)
        self.local_rope_base = meta.get_float(key("rope.freq_base_swa"), self.default_local_rope_base(), above=0.0)
        self.attn_softcap = meta.get_float(key("attn_logit_softcapping"), self.DEFAULT_ATTN_SOFTCAP, min=0.0)
        self.final_softcap = meta.get_float(key("final_logit_softcapping"), self.DEFAULT_FINAL_SOFTCAP, min=0.0)

    DEFAULT_ATTN_SOFTCAP, DEFAULT_FINAL_SOFTCAP = ATTN_SOFTCAP, FINAL_SOFTCAP

    def default_local_rope_base(self) -> float:
        return self.hp.rope_base

    def layer_window(self, il: int) -> int:
        return self.sliding_window if self.local[il] else 0

    def layer_rope(self, il: int) -> tuple[float, float]:
        if self.local[il]:
            return self.local_rope_base, self.local_rope_scale()
        return self.hp.rope_base, self.hp.rope_freq_scale

    def local_rope_scale(self) -> float:
        return self.hp.rope_freq_scale

    def attention_scale(self) -> float:
        if self.hp.n_layer == self.LAYERS_27B:  # query_pre_attn_scalar = n_embd / n_head
            return 1.0 / math.sqrt(self.hp.n_embd / self.hp.n_head)
        return 1.0 / math.sqrt(self.hp.head_dim)

    def attention_softcap(self) -> float:
        return self.attn_softcap

    def finish_logits(self, logits) -> None:
        if self.final_softcap:
            self.ops.softcap(logits, self.final_softcap, logits)

    def ties_output(self) -> bool:
        return True  # token_embd is the output projection even when a file carries output.weight

    def tensor_specs(self) -> list[TensorSpec]:
        return [s for s in super().tensor_specs() if s.name != "output.weight"]

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
