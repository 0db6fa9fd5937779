"""Llama family: `general.architecture = llama` (Llama 2, Llama 3/3.1/3.2, Mistral, TinyLlama).

GGUF storage conventions relied on (llama.cpp's converter):
- Q and K weights are permuted at conversion so that RoPE uses the *normal* pairing (x[2i], x[2i+1]).
- RMS-norm weights are stored as used (no offset). Feed-forward: SiLU gate.
- `rope_freqs.weight` (Llama 3.1+, n_rot/2 floats) divides each RoPE frequency when present.
- output.weight may be absent: the output projection is then tied to token_embd.
- `llama.rope.dimension_count` gives n_rot (default head_dim); `rope.scaling.factor` linear scaling.
"""

from __future__ import annotations

from ..decoder import Decoder


class Llama(Decoder):
    ROPE_NEOX = False
    ACTIVATION = "silu"
