"""Mixture-of-experts feed-forward, as llama.cpp builds it (src/llama-graph.cpp, build_moe_ffn).

Per token: a router (`ffn_gate_inp`, [n_expert, E]) scores the experts; the probabilities (softmax or
sigmoid of the scores) pick the top k; each chosen expert runs its own gated feed-forward (slices of
`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`: n_expert matrices stored one after another), and the
outputs are summed, each times its probability (renormalised over the k where the family does so).
A shared expert (Qwen2-MoE) runs for every token and is added last, times sigmoid(ffn_gate_inp_shexp . x).

The routing is decided on the host (a few numbers per token); the products go through the backend's
`matmul_experts`, which reads only the chosen experts' rows, each expert once per step for all the rows
routed to it, and `combine_experts`, which sums in llama.cpp's order. Every row is computed as it would be
alone, so a server step gives each sequence what it gets on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..backends.base import Backend
from ..errors import GGUFError
from .hparams import MAX_WIDTH, read_count
from .weights import TensorSpec

WEIGHT_SUM_FLOOR = 6.103515625e-5  # llama.cpp clamps the sum of the k weights to the smallest normal float16


@dataclass(frozen=True)
class MoEParams:
    n_expert: int
    n_used: int  # experts per token (k)
    n_ff: int  # each expert's feed-forward length
    n_ff_shared: int  # the shared expert's feed-forward length (0: no shared expert)
    gating: str  # "softmax" or "sigmoid" of the scores, or "softmax_weight": the top k of the raw scores,
    # weighted by the softmax over those k alone (gpt-oss)
    norm_weights: bool  # the k chosen probabilities divided by their sum

    @classmethod
    def from_reader(cls, reader, n_ff: int, *, gating: str = "softmax", norm_weights: bool = False,
                    shared: bool = False, ff_from_used: bool = False) -> Optional["MoEParams"]:
        """The file's expert settings (None: `expert_count` absent or 0, a dense model).

        n_ff: the file's feed_forward_length; an expert's length is `expert_feed_forward_length`, else
        n_ff / k (ff_from_used, Qwen's MoE families) or n_ff. shared: a shared expert of
        `expert_shared_feed_forward_length` (default n_ff)."""
        meta, key = reader.metadata, reader.arch_key
        n_expert = read_count(reader, "n_expert", 0)
        if n_expert == 0:
            return None
        n_used = meta.get_int(key("expert_used_count"), min=1, max=n_expert, per_layer=True)
        default_ff = n_ff // n_used if ff_from_used else n_ff
        ff_key = key("expert_feed_forward_length")
        n_ff_expert = meta.get_int(ff_key, default_ff, min=1, max=MAX_WIDTH, per_layer=True)
        if n_ff_expert < 1:
            meta.fail(ff_key, "gives experts no rows")
        n_ff_shared = meta.get_int(key("expert_shared_feed_forward_length"), n_ff, min=1, max=MAX_WIDTH) if shared else 0
        return cls(n_expert=n_expert, n_used=n_used, n_ff=n_ff_expert, n_ff_shared=n_ff_shared, gating=gating,
                   norm_weights=norm_weights)

    def specs(self, il: int, n_embd: int, file_tensors=frozenset(), router: bool = True) -> list[TensorSpec]:
        """Layer il's expert tensors: the router (unless the architecture scores experts its own way),
        gate and up (or one fused ffn_gate_up_exps, gate rows then up rows per expert, where the file has
        it), down, their optional per-expert scales (`ffn_*_exps.scale`, one float per expert), and the
        shared expert's."""
        p, f, n = f"blk.{il}.", self.n_ff, self.n_expert
        specs = [TensorSpec(p + "ffn_gate_inp.weight", (n_embd, n)),
                 TensorSpec(p + "ffn_gate_inp.bias", (n,), optional=True, vector=True)] if router else []
        if p + "ffn_gate_up_exps.weight" in file_tensors:
            specs.append(TensorSpec(p + "ffn_gate_up_exps.weight", (n_embd, 2 * f, n)))
        else:
            specs += [TensorSpec(p + "ffn_gate_exps.weight", (n_embd, f, n)), TensorSpec(p + "ffn_up_exps.weight", (n_embd, f, n))]
        specs.append(TensorSpec(p + "ffn_down_exps.weight", (f, n_embd, n)))
        specs += [TensorSpec(f"{p}ffn_{part}_exps.scale", (n,), optional=True, vector=True) for part in ("gate", "up", "down")]
        # per-expert biases (gpt-oss), expert e's at [e]: ggml shape [N, n_expert]
        specs += [TensorSpec(f"{p}ffn_{part}_exps.bias", (width, n), optional=True, vector=True)
                  for part, width in (("gate", f), ("up", f), ("down", n_embd))]
        if self.n_ff_shared:
            s = self.n_ff_shared
            specs += [
                TensorSpec(p + "ffn_gate_inp_shexp.weight", (n_embd,)),  # one row: the shared expert's gate
                TensorSpec(p + "ffn_gate_shexp.weight", (n_embd, s)),
                TensorSpec(p + "ffn_up_shexp.weight", (n_embd, s)),
                TensorSpec(p + "ffn_down_shexp.weight", (s, n_embd)),
            ]
        return specs


@dataclass
class Routes:
    """One step's routing, on the host. T tokens, k experts each, P = T * k (token, expert) pairs sorted by
    expert (stable: by token within an expert).

    pair_rows int32[P]: the token row of each sorted pair; groups int32[G]: the experts used, ascending;
    bounds int32[G+1]: their runs of sorted pairs; slots int32[T, k(+1)]: where pair (t, j) landed among
    the sorted pairs (a shared expert's column: its row after the P); weights float32[T, k(+1)]."""

    pair_rows: np.ndarray
    groups: np.ndarray
    bounds: np.ndarray
    slots: np.ndarray
    weights: np.ndarray


def expert_weights(scores: np.ndarray, moe: MoEParams) -> tuple[np.ndarray, np.ndarray]:
    """(chosen int32[T, k], weights float32[T, k]) from the router's scores float32[T, n_expert]: the k
    most probable experts in descending order, and their probabilities as llama.cpp weights them."""
    scores = np.asarray(scores, dtype=np.float32)
    if moe.gating == "sigmoid":
        probs = np.float32(1.0) / (np.float32(1.0) + np.exp(-scores))
    elif moe.gating == "softmax_weight":
        probs = scores
    else:
        probs = _softmax(scores)
    chosen = np.argsort(-probs, axis=1, kind="stable")[:, : moe.n_used].astype(np.int32)
    weights = np.take_along_axis(probs, chosen, axis=1)
    if moe.gating == "softmax_weight":
        weights = _softmax(weights)
    if moe.norm_weights:
        weights = weights / np.maximum(weights.sum(axis=1, keepdims=True), np.float32(WEIGHT_SUM_FLOOR))
    return chosen, weights.astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    """Softmax of each row of float32 x, as ggml_soft_max: the exps' sum in float64, then one float32
    reciprocal multiplied in."""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e * (np.float32(1.0) / e.sum(axis=1, dtype=np.float64, keepdims=True)).astype(np.float32)


def group_by_expert(chosen: np.ndarray, weights: np.ndarray, n_expert: int, shared: Optional[np.ndarray] = None) -> Routes:
    """Routes for chosen/weights [T, k]; shared float32[T]: a shared expert's weight per token, whose
    output rows follow the P routed ones."""
    t, k = chosen.shape
    flat = chosen.reshape(-1)
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=n_expert)
    groups = np.flatnonzero(counts).astype(np.int32)
    bounds = np.zeros(len(groups) + 1, dtype=np.int32)
    np.cumsum(counts[groups], out=bounds[1:])
    slots = np.empty(t * k, dtype=np.int32)
    slots[order] = np.arange(t * k, dtype=np.int32)
    slots = slots.reshape(t, k)
    if shared is not None:
        slots = np.concatenate([slots, (t * k + np.arange(t, dtype=np.int32))[:, None]], axis=1)
        weights = np.concatenate([weights, shared.astype(np.float32)[:, None]], axis=1)
    return Routes((order // k).astype(np.int32), groups, bounds, np.ascontiguousarray(slots),
                  np.ascontiguousarray(weights, dtype=np.float32))


class ExpertBuffers:
    """The MoE feed-forward's activations for up to `rows` tokens, allocated with the backend's alloc and
    grown on demand (a decode step allocates nothing): scores [T, n_expert], the routed rows xs [P, E],
    gate and up [P, n_ff], the expert outputs down [P + T, E] (the shared expert's after the P), and the
    shared expert's score [T, 1], gate and up [T, n_ff_shared]. xs and down share their memory: xs is read
    only by the gate and up products, which are done before the down product writes (a 512-token prompt
    of Qwen3-30B-A3B: 32 MiB less)."""

    def __init__(self, ops: Backend, moe: MoEParams, n_embd: int):
        self.ops, self.moe, self.n_embd = ops, moe, n_embd
        self.rows = 0

    def gate_up_rows(self, t: int):
        """[P, 2 * n_ff] for a fused gate-and-up product of t tokens' pairs."""
        return self.gate_up[: t * self.moe.n_used]

    def for_rows(self, t: int):
        if t > self.rows:
            self._grow(max(t, 8))
        p = t * self.moe.n_used
        shared = self.moe.n_ff_shared > 0
        if not shared:
            return self.scores[:t], self.xs[:p], self.gate[:p], self.up[:p], self.down[:p], None, None, None
        return (self.scores[:t], self.xs[:p], self.gate[:p], self.up[:p], self.down[: p + t], self.shared_score[:t],
                self.shared_gate[:t], self.shared_up[:t])

    def _grow(self, t: int) -> None:
        ops, moe, e = self.ops, self.moe, self.n_embd
        p = t * moe.n_used
        self.scores = ops.alloc((t, moe.n_expert))
        self.down = ops.alloc((p + t, e))
        self.xs = self.down[:p]
        self.gate_up = ops.alloc((p, 2 * moe.n_ff))  # a fused gate-and-up product's rows
        self.gate = ops.alloc((p, moe.n_ff))
        self.up = ops.alloc((p, moe.n_ff))
        if moe.n_ff_shared:
            self.shared_score = ops.alloc((t, 1))
            self.shared_gate = ops.alloc((t, moe.n_ff_shared))
            self.shared_up = ops.alloc((t, moe.n_ff_shared))
        self.rows = t


class MixtureOfExperts:
    """A Decoder mixin: the feed-forward of every layer is routed experts when the file has experts
    (`expert_count` > 0), else the dense one. An architecture sets how its router weighs experts:
    MOE_GATING, MOE_NORM_WEIGHTS, MOE_SHARED (a shared expert) and MOE_FF_FROM_USED (see MoEParams)."""

    MOE_GATING = "softmax"
    MOE_NORM_WEIGHTS = False
    MOE_SHARED = False
    MOE_FF_FROM_USED = False
    MOE_ONLY = True  # False: the architecture also has dense files (llama: Mixtral has experts)
    moe: Optional[MoEParams] = None

    def read_extra(self, reader) -> None:
        super().read_extra(reader)
        self.moe = MoEParams.from_reader(reader, self.hp.n_ff, gating=self.MOE_GATING, norm_weights=self.MOE_NORM_WEIGHTS,
                                         shared=self.MOE_SHARED, ff_from_used=self.MOE_FF_FROM_USED)
        self.require_experts(reader)

    def require_experts(self, reader) -> None:
        """An architecture that only exists with experts refuses a file without them."""
        if self.moe is None and self.MOE_ONLY:
            raise GGUFError(reader.path, reader.arch_key("expert_count"), None,
                            "must be > 0 for this architecture (a mixture of experts)")

    def ffn_specs(self, il: int) -> list[TensorSpec]:
        if self.moe is None:
            return super().ffn_specs(il)
        return self.moe.specs(il, self.hp.n_embd, self.file_tensors)

    def feed_forward(self, il: int, b, x=None) -> None:
        """b.o <- the routed experts' weighted sum (plus the shared expert) of x (b.h unless given)."""
        if self.moe is None:
            super().feed_forward(il, b, x)
            return
        x = b.h if x is None else x
        scores = self._expert_buffers().for_rows(b.n_tokens)[0]
        p = f"blk.{il}."
        self.linear(b, self.w[p + "ffn_gate_inp.weight"], x, scores, self.w.get(p + "ffn_gate_inp.bias"))
        self.routed_experts(il, b, x, scores, b.o)

    def routed_experts(self, il: int, b, x, scores, out) -> None:
        """out <- the experts' weighted sum (plus the shared expert) of x [T, E], routed by the router's
        scores [T, n_expert] (computed by the caller: an architecture may score experts its own way)."""
        moe, ops, w, p = self.moe, self.ops, self.w, f"blk.{il}."
        _, xs, gate, up, down, shared_score, shared_gate, shared_up = self._expert_buffers().for_rows(b.n_tokens)
        chosen, weights = expert_weights(ops.to_host(scores), moe)
        down_scale = w.get(p + "ffn_down_exps.scale")
        if down_scale is not None:  # llama.cpp scales each expert's output; here, its weight in the sum
            weights = weights * down_scale[chosen]
        shared = None
        if moe.n_ff_shared:
            self.linear(b, w[p + "ffn_gate_inp_shexp.weight"], x, shared_score)
            shared = np.float32(1.0) / (np.float32(1.0) + np.exp(-ops.to_host(shared_score)[:, 0]))
        routes = group_by_expert(chosen, weights, moe.n_expert, shared)
        groups, bounds = routes.groups, routes.bounds
        ops.take_rows(x, routes.pair_rows, xs)
        fused = w.get(p + "ffn_gate_up_exps.weight")
        if fused is not None:  # one product, gate rows then up rows of each expert
            gate_up = self._expert_buffers().gate_up_rows(b.n_tokens)
            ops.matmul_experts(fused, xs, groups, bounds, gate_up)
            gate, up = gate_up[:, : moe.n_ff], gate_up[:, moe.n_ff :]
        else:
            ops.matmul_experts(w[p + "ffn_gate_exps.weight"], xs, groups, bounds, gate, self._expert_bias(p + "ffn_gate_exps"))
            ops.matmul_experts(w[p + "ffn_up_exps.weight"], xs, groups, bounds, up, self._expert_bias(p + "ffn_up_exps"))
        self._scale_by_expert(w.get(p + "ffn_gate_exps.scale"), gate, routes)
        self._scale_by_expert(w.get(p + "ffn_up_exps.scale"), up, routes)
        ops.gated_act(gate, up, gate, self.ACTIVATION)
        n_pairs = xs.shape[0]
        ops.matmul_experts(w[p + "ffn_down_exps.weight"], gate, groups, bounds, down[:n_pairs],
                           self._expert_bias(p + "ffn_down_exps"))
        if shared is not None:
            self.linear(b, w[p + "ffn_gate_shexp.weight"], x, shared_gate)
            self.linear(b, w[p + "ffn_up_shexp.weight"], x, shared_up)
            ops.gated_act(shared_gate, shared_up, shared_gate, self.ACTIVATION)
            self.linear(b, w[p + "ffn_down_shexp.weight"], shared_gate, down[n_pairs:])
        ops.combine_experts(down, routes.slots, routes.weights, out)

    def _expert_bias(self, name: str):
        """The per-expert biases of expert tensor `name` as float32[n_expert, N], or None."""
        bias = self.w.get(name + ".bias")
        return None if bias is None else bias.reshape(self.moe.n_expert, -1)

    def _scale_by_expert(self, scale, rows, routes: Routes) -> None:
        """rows[a:b] *= scale[e] for each expert e's group (a per-expert scale of its product), if any."""
        if scale is None:
            return
        for g, e in enumerate(routes.groups):
            a, z = int(routes.bounds[g]), int(routes.bounds[g + 1])
            self.ops.scale(rows[a:z], float(scale[e]), rows[a:z])

    def _expert_buffers(self) -> ExpertBuffers:
        buffers = getattr(self, "_moe_buffers", None)
        if buffers is None:
            buffers = self._moe_buffers = ExpertBuffers(self.ops, self.moe, self.hp.n_embd)
        return buffers
