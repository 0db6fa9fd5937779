"""gpt-oss (OpenAI's open-weight mixtures of experts): `general.architecture = gpt-oss`.

As llama.cpp's src/models/openai-moe.cpp computes it:
- Pre-norm blocks; the feed-forward's norm is `post_attention_norm` (there is no ffn_norm).
- Attention: Q/K/V with biases, `attn_output` with its bias, heads `rope.dimension_count` wide, NeoX
  RoPE (YaRN from `rope.scaling.*` as the file says), scores scaled by 1/sqrt(head size), and one
  attention sink per query head (`attn_sinks`: a logit in the softmax that takes a share of the weights
  and brings no value). Layers alternate: even ones attend through `attention.sliding_window`, odd ones
  over the whole context (`attention.sliding_window_pattern` where the file has one); the local layers'
  RoPE base is `rope.freq_base_swa` when present.
- Every feed-forward is routed experts (model/moe.py) with biases everywhere: the router's
  (`ffn_gate_inp.bias`) and each expert's gate, up and down biases. The top `expert_used_count` of the
  raw scores, weighted by the softmax over those alone; the clamped SwiGLU (`swiglu_oai`: gate clamped
  above at 7, up into [-7, 7], g * sigmoid(1.702 g) * (u + 1)); experts in MXFP4 in the published files.
"""

from __future__ import annotations

from ..decoder import Decoder, sliding_window_layers
from ..moe import MixtureOfExperts
from ..weights import TensorSpec


class GptOss(MixtureOfExperts, Decoder):
    ROPE_NEOX = True
    ACTIVATION = "swiglu_oai"
    FFN_NORM = "post_attention_norm"
    MOE_GATING = "softmax_weight"

    def read_extra(self, reader) -> None:
        super().read_extra(reader)
        meta, key, hp = reader.metadata, reader.arch_key, self.hp
        self.sliding_window = meta.get_int(key("attention.sliding_window"), min=1)
        self.local = sliding_window_layers(reader, hp.n_layer, 2)
        self.local_rope_base = meta.get_float(key("rope.freq_base_swa"), hp.rope_base, above=0.0)

    def layer_window(self, il: int) -> int:
        return self.sliding_window if self.local[il] else 0

    def layer_rope(self, il: int) -> tuple[float, float]:
        return (self.local_rope_base if self.local[il] else self.hp.rope_base), self.hp.rope_freq_scale

    def block_specs(self, il: int) -> list[TensorSpec]:
        hp, p = self.hp, f"blk.{il}."
        specs = [s for s in super().block_specs(il) if s.name != p + "attn_output.bias"]
        return specs + [
            TensorSpec(p + "attn_output.bias", (hp.n_embd,), vector=True),  # required here
            TensorSpec(p + "attn_sinks.weight", (hp.n_head,), vector=True),
        ]
