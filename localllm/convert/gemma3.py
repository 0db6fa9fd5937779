"""Gemma 3 (text model of Gemma3ForCausalLM / Gemma3ForConditionalGeneration) -> GGUF `gemma3`.

Facts from llama.cpp's Gemma3Model converter (conversion/gemma.py), and what the engine then assumes:
- Norm weights: Gemma3RMSNorm computes x_normed * (1 + w). The converter writes w + 1 for every tensor
  whose name ends in "norm.weight" (attn_norm, post_attention_norm, ffn_norm, post_ffw_norm,
  attn_q_norm, attn_k_norm, output_norm), so GGUF norm weights are used as stored.
- Layer norms: input_layernorm -> attn_norm, post_attention_layernorm -> post_attention_norm,
  pre_feedforward_layernorm -> ffn_norm, post_feedforward_layernorm -> post_ffw_norm.
- Q/K are not permuted (NeoX RoPE pairing = HF rotate_half).
- Embeddings are multiplied by sqrt(hidden_size) at run time (not folded into the weights); the output
  projection is tied to token_embd; token_embd rows beyond the tokenizer's vocabulary are dropped.
- Keys: defaults when config.json omits them: context 131072, heads 8, KV heads 4, head_dim 256
  (key_length/value_length), eps 1e-6, `rope.freq_base` = the global layers' rope_theta (1e6).
  `gemma3.attention.sliding_window` is written; RoPE linear scaling (4B+) as scaling type + factor.
- Not written, hard-wired in llama.cpp and in our engine: sliding-window pattern 5 local : 1 global,
  local RoPE base 10000, query scale 1/sqrt(head_dim) (n_embd/n_head for the 62-layer 27B). A config
  that differs is refused here rather than converted into a model that would compute something else.
"""

from __future__ import annotations

import numpy as np

from .errors import ConversionError
from .family import LAYER_NAMES, U32, F32, Family

GLOBAL_EVERY = 6
LOCAL_ROPE_BASE = 10000.0


class Gemma3Family(Family):
    ARCH = "gemma3"
    HF_ARCHITECTURES = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
    ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")
    TIED_DEFAULT = True
    LAYER_NAMES = {
        **LAYER_NAMES,
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight": "ffn_norm.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    }

    @property
    def n_head(self) -> int:
        return int(self.get("num_attention_heads", 8))

    @property
    def n_head_kv(self) -> int:
        return int(self.get("num_key_value_heads", 4))

    @property
    def head_dim(self) -> int:
        return int(self.get("head_dim", 256))

    def check(self) -> None:
        super().check()
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if self.config.get(key):
                raise ConversionError(f"config.json: {key} is set; Gemma 3 as the engine runs it has none")
        self._check_layer_pattern()
        local_base = self.config.get("rope_local_base_freq")
        sliding = (self.config.get("rope_parameters") or {}).get("sliding_attention") or {}
        local_base = local_base if local_base is not None else sliding.get("rope_theta", LOCAL_ROPE_BASE)
        if float(local_base) != LOCAL_ROPE_BASE:
            raise ConversionError(f"config.json: local RoPE base {local_base} differs from the {LOCAL_ROPE_BASE:g} the engine uses")
        n_layer, n_embd = int(self.need("num_hidden_layers")), int(self.need("hidden_size"))
        expected = n_embd / self.n_head if n_layer == 62 else self.head_dim
        scalar = self.config.get("query_pre_attn_scalar")
        if scalar is not None and float(scalar) != float(expected):
            raise ConversionError(f"config.json: query_pre_attn_scalar {scalar} differs from the {expected:g} the engine uses")

    def _check_layer_pattern(self) -> None:
        n_layer = int(self.need("num_hidden_layers"))
        types = self.config.get("layer_types")
        if types is not None:
            expected = ["full_attention" if (il + 1) % GLOBAL_EVERY == 0 else "sliding_attention" for il in range(n_layer)]
            if list(types) != expected:
                raise ConversionError("config.json: layer_types is not the 5 sliding : 1 global pattern the engine uses")
        elif self.config.get("sliding_window_pattern", GLOBAL_EVERY) != GLOBAL_EVERY:
            raise ConversionError(f"config.json: sliding_window_pattern {self.config['sliding_window_pattern']} differs from the {GLOBAL_EVERY} the engine uses")

    def metadata(self):
        a = self.ARCH
        common = {key: (value, vtype) for key, value, vtype in super().metadata()}
        common.update({
            f"{a}.context_length": (int(self.get("max_position_embeddings", 131072)), U32),
            f"{a}.attention.head_count": (self.n_head, U32),
            f"{a}.attention.head_count_kv": (self.n_head_kv, U32),
            f"{a}.attention.layer_norm_rms_epsilon": (float(self.get("rms_norm_eps", 1e-6)), F32),
            f"{a}.attention.key_length": (self.head_dim, U32),
            f"{a}.attention.value_length": (self.head_dim, U32),
            f"{a}.rope.freq_base": (self.rope_theta(1_000_000.0), F32),
            f"{a}.attention.sliding_window": (int(self.need("sliding_window")), U32),
        })
        return [(key, value, vtype) for key, (value, vtype) in common.items()]

    def need(self, key: str):
        if key == "rms_norm_eps" and self.config.get(key) is None:
            return 1e-6
        if key == "max_position_embeddings" and self.config.get(key) is None:
            return 131072
        return super().need(key)

    def transform(self, gguf_name: str, data: np.ndarray) -> np.ndarray:
        if gguf_name.endswith("norm.weight"):
            return data + np.float32(1.0)
        return data

    def vocab_size(self, n_tokenizer: int, config_vocab_size) -> int:
        return n_tokenizer  # the tokenizer's own size; token_embd is cut to it (vocab_rows)

    def vocab_rows(self, n_tokens: int, n_rows: int) -> int:
        return min(n_tokens, n_rows)


FAMILIES = (Gemma3Family,)
