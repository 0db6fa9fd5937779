"""Gemma 3 (text): `general.architecture = gemma3`.

Gemma 2's block (archs/gemma2.py: norms with the +1 folded in, four norms per block, embeddings scaled
by sqrt(n_embd), GELU-tanh gate, NeoX RoPE) with these differences (llama.cpp's src/models/gemma3.cpp):
- Per-head RMS norms of Q and K before RoPE.
- Sliding window only when `gemma3.attention.sliding_window` is set: five local layers to one global
  (layer il is global when (il+1) % 6 == 0) unless `attention.sliding_window_pattern` says otherwise.
  Local layers: RoPE base `rope.freq_base_swa` (10,000 when absent), no frequency scaling. Global layers:
  full context, RoPE base `gemma3.rope.freq_base`, linear scaling `rope.scaling.factor`.
- No attention soft-capping; logits soft-capped only when `final_logit_softcapping` is set.
- The output projection is output.weight when present, else token_embd.
- Queries scaled by 1/sqrt(head_dim) (1/sqrt(n_embd/n_head) for the 27B model, 62 layers).
"""

from __future__ import annotations

from ..decoder import Decoder
from .gemma2 import Gemma2

LOCAL_ROPE_BASE = 10000.0


class Gemma3(Gemma2):
    QK_NORM = True
    WINDOW_PERIOD = 6
    LAYERS_27B = 62
    DEFAULT_ATTN_SOFTCAP, DEFAULT_FINAL_SOFTCAP = 0.0, 0.0

    def read_extra(self, reader) -> None:
        super().read_extra(reader)
        self.sliding_window = reader.metadata.get_int(reader.arch_key("attention.sliding_window"), 0, min=0)
        if not self.sliding_window:
            self.local = [False] * self.hp.n_layer

    def default_local_rope_base(self) -> float:
        return LOCAL_ROPE_BASE

    def local_rope_scale(self) -> float:
        return 1.0

    def tensor_specs(self):
        return Decoder.tensor_specs(self)  # output.weight optional, as for llama
