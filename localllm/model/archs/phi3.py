"""Phi-3, Phi-3.5 and Phi-4 (dense): `general.architecture = phi3`.

GGUF storage conventions relied on (llama.cpp's converter, conversion/phi.py, and src/models/phi3.cpp):
- Q, K and V usually come fused: `attn_qkv.weight` holds the Q rows, then K's, then V's (bound here as
  three row ranges of it, no copy); separate attn_q/k/v are accepted too.
- The feed-forward's gate and up come fused in `ffn_up.weight` [n_embd, 2 * n_ff]: the first n_ff rows
  are the gate (SiLU), the next n_ff the up projection.
- RoPE NeoX pairing over `rope.dimension_count` dims (Phi-4-mini rotates 3/4 of each head). The 128k
  models carry LongRoPE factors `rope_factors_long` / `rope_factors_short` and `rope.scaling.attn_factor`
  (see model/rope.py): the long factors serve a context longer than `rope.scaling.original_context_length`.
- `phi3.attention.sliding_window` is ignored, as llama.cpp ignores it (every layer attends to the whole
  context). output.weight may be absent (tied); an output.bias is added when present.
"""

from __future__ import annotations

from ..decoder import Decoder
from ..weights import TensorSpec


class Phi3(Decoder):
    ROPE_NEOX = True
    ACTIVATION = "silu"

    def block_specs(self, il: int) -> list[TensorSpec]:
        hp, p = self.hp, f"blk.{il}."
        fused, shape = p + "ffn_up.weight", (hp.n_embd, 2 * hp.n_ff)
        separate = [s for s in super().block_specs(il) if s.name not in (p + "ffn_gate.weight", p + "ffn_up.weight")]
        return separate + [
            TensorSpec(p + "ffn_gate.weight", (hp.n_embd, hp.n_ff), fused=fused, fused_shape=shape, first_row=0),
            TensorSpec(p + "ffn_up.weight", (hp.n_embd, hp.n_ff), fused=fused, fused_shape=shape, first_row=hp.n_ff),
        ]
