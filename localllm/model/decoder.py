"""The decoder-only transformer that the architecture modules specialise.

`Decoder` holds what every architecture shares: the embedding lookup, a stack of pre-norm blocks
(attention + gated feed-forward), the final norm and the output projection, all written against the
backend ops. An architecture module subclasses it, sets its class-level conventions and overrides
`tensor_specs`, `layer_window`, `layer_rope` or `block` where it differs.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..backends.base import Backend
from .buffers import BatchBuffers, Buffers
from .hparams import HParams
from .kv_cache import KVCache, LayerKV
from .rope import LayerRope, layer_rope
from .weights import BoundWeights, TensorSpec, bind_weights


# Rows Decoder.verify takes at most: below the CPU backend's BLAS thresholds (matmul and attention switch
# at 32 rows), where every row is computed as a one-token step computes it.
MAX_VERIFY_ROWS = 24


def sliding_window_layers(reader, n_layer: int, period: int) -> list[bool]:
    """Which layers attend through the sliding window, as llama.cpp decides (llama_hparams::set_swa_pattern):
    `<arch>.attention.sliding_window_pattern` as one flag per layer, or as a period n (its absence:
    the architecture's `period`): layer il is local unless il % n == n - 1 (n = 0: every layer local)."""
    key = reader.arch_key("attention.sliding_window_pattern")
    value = reader.metadata.get(key)
    if isinstance(value, np.ndarray) and value.dtype == bool:
        if len(value) != n_layer:
            reader.metadata.fail(key, f"has {len(value)} entries, expected one per layer ({n_layer})")
        return [bool(v) for v in value]
    n = reader.metadata.get_int(key, period, min=0, max=n_layer + 1)
    return [n == 0 or il % n < n - 1 for il in range(n_layer)]


class Decoder:
    # Conventions an architecture sets (see each module's docstring):
    ROPE_NEOX = False  # NeoX pairing (x[i], x[i+n_rot/2]) instead of adjacent pairs
    ACTIVATION = "silu"  # gated feed-forward activation
    QKV_BIAS = False  # attn_q/k/v carry biases
    FFN_NORM = "ffn_norm"  # the feed-forward's pre-norm tensor (gpt-oss names it post_attention_norm)
    GENERATES = True  # has an output projection to logits (an encoder has none: embeddings only)
    QK_NORM = False  # RMS norm of Q and K before RoPE: True per head (weights head_dim long), "rows" over
    # each whole projection (weights n_head * head_dim and n_head_kv * head_dim long)

    def __init__(self, reader, backend: Backend, n_vocab: int):
        self.ops = backend
        self.hp = HParams.from_reader(reader, n_vocab)
        self.file_tensors = frozenset(reader.tensors)  # the names in the file (for optional and fused layouts)
        # `<arch>.attention.causal` (llama.cpp's default: causal); BERT's files say false
        self.causal = reader.metadata.get_bool(reader.arch_key("attention.causal"), True)
        self.read_extra(reader)
        self.w: BoundWeights = bind_weights(reader, self.tensor_specs(), backend)
        self.n_ctx = self.hp.context_length  # the context the model runs at (use_context)
        self._ropes: dict = {}  # (base, freq_scale, id(divisors), yarn, n_rot) -> (divisors, LayerRope)
        self._layer_ropes: dict = {}  # layer -> (LayerRope, n_rot), as rotate uses them
        self._buffers: dict[int, Buffers] = {}
        self._logits: dict[int, np.ndarray] = {}
        self._batch = BatchBuffers(backend, self.hp)  # forward_batch's buffers, grown on demand

    # -- what an architecture may override ----------------------------------------------------------
    def read_extra(self, reader) -> None:
        """Read architecture-specific metadata."""

    def layer_window(self, il: int) -> int:
        """Attention window of layer il (0: the whole context)."""
        return 0

    def layer_rope(self, il: int) -> tuple[float, float]:
        """(RoPE base, frequency scale) of layer il."""
        return self.hp.rope_base, self.hp.rope_freq_scale

    def layer_n_rot(self, il: int) -> int:
        """How many dims of each head layer il rotates (Gemma 4's local and global layers differ)."""
        return self.hp.n_rot

    def layer_yarn(self, il: int) -> Optional[bool]:
        """Whether layer il applies the file's YaRN scaling (None: as the file says)."""
        return None

    def rope_divisors(self, il: int):
        """Per-pair frequency divisors of layer il (llama.cpp's get_rope_factors): rope_freqs.weight when
        present, else LongRoPE's long factors past the original context, its short ones within it."""
        w = self.w
        if "rope_freqs.weight" in w:
            return w["rope_freqs.weight"]
        if "rope_factors_long.weight" in w and self.n_ctx > self.hp.rope_scaling.orig_ctx:
            return w["rope_factors_long.weight"]
        return w.get("rope_factors_short.weight")

    def ties_output(self) -> bool:
        """Whether the output projection is token_embd (the file has no output.weight, or the family
        always ties them); else token_embd is only gathered from."""
        return "output.weight" not in self.file_tensors

    def kv_layout(self) -> Optional[list[LayerKV]]:
        """Each layer's KV cache shape and source, where layers differ (None: all [n_head_kv, head_dim])."""
        return None

    @classmethod
    def kv_layout_of(cls, reader, hp: HParams) -> Optional[list[LayerKV]]:
        """kv_layout from the file's metadata alone (load's memory estimate runs before any model)."""
        return None

    def use_context(self, n_ctx: int) -> None:
        """The model now runs with a context of n_ctx tokens (LongRoPE's factors depend on it)."""
        self.n_ctx = n_ctx
        self._layer_ropes.clear()

    def layer_has_rope(self, il: int) -> bool:
        """Whether layer il rotates Q and K (some architectures leave RoPE out of some layers)."""
        return True

    def attention_scale(self) -> float:
        return 1.0 / math.sqrt(self.hp.head_dim)

    def attention_softcap(self) -> float:
        """The attention scores' soft cap (0: none; see Backend.attention)."""
        return 0.0

    def gate_attention(self, il: int, b: Buffers, x) -> None:
        """Scale the attention's output b.attn [T, Hq, D] before its projection, from the block's input x
        (an output gate), in place."""

    def scale_queries(self, b: Buffers) -> None:
        """Scale the rotated queries b.q [T, Hq, D] per position (an attention temperature), in place."""

    def finish_logits(self, logits) -> None:
        """Transform the output projection's logits [rows, vocab] in place (scaling, soft-capping)."""

    def block_specs(self, il: int) -> list[TensorSpec]:
        hp, p = self.hp, f"blk.{il}."
        q_out, kv_out = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        specs = [
            TensorSpec(p + "attn_norm.weight", (hp.n_embd,), vector=True),
            *self.qkv_specs(il),
            TensorSpec(p + "attn_output.weight", (q_out, hp.n_embd)),
            TensorSpec(p + "attn_output.bias", (hp.n_embd,), optional=True, vector=True),  # llama.cpp: optional for all
            TensorSpec(p + self.FFN_NORM + ".weight", (hp.n_embd,), vector=True),
            *self.ffn_specs(il),
        ]
        if self.QK_NORM:
            rows = self.QK_NORM == "rows"
            specs += [
                TensorSpec(p + "attn_q_norm.weight", (q_out if rows else hp.head_dim,), vector=True),
                TensorSpec(p + "attn_k_norm.weight", (kv_out if rows else hp.head_dim,), vector=True),
            ]
        return specs

    def ffn_specs(self, il: int) -> list[TensorSpec]:
        """The feed-forward's matrices of layer il (a mixture of experts has its own: model/moe.py)."""
        hp, p = self.hp, f"blk.{il}."
        return [
            TensorSpec(p + "ffn_gate.weight", (hp.n_embd, hp.n_ff)),
            TensorSpec(p + "ffn_up.weight", (hp.n_embd, hp.n_ff)),
            TensorSpec(p + "ffn_down.weight", (hp.n_ff, hp.n_embd)),
        ]

    def qkv_specs(self, il: int) -> list[TensorSpec]:
        """attn_q/k/v weights and biases, separate or as row ranges of one fused attn_qkv (llama.cpp
        accepts either for every architecture); biases required where QKV_BIAS says so, else optional."""
        hp, p = self.hp, f"blk.{il}."
        outs = {"q": hp.n_head * hp.head_dim, "k": hp.n_head_kv * hp.head_dim, "v": hp.n_head_kv * hp.head_dim}
        total = sum(outs.values())
        fused = p + "attn_qkv.weight" in self.file_tensors
        fused_bias = p + "attn_qkv.bias" in self.file_tensors
        specs, first = [], 0
        for part, n_out in outs.items():
            name = f"{p}attn_{part}"
            if fused:
                specs.append(TensorSpec(name + ".weight", (hp.n_embd, n_out), fused=p + "attn_qkv.weight",
                                        fused_shape=(hp.n_embd, total), first_row=first))
            else:
                specs.append(TensorSpec(name + ".weight", (hp.n_embd, n_out)))
            if fused_bias:
                specs.append(TensorSpec(name + ".bias", (n_out,), vector=True, fused=p + "attn_qkv.bias",
                                        fused_shape=(total,), first_row=first))
            else:
                specs.append(TensorSpec(name + ".bias", (n_out,), vector=True, optional=not self.QKV_BIAS))
            first += n_out
        return specs

    def tensor_specs(self) -> list[TensorSpec]:
        hp = self.hp
        specs = [
            TensorSpec("token_embd.weight", (hp.n_embd, hp.n_vocab), gathered=not self.ties_output()),
            TensorSpec("output_norm.weight", (hp.n_embd,), vector=True),
            TensorSpec("output.weight", (hp.n_embd, hp.n_vocab), optional=True),  # absent: tied to token_embd
            TensorSpec("output.bias", (hp.n_vocab,), optional=True, vector=True),  # Phi-3 files may carry one
            TensorSpec("rope_freqs.weight", (hp.n_rot // 2,), optional=True, vector=True),  # llama 3.1 and later
            TensorSpec("rope_factors_long.weight", (hp.n_rot // 2,), optional=True, vector=True),  # LongRoPE
            TensorSpec("rope_factors_short.weight", (hp.n_rot // 2,), optional=True, vector=True),
        ]
        for il in range(hp.n_layer):
            specs += self.block_specs(il)
        return specs

    def embed(self, tokens: np.ndarray, b: Buffers) -> None:
        self.ops.embed(self.w["token_embd.weight"], tokens, b.x)

    def block(self, il: int, b: Buffers, start: int, cache: KVCache) -> None:
        """Pre-norm block: x += attn(norm(x)); x += ffn(norm(x))."""
        ops, w, p = self.ops, self.w, f"blk.{il}."
        ops.rms_norm(b.x, w[p + "attn_norm.weight"], self.hp.eps, b.h)
        self.attention(il, b, start, cache)
        ops.add(b.x, b.o, b.x)
        ops.rms_norm(b.x, w[p + self.FFN_NORM + ".weight"], self.hp.eps, b.h)
        self.feed_forward(il, b)
        ops.add(b.x, b.o, b.x)

    # -- shared sub-blocks ----------------------------------------------------------------------------
    def attention(self, il: int, b: Buffers, start: int, cache: KVCache, x=None) -> None:
        """b.o <- attention(x) for layer il (x: b.h unless given); stores this batch's K/V in the cache."""
        ops, w, hp, p = self.ops, self.w, self.hp, f"blk.{il}."
        t, x = b.n_tokens, b.h if x is None else x
        self.linear(b, w[p + "attn_q.weight"], x, b.q.reshape(t, -1), w.get(p + "attn_q.bias"))
        self.linear(b, w[p + "attn_k.weight"], x, b.k.reshape(t, -1), w.get(p + "attn_k.bias"))
        self.linear(b, w[p + "attn_v.weight"], x, b.v.reshape(t, -1), w.get(p + "attn_v.bias"))
        if self.QK_NORM:  # rms_norm normalises runs of the weight's length: a head, or a whole row
            ops.rms_norm(b.q, w[p + "attn_q_norm.weight"], hp.eps, b.q)
            ops.rms_norm(b.k, w[p + "attn_k_norm.weight"], hp.eps, b.k)
        if self.layer_has_rope(il):
            self.rotate(il, b, b.q)
            self.rotate(il, b, b.k)
        self.scale_queries(b)
        cache.store(ops, il, b.k, b.v, start)
        if self.causal:
            cache.attend(ops, il, b.q, start, self.attention_scale(), self.layer_window(il), b.attn,
                         self.attention_softcap(), w.get(p + "attn_sinks.weight"))
        else:  # an encoder: every position sees the whole text (KVCache only: encoders are not batched)
            ops.attention_bidirectional(b.q, cache.k[il], cache.v[il], start, self.attention_scale(), b.attn,
                                        w.get(p + "attn_sinks.weight"))
        self.gate_attention(il, b, x)
        self.linear(b, w[p + "attn_output.weight"], b.attn.reshape(t, -1), b.o, w.get(p + "attn_output.bias"))

    def rotate(self, il: int, b: Buffers, x) -> None:
        """RoPE of layer il on x [T, H, D] (b.q, b.k, or a layer's views of them), at b.positions."""
        found = self._layer_ropes.get(il)
        if found is None:  # looked up once per layer (use_context forgets them: LongRoPE's factors may change)
            found = self._layer_ropes[il] = (self.rope_of_layer(il), self.layer_n_rot(il))
        r, n_rot = found
        self.ops.rope(x, b.positions, n_rot, r.base, self.ROPE_NEOX, r.divisors, r.freq_scale, r.mscale)

    def rope_of_layer(self, il: int) -> LayerRope:
        """The rope op's arguments for layer il (model/rope.py), made once per distinct setting: the same
        divisor array each step, so the backends' per-array caches hold."""
        base, freq_scale = self.layer_rope(il)
        divisors, yarn, n_rot = self.rope_divisors(il), self.layer_yarn(il), self.layer_n_rot(il)
        key = (base, freq_scale, id(divisors), yarn, n_rot)
        cached = self._ropes.get(key)
        if cached is None or cached[0] is not divisors:
            rope = layer_rope(self.hp.rope_scaling, n_rot, base, freq_scale, divisors, yarn)
            cached = self._ropes[key] = (divisors, rope)
        return cached[1]

    def feed_forward(self, il: int, b: Buffers, x=None) -> None:
        """b.o <- down(act(gate(x)) * up(x)) (x: b.h unless given)."""
        ops, w, p = self.ops, self.w, f"blk.{il}."
        x = b.h if x is None else x
        self.linear(b, w[p + "ffn_gate.weight"], x, b.gate)
        self.linear(b, w[p + "ffn_up.weight"], x, b.up)
        ops.gated_act(b.gate, b.up, b.gate, self.ACTIVATION)
        self.linear(b, w[p + "ffn_down.weight"], b.gate, b.o)

    def linear(self, b: Buffers, w, x, out, bias=None) -> None:
        """out = x @ W.T (+ bias); the first b.n_rowwise rows row by row (see Buffers.n_rowwise)."""
        d = b.n_rowwise
        if d:
            self.ops.matmul_rows(w, x[:d], out[:d], bias)
        if x.shape[0] == d:
            return
        if b.segments is None:
            self.ops.matmul(w, x[d:], out[d:], bias)
        else:
            self.ops.matmul_segments(w, x[d:], out[d:], b.segments, bias)

    # -- the forward pass -----------------------------------------------------------------------------
    def buffers(self, n_tokens: int) -> Buffers:
        buf = self._buffers.get(n_tokens)
        if buf is None:
            if len(self._buffers) > 4:  # keep the decode buffers and a few prefill sizes
                for key in [k for k in self._buffers if k != 1][:2]:
                    del self._buffers[key]
            buf = self._buffers[n_tokens] = Buffers(self.ops, self.hp, n_tokens)
        return buf

    def forward(self, tokens: np.ndarray, start: int, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Run tokens[T] at positions start..start+T-1; returns logits [T, vocab] or [1, vocab] (last)."""
        n = len(tokens)
        self.ops.begin_step(n)  # a step that raises is never ended, so never measured
        logits = self._forward(tokens, start, cache, all_logits)
        self.ops.end_step()
        return logits

    def verify(self, tokens: np.ndarray, start: int, cache: KVCache) -> np.ndarray:
        """Logits [T, vocab] of every row of tokens[T] run at positions start..start+T-1, each row bit for
        bit what a one-token forward (a decode step) at its position gives: the rows go through the
        decode path's kernels (Buffers.n_rowwise), the weights read once for all of them. Speculative
        decoding checks a draft with it (localllm/speculative.py); T stays below the backends' batch
        thresholds (MAX_VERIFY_ROWS)."""
        n = len(tokens)
        if n > MAX_VERIFY_ROWS:
            raise ValueError(f"verify takes at most {MAX_VERIFY_ROWS} rows, got {n}")
        # forward_batch's buffers, views of one allocation: T changes from step to step (a buffer per T,
        # logits [T, vocab] among them, would pile up)
        b = self._batch.rows(n)
        b.n_rowwise, b.segments = n, None
        self.ops.begin_step(n)
        self._layers(tokens, start, cache, b)
        _, normed, logits = self._batch.outputs(n)
        self.output_norm(b.x, normed)
        self._project(normed, logits, rowwise=True)
        self.ops.end_step()
        return self.ops.to_host(logits)

    def _forward(self, tokens: np.ndarray, start: int, cache: KVCache, all_logits: bool) -> np.ndarray:
        n = len(tokens)
        b = self._layers(tokens, start, cache)
        rows = b.x if all_logits else b.x[n - 1 :]
        normed = b.h[: rows.shape[0]]
        self.output_norm(rows, normed)
        logits = self._logits.get(rows.shape[0])
        if logits is None:
            logits = self._logits[rows.shape[0]] = self.ops.alloc((rows.shape[0], self.hp.n_vocab))
        self._project(normed, logits)
        return self.ops.to_host(logits)

    def _project(self, normed, logits, rowwise: bool = False) -> None:
        """logits [R, vocab] <- the output projection of normed [R, n_embd] (rowwise: each row as a one-row
        product computes it), then finish_logits."""
        output = self.w.get("output.weight") or self.w["token_embd.weight"]
        (self.ops.matmul_rows if rowwise else self.ops.matmul)(output, normed, logits, self.w.get("output.bias"))
        self.finish_logits(logits)

    def _layers(self, tokens: np.ndarray, start: int, cache: KVCache, b: Optional[Buffers] = None) -> Buffers:
        """Embed tokens[T] at positions start..start+T-1 and run every block: the buffers (b, or this T's
        own), b.x the last hidden state (before the output norm)."""
        n = len(tokens)
        b = self.buffers(n) if b is None else b
        if n == 1:
            b.positions[0] = start  # decode: no temporary array
        else:
            b.positions[:] = np.arange(start, start + n, dtype=np.int32)
        self.embed(np.asarray(tokens, dtype=np.int32), b)
        cache.running()
        for il in range(self.hp.n_layer):
            self.block(il, b, start, cache)
        cache.ran(start + n)
        return b

    def output_norm(self, x, out) -> None:
        """out = the final norm of hidden states x [R, n_embd] (an encoder without one copies them)."""
        self.ops.rms_norm(x, self.w["output_norm.weight"], self.hp.eps, out)

    def hidden_states(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        """float32 [T, n_embd], a new array: the final hidden state of each of tokens[T] run from position 0
        (after the output norm, before the output projection: what llama.cpp pools into embeddings, its
        t_embd). Attention as the model's (causal for a decoder; an encoder's sees the whole text)."""
        n = len(tokens)
        self.ops.begin_step(n)
        b = self._layers(tokens, 0, cache)
        self.output_norm(b.x, b.h)
        self.ops.end_step()
        return np.array(self.ops.to_host(b.h), dtype=np.float32)

    def forward_batch(self, cache, layout, logit_rows: np.ndarray) -> np.ndarray:
        """One step over several sequences of a paged cache (model/kv_paged.py).

        layout: a BatchLayout of T rows; logit_rows int32[S]: the rows whose next-token logits are
        wanted (each computed row by row). Returns logits [S, vocab] (a reused buffer)."""
        self.ops.begin_step(len(layout.tokens))
        logits = self._forward_batch(cache, layout, logit_rows)
        self.ops.end_step()
        return logits

    def _forward_batch(self, cache, layout, logit_rows: np.ndarray) -> np.ndarray:
        from .kv_paged import PagedBatch

        n, n_out = len(layout.tokens), len(logit_rows)
        b = self._batch.rows(n)
        b.positions[:] = layout.positions
        b.n_rowwise = layout.n_rowwise
        b.segments = self._prompt_segments(layout)
        view = PagedBatch(cache, layout)
        self.embed(layout.tokens, b)
        for il in range(self.hp.n_layer):
            self.block(il, b, 0, view)
        last, normed, logits = self._batch.outputs(n_out)
        self.ops.take_rows(b.x, logit_rows, last)
        self.ops.rms_norm(last, self.w["output_norm.weight"], self.hp.eps, normed)
        self._project(normed, logits, rowwise=True)
        return self.ops.to_host(logits)

    @staticmethod
    def _prompt_segments(layout):
        """Row bounds, relative to the first prompt row, of the prompt chunks after the decode rows when
        there are several (None for one: matmul as usual)."""
        firsts = [int(f) for f, s in zip(layout.seq_first, layout.seq_rows) if f >= layout.n_rowwise and s]
        if len(firsts) < 2:
            return None
        return tuple(f - layout.n_rowwise for f in firsts) + (len(layout.tokens) - layout.n_rowwise,)
