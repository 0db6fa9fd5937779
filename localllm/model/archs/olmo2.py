"""OLMo 2: `general.architecture = olmo2`.

GGUF storage conventions relied on (llama.cpp's converter and src/models/olmo2.cpp):
- No norm before attention or feed-forward: each sub-block's output is RMS-normed instead
  (`post_attention_norm`, `post_ffw_norm`), then added to the residual stream.
- Q and K are RMS-normed over the whole projection, before being split into heads: `attn_q_norm` holds
  n_head * head_dim floats and `attn_k_norm` n_head_kv * head_dim.
- RoPE NeoX pairing; SiLU gate; a separate output.weight. (OLMo 3 files carry
  `olmo2.attention.sliding_window`: three sliding-window layers, then one global; local layers keep the
  base frequency unscaled.)
"""

from __future__ import annotations

from ..decoder import Buffers, Decoder
from ..kv_cache import KVCache
from ..weights import TensorSpec

GLOBAL_EVERY = 4  # with a sliding window: layer il is global when (il + 1) % 4 == 0


class Olmo2(Decoder):
    ROPE_NEOX = True
    ACTIVATION = "silu"
    QK_NORM = True

    def read_extra(self, reader) -> None:
        self.sliding_window = reader.metadata.get_int(reader.arch_key("attention.sliding_window"), 0, min=0)

    def _is_local(self, il: int) -> bool:
        return self.sliding_window > 0 and (il + 1) % GLOBAL_EVERY != 0

    def layer_window(self, il: int) -> int:
        return self.sliding_window if self._is_local(il) else 0

    def layer_rope(self, il: int) -> tuple[float, float]:
        return self.hp.rope_base, 1.0 if self._is_local(il) else self.hp.rope_freq_scale

    def block_specs(self, il: int) -> list[TensorSpec]:
        hp, p = self.hp, f"blk.{il}."
        q_out, kv_out = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        # the llama block's matrices, without its norms (its pre-norms, per-head Q/K norms)
        matrices = [s for s in super().block_specs(il) if not s.name.endswith("_norm.weight")]
        return matrices + [
            TensorSpec(p + "attn_q_norm.weight", (q_out,), vector=True),
            TensorSpec(p + "attn_k_norm.weight", (kv_out,), vector=True),
            TensorSpec(p + "post_attention_norm.weight", (hp.n_embd,), vector=True),
            TensorSpec(p + "post_ffw_norm.weight", (hp.n_embd,), vector=True),
        ]

    def block(self, il: int, b: Buffers, start: int, cache: KVCache) -> None:
        """x += post_norm(attn(x)); x += post_ffw_norm(ffn(x))."""
        ops, w, eps, p = self.ops, self.w, self.hp.eps, f"blk.{il}."
        self.attention(il, b, start, cache, b.x)
        ops.rms_norm(b.o, w[p + "post_attention_norm.weight"], eps, b.o)
        ops.add(b.x, b.o, b.x)
        self.feed_forward(il, b, b.x)
        ops.rms_norm(b.o, w[p + "post_ffw_norm.weight"], eps, b.o)
        ops.add(b.x, b.o, b.x)
