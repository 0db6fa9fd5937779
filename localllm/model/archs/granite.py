"""IBM Granite (dense, 3.x): `general.architecture = granite`.

The llama layout (RoPE normal pairing, SiLU gate, output.weight optional: tied when absent) with four
multipliers from the file (llama.cpp, src/models/granite.cpp):
- `granite.embedding_scale`: the token embeddings are multiplied by it;
- `granite.residual_scale`: each sub-block's output is multiplied by it before it joins the residual;
- `granite.attention.scale`: the query-key scale (in place of 1/sqrt(head_dim));
- `granite.logit_scale`: the logits are divided by it (required).
An absent or zero multiplier is left out, as llama.cpp leaves it.
"""

from __future__ import annotations

import numpy as np

from ..decoder import Buffers, Decoder
from ..kv_cache import KVCache


class Granite(Decoder):
    ROPE_NEOX = False
    ACTIVATION = "silu"

    def read_extra(self, reader) -> None:
        get = lambda name, default: reader.metadata.get_float(reader.arch_key(name), default, min=0.0)  # noqa: E731
        self.embedding_scale = get("embedding_scale", 0.0)
        self.residual_scale = get("residual_scale", 0.0)
        self.kq_scale = get("attention.scale", 0.0)
        self.logit_scale = reader.metadata.get_float(reader.arch_key("logit_scale"), above=0.0)

    def attention_scale(self) -> float:
        return self.kq_scale or super().attention_scale()

    def embed(self, tokens: np.ndarray, b: Buffers) -> None:
        super().embed(tokens, b)
        if self.embedding_scale:
            self.ops.scale(b.x, self.embedding_scale, b.x)

    def block(self, il: int, b: Buffers, start: int, cache: KVCache) -> None:
        """x += rs * attn(norm(x)); x += rs * ffn(norm(x))."""
        ops, w, p = self.ops, self.w, f"blk.{il}."
        ops.rms_norm(b.x, w[p + "attn_norm.weight"], self.hp.eps, b.h)
        self.attention(il, b, start, cache)
        self._join_residual(b)
        ops.rms_norm(b.x, w[p + "ffn_norm.weight"], self.hp.eps, b.h)
        self.feed_forward(il, b)
        self._join_residual(b)

    def _join_residual(self, b: Buffers) -> None:
        if self.residual_scale:
            self.ops.scale(b.o, self.residual_scale, b.o)
        self.ops.add(b.x, b.o, b.x)

    def finish_logits(self, logits) -> None:
        self.ops.scale(logits, 1.0 / self.logit_scale, logits)
