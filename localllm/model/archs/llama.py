"""Llama family: `general.architecture = llama` (Llama 2, Llama 3/3.1/3.2, Mistral, TinyLlama, and Mixtral:
llama files with experts).

GGUF storage conventions relied on (llama.cpp's converter):
- Q and K weights are permuted at conversion so that RoPE uses the *normal* pairing (x[2i], x[2i+1]).
- RMS-norm weights are stored as used (no offset). Feed-forward: SiLU gate.
- `rope_freqs.weight` (Llama 3.1+, n_rot/2 floats) divides each RoPE frequency when present.
- output.weight may be absent: the output projection is then tied to token_embd.
- `llama.rope.dimension_count` gives n_rot (default head_dim); `rope.scaling.factor` linear scaling.
- Mixtral: `llama.expert_count` > 0 makes every feed-forward routed experts (model/moe.py): softmax
  over the router's scores, the top `expert_used_count` renormalised to sum 1; experts as wide as
  `feed_forward_length`, stored as `ffn_{gate,up,down}_exps` (the older one-tensor-per-expert layout,
  `ffn_gate.<e>.weight`, is not read, as llama.cpp no longer reads it).
"""

from __future__ import annotations

from ..decoder import Decoder
from ..moe import MixtureOfExperts


class Llama(MixtureOfExperts, Decoder):
    ROPE_NEOX = False
    ACTIVATION = "silu"
    MOE_ONLY = False
    MOE_NORM_WEIGHTS = True
