"""Gemma 4 (dense text models): `general.architecture = gemma4`.

Gemma 3's block (archs/gemma3.py: norms with the +1 folded in, four norms per block, per-head Q/K norms,
embeddings scaled by sqrt(n_embd), GELU-tanh gate, NeoX RoPE) with these differences, as llama.cpp's
src/models/gemma4.cpp computes them:
- Local and global layers differ in shape: `attention.sliding_window_pattern` (one flag per layer,
  required) marks the local ones, whose heads are `attention.key_length_swa` wide and rotate
  `rope.dimension_count_swa` dims at base `rope.freq_base_swa` (10,000 when absent) without scaling;
  global layers use `attention.key_length`, `rope.dimension_count`, `rope.freq_base` and the divisors of
  `rope_freqs.weight`.
- The last `attention.shared_kv_layers` layers compute no K or V: each reads the cache of the last local
  (or global) layer before them, as llama.cpp's layer reuse does.
- V is RMS-normed without a weight; a layer without attn_v uses its K projection (before K's norm) as V.
  Scores are not scaled (the Q/K norms do it).
- Per-layer embeddings (`embedding_length_per_layer_input` = P > 0): per_layer_token_embd gives each
  token P values per layer (times sqrt(P)), added to per_layer_model_proj of the scaled embeddings (times
  1/sqrt(n_embd), RMS-normed per layer by per_layer_proj_norm), the sum times 1/sqrt(2). After its
  feed-forward, layer il adds post_norm(proj(gelu(inp_gate(x)) * those P values of layer il)).
- `blk.N.layer_output_scale` (one float), when present, scales the residual stream after layer N.
- The output projection is output.weight when present, else token_embd; logits soft-capped by
  `final_logit_softcapping` (30 when absent, llama.cpp's default).
Mixture-of-experts layers (Gemma 4 26B-A4B; a layer with `ffn_gate_inp`): the dense feed-forward above
runs beside the experts as a shared one, each with its own norms, and their sum takes post_ffw_norm:
  dense = post_ffw_norm_1(ffn(ffn_norm(x))); routed = post_ffw_norm_2(experts(pre_ffw_norm_2(x)))
  x += post_ffw_norm(dense + routed)
The router scores rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale (not the experts' input); softmax over
the scores, the top `expert_used_count` renormalised to sum 1; GELU-gated experts `expert_feed_forward_length`
wide, gate and up fused (`ffn_gate_up_exps`) or apart, each expert's output times `ffn_down_exps.scale`
(model/moe.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from ...errors import UnsupportedArchitecture
from ..buffers import Buffers
from ..decoder import Decoder, sliding_window_layers
from ..kv_cache import KVCache, LayerKV
from ..hparams import MAX_WIDTH
from ..moe import MixtureOfExperts
from ..weights import TensorSpec

LOCAL_ROPE_BASE = 10000.0
FINAL_SOFTCAP = 30.0


def _rows(buffer, n_tokens: int, *shape):
    """The first n_tokens rows of `buffer` seen as [n_tokens, *shape] (a view of its leading elements:
    layers narrower than the widest use the buffers sized for it)."""
    return buffer.reshape(-1)[: n_tokens * math.prod(shape)].reshape(n_tokens, *shape)


@dataclass(frozen=True)
class LayerShapes:
    """Which layers are local, the local head size, and how many layers keep their own KV cache, from the
    file's metadata (shared by the model and load's memory estimate, which runs before any model)."""

    local: list
    head_dim_local: int
    n_kv_layers: int

    @classmethod
    def read(cls, reader, hp) -> "LayerShapes":
        meta, key = reader.metadata, reader.arch_key
        pattern_key = key("attention.sliding_window_pattern")
        if not isinstance(meta.get(pattern_key), np.ndarray):  # llama.cpp requires the per-layer flags
            meta.fail(pattern_key, f"must be {hp.n_layer} booleans, one per layer")
        local = sliding_window_layers(reader, hp.n_layer, period=0)
        head_dim_local = meta.get_int(key("attention.key_length_swa"), hp.head_dim, min=2, max=hp.head_dim)
        if meta.get_int(key("attention.value_length_swa"), head_dim_local) != head_dim_local or \
                meta.get_int(key("attention.value_length"), hp.head_dim) != hp.head_dim:
            meta.fail(key("attention.value_length"), "must equal the key length (Gemma 4)")
        n_shared = meta.get_int(key("attention.shared_kv_layers"), 0, min=0, max=max(0, hp.n_layer - 2))
        n_kv_layers = hp.n_layer - n_shared
        if n_shared and not (local[n_kv_layers - 2] and not local[n_kv_layers - 1]):
            meta.fail(key("attention.shared_kv_layers"), "the two layers before the shared ones must be local, then global")
        return cls(local, head_dim_local, n_kv_layers)

    def head_dim(self, il: int, hp) -> int:
        return self.head_dim_local if self.local[il] else hp.head_dim

    def kv_source(self, il: int) -> int:
        """The layer whose KV cache layer il reads (llama.cpp's layer reuse for the shared layers)."""
        if il < self.n_kv_layers:
            return il
        return self.n_kv_layers - (2 if self.local[il] else 1)

    def kv_layout(self, hp) -> list[LayerKV]:
        return [LayerKV(hp.n_head_kv, self.head_dim(il, hp), self.kv_source(il)) for il in range(hp.n_layer)]


class Gemma4(MixtureOfExperts, Decoder):
    ROPE_NEOX = True
    ACTIVATION = "gelu_tanh"
    QK_NORM = True
    MOE_ONLY = False
    MOE_NORM_WEIGHTS = True

    def read_extra(self, reader) -> None:
        meta, key, hp = reader.metadata, reader.arch_key, self.hp
        super().read_extra(reader)  # self.moe: the experts' settings (None: a dense model)
        self.moe_layers = [f"blk.{il}.ffn_gate_inp.weight" in self.file_tensors for il in range(hp.n_layer)]
        if any(self.moe_layers) and self.moe is None:
            raise UnsupportedArchitecture("this Gemma 4 file has expert layers but no gemma4.expert_count")
        self.shapes = LayerShapes.read(reader, hp)
        self.local, self.head_dim_local, self.n_kv_layers = self.shapes.local, self.shapes.head_dim_local, self.shapes.n_kv_layers
        self.sliding_window = meta.get_int(key("attention.sliding_window"), min=1)
        self.n_rot_local = meta.get_int(key("rope.dimension_count_swa"), hp.n_rot, min=2, max=self.head_dim_local)
        self.local_rope_base = meta.get_float(key("rope.freq_base_swa"), LOCAL_ROPE_BASE, above=0.0)
        self.final_softcap = meta.get_float(key("final_logit_softcapping"), FINAL_SOFTCAP, min=0.0)
        self.n_ple = meta.get_int(key("embedding_length_per_layer_input"), 0, min=0, max=MAX_WIDTH)
        n_ff = meta.get(key("feed_forward_length"))
        self.n_ff = [int(v) for v in n_ff] if isinstance(n_ff, np.ndarray) else [hp.n_ff] * hp.n_layer
        if len(self.n_ff) != hp.n_layer or min(self.n_ff) < 1:
            meta.fail(key("feed_forward_length"), f"must be one positive length or {hp.n_layer} of them")
        self._global_divisors = None
        self._extra: dict[int, dict] = {}
        self._plans: dict[int, SimpleNamespace] = {}

    # -- shapes per layer ---------------------------------------------------------------------------------
    @classmethod
    def kv_layout_of(cls, reader, hp) -> list[LayerKV]:
        return LayerShapes.read(reader, hp).kv_layout(hp)

    def head_dim(self, il: int) -> int:
        return self.shapes.head_dim(il, self.hp)

    def kv_source(self, il: int) -> int:
        return self.shapes.kv_source(il)

    def kv_layout(self) -> list[LayerKV]:
        return self.shapes.kv_layout(self.hp)

    def layer_window(self, il: int) -> int:
        return self.sliding_window if self.local[il] else 0

    def attention_scale(self) -> float:
        return 1.0

    def layer_rope(self, il: int) -> tuple[float, float]:
        return (self.local_rope_base, 1.0) if self.local[il] else (self.hp.rope_base, self.hp.rope_freq_scale)

    def layer_n_rot(self, il: int) -> int:
        return self.n_rot_local if self.local[il] else self.hp.n_rot

    def rope_divisors(self, il: int):
        """Global layers only: rope_freqs.weight's first n_rot/2 entries (the file holds head_dim/2)."""
        if self.local[il] or "rope_freqs.weight" not in self.w:
            return None
        if self._global_divisors is None:
            self._global_divisors = np.ascontiguousarray(self.w["rope_freqs.weight"][: self.hp.n_rot // 2])
        return self._global_divisors

    # -- tensors ------------------------------------------------------------------------------------------
    def tensor_specs(self) -> list[TensorSpec]:
        hp, e = self.hp, self.hp.n_embd
        specs = [
            TensorSpec("token_embd.weight", (e, hp.n_vocab), gathered=not self.ties_output()),
            TensorSpec("output_norm.weight", (e,), vector=True),
            TensorSpec("output.weight", (e, hp.n_vocab), optional=True),
            TensorSpec("rope_freqs.weight", (hp.head_dim // 2,), optional=True, vector=True),
        ]
        if self.n_ple:
            width = self.n_ple * hp.n_layer
            specs += [
                TensorSpec("per_layer_token_embd.weight", (width, hp.n_vocab), gathered=True),
                TensorSpec("per_layer_model_proj.weight", (e, width)),
                TensorSpec("per_layer_proj_norm.weight", (self.n_ple,), vector=True),
            ]
        for il in range(hp.n_layer):
            specs += self.block_specs(il)
        return specs

    def block_specs(self, il: int) -> list[TensorSpec]:
        hp, p, e, d, f = self.hp, f"blk.{il}.", self.hp.n_embd, self.head_dim(il), self.n_ff[il]
        q_out, kv_out = hp.n_head * d, hp.n_head_kv * d
        specs = [
            TensorSpec(p + "attn_norm.weight", (e,), vector=True),
            TensorSpec(p + "attn_q.weight", (e, q_out)),
            TensorSpec(p + "attn_q_norm.weight", (d,), vector=True),
            TensorSpec(p + "attn_output.weight", (q_out, e)),
            TensorSpec(p + "post_attention_norm.weight", (e,), vector=True),
            TensorSpec(p + "ffn_norm.weight", (e,), vector=True),
            TensorSpec(p + "ffn_gate.weight", (e, f)),
            TensorSpec(p + "ffn_up.weight", (e, f)),
            TensorSpec(p + "ffn_down.weight", (f, e)),
            TensorSpec(p + "post_ffw_norm.weight", (e,), vector=True),
            TensorSpec(p + "layer_output_scale.weight", (1,), optional=True, vector=True),
        ]
        if self.kv_source(il) == il:
            specs += [
                TensorSpec(p + "attn_k.weight", (e, kv_out)),
                TensorSpec(p + "attn_v.weight", (e, kv_out), optional=True),  # absent: V is K's projection
                TensorSpec(p + "attn_k_norm.weight", (d,), vector=True),
            ]
        if self.n_ple:
            specs += [
                TensorSpec(p + "inp_gate.weight", (e, self.n_ple)),
                TensorSpec(p + "proj.weight", (self.n_ple, e)),
                TensorSpec(p + "post_norm.weight", (e,), vector=True),
            ]
        if self.moe_layers[il]:
            specs += self.moe.specs(il, e, self.file_tensors) + [
                TensorSpec(p + "ffn_gate_inp.scale", (e,), vector=True),
                TensorSpec(p + "pre_ffw_norm_2.weight", (e,), vector=True),
                TensorSpec(p + "post_ffw_norm_1.weight", (e,), vector=True),
                TensorSpec(p + "post_ffw_norm_2.weight", (e,), vector=True),
            ]
        return specs

    # -- the forward pass ---------------------------------------------------------------------------------
    def _extra_buffers(self, n_tokens: int) -> dict:
        """Per-step arrays beyond Buffers: the per-layer inputs [T, n_layer * P], their embedding part,
        layer il's inputs [T, P] and its gate [T, P]; the rows of layer il in the per-layer inputs seen
        as [T * n_layer, P]; the expert layers' input and output [T, E]."""
        extra = self._extra.get(n_tokens)
        if extra is None:
            if len(self._extra) > 6:
                self._extra.clear()
            hp, ops, width = self.hp, self.ops, self.n_ple * self.hp.n_layer
            extra = self._extra[n_tokens] = {
                "inputs": ops.alloc((n_tokens, width)) if self.n_ple else None,
                "embedded": ops.alloc((n_tokens, width)) if self.n_ple else None,
                "layer": ops.alloc((n_tokens, self.n_ple)) if self.n_ple else None,
                "gate": ops.alloc((n_tokens, self.n_ple)) if self.n_ple else None,
                "rows": (np.arange(n_tokens, dtype=np.int32)[None, :] * hp.n_layer
                         + np.arange(hp.n_layer, dtype=np.int32)[:, None]),
                "moe_in": ops.alloc((n_tokens, hp.n_embd)) if self.moe else None,  # the experts' input
                "routed": ops.alloc((n_tokens, hp.n_embd)) if self.moe else None,  # the router's, then their output
            }
            if self.n_ple:
                extra["inputs_by_layer"] = extra["inputs"].reshape(-1, self.n_ple)  # [T * n_layer, P]
        return extra

    def embed(self, tokens: np.ndarray, b: Buffers) -> None:
        ops, w, hp = self.ops, self.w, self.hp
        super().embed(tokens, b)
        ops.scale(b.x, math.sqrt(hp.n_embd), b.x)
        if not self.n_ple:
            return
        extra = self._extra_buffers(b.n_tokens)
        inputs, embedded = extra["inputs"], extra["embedded"]
        ops.embed(w["per_layer_token_embd.weight"], tokens, embedded)
        ops.scale(embedded, math.sqrt(self.n_ple), embedded)
        self.linear(b, w["per_layer_model_proj.weight"], b.x, inputs)
        ops.scale(inputs, 1.0 / math.sqrt(hp.n_embd), inputs)
        ops.rms_norm(inputs, w["per_layer_proj_norm.weight"], hp.eps, inputs)  # per layer: P at a time
        ops.add(inputs, embedded, inputs)
        ops.scale(inputs, 1.0 / math.sqrt(2.0), inputs)

    def _layer(self, il: int) -> SimpleNamespace:
        """Layer il's weights and settings, looked up once (a decode step walks every layer)."""
        plan = self._plans.get(il)
        if plan is None:
            w, p, hp = self.w, f"blk.{il}.", self.hp
            scale = w.get(p + "layer_output_scale.weight")
            plan = self._plans[il] = SimpleNamespace(
                **{name: w.get(p + name + ".weight") for name in (
                    "attn_norm", "attn_q", "attn_q_norm", "attn_k", "attn_v", "attn_k_norm", "attn_output",
                    "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm",
                    "inp_gate", "proj", "post_norm", "ffn_gate_inp", "pre_ffw_norm_2", "post_ffw_norm_1",
                    "post_ffw_norm_2")},
                # the router's input norm: rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale, as one weight
                router_norm=(w[p + "ffn_gate_inp.scale"] / np.float32(math.sqrt(hp.n_embd))).astype(np.float32)
                if self.moe_layers[il] else None,
                has_kv=self.kv_source(il) == il, window=self.layer_window(il),
                ones=np.ones(self.head_dim(il), np.float32),
                output_scale=None if scale is None else float(scale[0]))
        return plan

    def block(self, il: int, b: Buffers, start: int, cache: KVCache) -> None:
        ops, eps, layer = self.ops, self.hp.eps, self._layer(il)
        views = self._views(b, il)
        ops.rms_norm(b.x, layer.attn_norm, eps, b.h)
        self._attention(il, layer, views, b, start, cache)
        ops.rms_norm(b.o, layer.post_attention_norm, eps, b.o)
        ops.add(b.x, b.o, b.x)
        ops.rms_norm(b.x, layer.ffn_norm, eps, b.h)
        gate, up = views["gate"], views["up"]
        self.linear(b, layer.ffn_gate, b.h, gate)
        self.linear(b, layer.ffn_up, b.h, up)
        ops.gated_act(gate, up, gate, self.ACTIVATION)
        self.linear(b, layer.ffn_down, gate, b.o)
        if self.moe_layers[il]:
            self._add_experts(il, layer, b)
        ops.rms_norm(b.o, layer.post_ffw_norm, eps, b.o)
        ops.add(b.x, b.o, b.x)
        if self.n_ple:
            self._per_layer_input(il, layer, b)
        if layer.output_scale is not None:
            ops.scale(b.x, layer.output_scale, b.x)

    def _add_experts(self, il: int, layer: SimpleNamespace, b: Buffers) -> None:
        """b.o (the dense feed-forward's output) <- post_ffw_norm_1(b.o) + post_ffw_norm_2(experts(
        pre_ffw_norm_2(x))), the experts routed by the scores of rms_norm(x) / sqrt(n_embd) * scale."""
        ops, eps = self.ops, self.hp.eps
        extra = self._extra_buffers(b.n_tokens)
        moe_in, routed = extra["moe_in"], extra["routed"]
        ops.rms_norm(b.o, layer.post_ffw_norm_1, eps, b.o)
        ops.rms_norm(b.x, layer.pre_ffw_norm_2, eps, moe_in)
        ops.rms_norm(b.x, layer.router_norm, eps, routed)  # the router's input, in `routed` until it is used
        scores = self._expert_buffers().for_rows(b.n_tokens)[0]
        self.linear(b, layer.ffn_gate_inp, routed, scores)
        self.routed_experts(il, b, moe_in, scores, routed)
        ops.rms_norm(routed, layer.post_ffw_norm_2, eps, routed)
        ops.add(b.o, routed, b.o)

    def _per_layer_input(self, il: int, layer: SimpleNamespace, b: Buffers) -> None:
        """x += post_norm(proj(gelu(inp_gate(x)) * the per-layer inputs of layer il))."""
        ops = self.ops
        extra = self._extra_buffers(b.n_tokens)
        gate, inputs = extra["gate"], extra["layer"]
        ops.take_rows(extra["inputs_by_layer"], extra["rows"][il], inputs)
        self.linear(b, layer.inp_gate, b.x, gate)
        ops.gated_act(gate, inputs, gate, self.ACTIVATION)
        self.linear(b, layer.proj, gate, b.o)
        ops.rms_norm(b.o, layer.post_norm, self.hp.eps, b.o)
        ops.add(b.x, b.o, b.x)

    def _views(self, b: Buffers, il: int) -> dict:
        """Layer il's views of b's buffers in its own head size and feed-forward length, made once per
        Buffers object and row count (Buffers.head copies the attribute: the row count tells them apart)."""
        views = vars(b).setdefault("_gemma4_views", {})
        key = (b.n_tokens, il)
        found = views.get(key)
        if found is None:
            hp, t, d, f = self.hp, b.n_tokens, self.head_dim(il), self.n_ff[il]
            q, k, v = _rows(b.q, t, hp.n_head, d), _rows(b.k, t, hp.n_head_kv, d), _rows(b.v, t, hp.n_head_kv, d)
            attn = _rows(b.attn, t, hp.n_head, d)
            found = views[key] = {"q": q, "q2": q.reshape(t, -1), "k": k, "k2": k.reshape(t, -1), "v": v,
                                  "v2": v.reshape(t, -1), "attn": attn, "attn2": attn.reshape(t, -1),
                                  "gate": _rows(b.gate, t, f), "up": _rows(b.up, t, f)}
        return found

    def _attention(self, il: int, layer: SimpleNamespace, views: dict, b: Buffers, start: int, cache: KVCache) -> None:
        """b.o <- attention(b.h) for layer il, in its own head size; K and V stored unless shared."""
        ops, eps = self.ops, self.hp.eps
        q = views["q"]
        self.linear(b, layer.attn_q, b.h, views["q2"])
        ops.rms_norm(q, layer.attn_q_norm, eps, q)
        self.rotate(il, b, q)
        if layer.has_kv:
            k, v = views["k"], views["v"]
            self.linear(b, layer.attn_k, b.h, views["k2"])
            if layer.attn_v is not None:
                self.linear(b, layer.attn_v, b.h, views["v2"])
            else:
                ops.scale(k, 1.0, v)  # V is K's projection, before K's norm and rotation
            ops.rms_norm(k, layer.attn_k_norm, eps, k)
            ops.rms_norm(v, layer.ones, eps, v)
            self.rotate(il, b, k)
            cache.store(ops, il, k, v, start)
        cache.attend(ops, il, q, start, 1.0, layer.window, views["attn"])  # unscaled scores
        self.linear(b, layer.attn_output, views["attn2"], b.o)

    def finish_logits(self, logits) -> None:
        if self.final_softcap:
            self.ops.softcap(logits, self.final_softcap, logits)
