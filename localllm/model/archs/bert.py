"""BERT encoders (embedding models): `general.architecture = bert` (all-MiniLM, bge, e5 ...) and
`nomic-bert` (nomic-embed-text), as llama.cpp's src/models/bert.cpp builds them.

No output layer: the model gives hidden states, which api.Model.embed pools (`<arch>.pooling_type`) and
normalises. Conventions relied on (llama.cpp's converter):
- Attention is not causal (`<arch>.attention.causal = false`, read by Decoder): every token sees the whole
  text. Scores scaled by 1/sqrt(head_dim); Q/K/V as three matrices with biases (bert) or one fused
  attn_qkv (nomic-bert), attn_output with an optional bias.
- Input: token_embd rows + row 0 of token_types (llama.cpp fixes every token type to 0, "sentence A")
  when present + (bert) position_embd rows at positions 0..T-1, then LayerNorm `token_embd_norm`
  (weight and bias). nomic-bert has no position table: RoPE, NeoX pairing, on Q and K.
- Post-norm blocks with LayerNorm (`attention.layer_norm_epsilon`):
  h = LN_attn_output_norm(x + attn(x)); x = LN_layer_output_norm(h + ffn(h)).
- Feed-forward: bert up (+bias) -> GELU (tanh form, as ggml_gelu) -> down (+bias); nomic-bert
  down(SiLU(gate(h)) * up(h)), no biases (llama.cpp passes none for it).
- No final norm: the last block's output is the hidden state.
"""

from __future__ import annotations

import numpy as np

from ...backends.base import Weight
from ...errors import LocalLLMError
from ..buffers import Buffers
from ..decoder import Decoder
from ..kv_cache import KVCache
from ..weights import TensorSpec


class Bert(Decoder):
    GENERATES = False
    POSITION_TABLE = True  # learned absolute positions (position_embd); False: RoPE
    GATED_FFN = False  # nomic-bert's SiLU-gated feed-forward instead of GELU
    ROPE_NEOX = True

    def read_extra(self, reader) -> None:
        info = reader.tensors.get("token_types.weight")
        # the table's rows: tokenizer.ggml.token_type_count, as the tensor's shape says (only row 0 is read)
        self.n_token_types = int(info.shape[1]) if info is not None and len(info.shape) == 2 else 0
        self._ones = None  # [T, n_ff] of ones on the backend (see ones)
        self._zero_ids: dict[int, np.ndarray] = {}

    def layer_has_rope(self, il: int) -> bool:
        return not self.POSITION_TABLE

    def tensor_specs(self) -> list[TensorSpec]:
        hp = self.hp
        specs = [
            TensorSpec("token_embd.weight", (hp.n_embd, hp.n_vocab), gathered=True),
            TensorSpec("token_embd_norm.weight", (hp.n_embd,), vector=True),
            TensorSpec("token_embd_norm.bias", (hp.n_embd,), vector=True),
        ]
        if self.n_token_types:
            specs.append(TensorSpec("token_types.weight", (hp.n_embd, self.n_token_types), gathered=True))
        if self.POSITION_TABLE:
            specs.append(TensorSpec("position_embd.weight", (hp.n_embd, hp.context_length), gathered=True))
        for il in range(hp.n_layer):
            specs += self.block_specs(il)
        return specs

    def block_specs(self, il: int) -> list[TensorSpec]:
        hp, p = self.hp, f"blk.{il}."
        specs = [
            *self.qkv_specs(il),
            TensorSpec(p + "attn_output.weight", (hp.n_head * hp.head_dim, hp.n_embd)),
            TensorSpec(p + "attn_output.bias", (hp.n_embd,), optional=True, vector=True),
            TensorSpec(p + "ffn_up.weight", (hp.n_embd, hp.n_ff)),
            TensorSpec(p + "ffn_down.weight", (hp.n_ff, hp.n_embd)),
        ]
        if self.GATED_FFN:
            specs.append(TensorSpec(p + "ffn_gate.weight", (hp.n_embd, hp.n_ff)))
        else:
            specs += [TensorSpec(p + "ffn_up.bias", (hp.n_ff,), optional=True, vector=True),
                      TensorSpec(p + "ffn_down.bias", (hp.n_embd,), optional=True, vector=True)]
        for norm in ("attn_output_norm", "layer_output_norm"):
            specs += [TensorSpec(p + norm + ".weight", (hp.n_embd,), vector=True),
                      TensorSpec(p + norm + ".bias", (hp.n_embd,), vector=True)]
        return specs

    def _zeros(self, n: int) -> np.ndarray:
        ids = self._zero_ids.get(n)
        if ids is None:
            ids = self._zero_ids[n] = np.zeros(n, dtype=np.int32)
        return ids

    def embed(self, tokens: np.ndarray, b: Buffers) -> None:
        ops, w = self.ops, self.w
        ops.embed(w["token_embd.weight"], tokens, b.x)
        if "token_types.weight" in w:  # every token of type 0: row 0 added to each
            ops.embed(w["token_types.weight"], self._zeros(b.n_tokens), b.o)
            ops.add(b.x, b.o, b.x)
        if self.POSITION_TABLE:
            if int(b.positions[-1]) >= self.hp.context_length:
                raise LocalLLMError(f"{self.hp.context_length} positions at most: the model's position table ends there")
            ops.embed(w["position_embd.weight"], b.positions, b.o)
            ops.add(b.o, b.x, b.x)
        ops.layer_norm(b.x, w["token_embd_norm.weight"], w["token_embd_norm.bias"], self.hp.eps, b.x)

    def block(self, il: int, b: Buffers, start: int, cache: KVCache) -> None:
        ops, w, p, eps = self.ops, self.w, f"blk.{il}.", self.hp.eps
        self.attention(il, b, start, cache, x=b.x)
        ops.add(b.o, b.x, b.o)
        ops.layer_norm(b.o, w[p + "attn_output_norm.weight"], w[p + "attn_output_norm.bias"], eps, b.h)
        self.feed_forward(il, b)
        ops.add(b.o, b.h, b.o)
        ops.layer_norm(b.o, w[p + "layer_output_norm.weight"], w[p + "layer_output_norm.bias"], eps, b.x)

    def feed_forward(self, il: int, b: Buffers, x=None) -> None:
        ops, w, p = self.ops, self.w, f"blk.{il}."
        x = b.h if x is None else x
        self.linear(b, w[p + "ffn_up.weight"], x, b.up, w.get(p + "ffn_up.bias"))
        if self.GATED_FFN:
            self.linear(b, w[p + "ffn_gate.weight"], x, b.gate)
            ops.gated_act(b.gate, b.up, b.gate, "silu")
            self.linear(b, w[p + "ffn_down.weight"], b.gate, b.o)
            return
        ops.gated_act(b.up, self.ones(b.n_tokens), b.up, "gelu_tanh")
        self.linear(b, w[p + "ffn_down.weight"], b.up, b.o, w.get(p + "ffn_down.bias"))

    def ones(self, n_tokens: int):
        """[T, n_ff] of ones on the backend: the gate's factor that leaves gated_act's GELU ungated (the
        product by 1 is exact). Gathered from a one-row table of ones, so that any backend makes it; one
        buffer, grown to the longest text so far, and cut."""
        if self._ones is None or self._ones.shape[0] < n_tokens:
            n_ff = self.hp.n_ff
            table = self.ops.upload(Weight("ones", "F32", (n_ff, 1), np.ones((1, n_ff), np.float32).view(np.uint8)))
            self._ones = self.ops.alloc((n_tokens, n_ff))
            self.ops.embed(table, self._zeros(n_tokens), self._ones)
        return self._ones[:n_tokens]

    def output_norm(self, x, out) -> None:
        self.ops.scale(x, 1.0, out)  # none: the hidden state as the last block leaves it

    def _forward(self, tokens, start, cache, all_logits):
        raise LocalLLMError(f"{type(self).__name__} is an embedding model: it has no output layer to give logits "
                            "or text (use embed)")

    def _forward_batch(self, cache, layout, logit_rows):
        self._forward(None, 0, cache, False)


class NomicBert(Bert):
    POSITION_TABLE = False
    GATED_FFN = True
