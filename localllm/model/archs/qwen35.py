"""Qwen3.5 (`general.architecture = qwen35`): attention layers between gated delta nets.

As llama.cpp's src/models/qwen35.cpp and delta-net-base.cpp compute it:
- Pre-norm blocks; the feed-forward's norm is `post_attention_norm`; a SwiGLU feed-forward.
- Which layers are delta nets: `attention.recurrent_layers` (a flag per layer) when present, else all but
  every `full_attention_interval`-th (default 4: layers 3, 7, 11, ... attend).
- Attention layers: `attn_q` gives each head's queries and then its output gate (`2 * head_dim` rows a
  head); per-head Q/K RMS norms; RoPE on the first `rope.dimension_count` dims of each head, NeoX
  pairing. The file's `rope.dimension_sections` interleave the three position components of Qwen's
  multimodal RoPE (llama.cpp's IMROPE); for text the three are the token's position, so a dim rotates as
  in plain RoPE unless no section covers it (it then reads the fourth component, 0: no rotation).
  The attention's output is multiplied by sigmoid(gate) before `attn_output`.
- Delta-net layers (`ssm.*`: Hk = `group_count` key heads and Hv = `time_step_rank` value heads, all
  `state_size` = S wide, `inner_size` = Hv * S, a convolution `conv_kernel` long):
  `attn_qkv` -> q [Hk S], k [Hk S], v [Hv S] through a causal convolution over time (`ssm_conv1d`,
  one filter per channel) and SiLU; q and k L2-normalised per head (rms_norm with eps / S, times
  1 / sqrt(S)); the decay g = softplus(x ssm_alpha + ssm_dt.bias) * ssm_a (ssm_a = -exp(A_log) in the
  file) and the write strength beta = sigmoid(x ssm_beta), per value head; the gated delta rule
  (Backend.delta_net); each head's output RMS-normed (`ssm_norm`) times SiLU(x attn_gate), then `ssm_out`.
- The delta nets' memory is a window of the convolution's last K - 1 inputs and a state [Hv, S, S] per
  layer (model/recurrent.py): the KV cache holds K and V for the attention layers only.
- Multi-token prediction layers (`nextn_predict_layers` of them after the trunk, counted in `block_count`)
  are not run (llama.cpp runs them only as a draft model): HParams.n_layer is the trunk's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...errors import GGUFError
from ..decoder import Decoder
from ..kv_cache import LayerKV
from ..hparams import MAX_HEADS, MAX_WIDTH
from ..recurrent import LayerState
from ..weights import TensorSpec

DEFAULT_FULL_ATTENTION_INTERVAL = 4  # llama.cpp's when the file names neither key


@dataclass(frozen=True)
class DeltaNetShape:
    """The delta nets' sizes and which layers they are, from the file's metadata."""

    recurrent: tuple  # per layer: a delta net (True) or attention
    conv_kernel: int
    n_k: int  # key heads (ssm.group_count)
    n_v: int  # value heads (ssm.time_step_rank)
    size: int  # S: every head's width (ssm.state_size)

    @property
    def key_dim(self) -> int:
        return self.n_k * self.size

    @property
    def value_dim(self) -> int:
        return self.n_v * self.size

    @classmethod
    def read(cls, reader, n_layer: int) -> "DeltaNetShape":
        meta, key = reader.metadata, reader.arch_key
        flags = meta.get(key("attention.recurrent_layers"))
        if flags is not None:  # one flag per block, the prediction layers after the trunk's included
            flags = meta.get_array(key("attention.recurrent_layers"), "int", min=0, max=1)
            if len(flags) < n_layer:
                meta.fail(key("attention.recurrent_layers"), f"has {len(flags)} entries, expected one per layer ({n_layer})")
            recurrent = tuple(bool(f) for f in flags[:n_layer])
        else:
            interval = meta.get_int(key("full_attention_interval"), DEFAULT_FULL_ATTENTION_INTERVAL, min=1, max=n_layer + 1)
            recurrent = tuple((il + 1) % interval != 0 for il in range(n_layer))
        shape = cls(recurrent, meta.get_int(key("ssm.conv_kernel"), min=2, max=64),
                    meta.get_int(key("ssm.group_count"), min=1, max=MAX_HEADS),
                    meta.get_int(key("ssm.time_step_rank"), min=1, max=MAX_HEADS),
                    meta.get_int(key("ssm.state_size"), min=1, max=4096))
        inner = meta.get_int(key("ssm.inner_size"), min=1, max=MAX_WIDTH)
        if shape.n_v % shape.n_k:
            raise GGUFError(reader.path, key("ssm.time_step_rank"), None,
                            f"{shape.n_v} value heads are not a multiple of {shape.n_k} key heads (ssm.group_count)")
        if inner != shape.value_dim:
            raise GGUFError(reader.path, key("ssm.inner_size"), None,
                            f"is {inner}, expected ssm.time_step_rank x ssm.state_size = {shape.value_dim}")
        return shape

    def layout(self, hp) -> list:
        """Decoder.kv_layout: K and V for attention layers; for a delta net the convolution's windows
        over q, k and v's inputs, then its state [Hv, S, S] (the order Qwen35.delta_net reads them)."""
        k = self.conv_kernel - 1
        state = LayerState(((k, self.key_dim), (k, self.key_dim), (k, self.value_dim), (self.n_v, self.size, self.size)))
        return [state if r else LayerKV(hp.n_head_kv, hp.head_dim, il) for il, r in enumerate(self.recurrent)]


class HybridBuffers:
    """A step's activations for up to `rows` tokens beside the Decoder's, grown on demand (a decode step
    allocates nothing): a delta net's projections before and after the convolution, its output gate z
    and its output; an attention layer's output gate."""

    def __init__(self, ops, shape: DeltaNetShape, attention_width: int):
        self.ops, self.shape, self.attention_width, self.rows = ops, shape, attention_width, 0

    def for_rows(self, t: int) -> dict:
        if t > self.rows:
            s, alloc = self.shape, self.ops.alloc
            n = max(t, 8)
            self.arrays = {
                "q_in": alloc((n, s.key_dim)), "k_in": alloc((n, s.key_dim)), "v_in": alloc((n, s.value_dim)),
                "q": alloc((n, s.n_k, s.size)), "k": alloc((n, s.n_k, s.size)), "v": alloc((n, s.n_v, s.size)),
                "z": alloc((n, s.value_dim)), "alpha": alloc((n, s.n_v)), "beta": alloc((n, s.n_v)),
                "out": alloc((n, s.n_v, s.size)), "gate": alloc((n, self.attention_width)),
            }
            self.rows = n
        return {name: a[:t] for name, a in self.arrays.items()}


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)) in float32, x itself above 20 (ggml_softplus)."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


class Qwen35(Decoder):
    ROPE_NEOX = True
    QK_NORM = True
    FFN_NORM = "post_attention_norm"
    DELTA_NET_GROUPED = False  # value head h reads key head h % Hk (True: h // (Hv / Hk), Backend.delta_net)

    def read_extra(self, reader) -> None:
        super().read_extra(reader)
        self.dn = DeltaNetShape.read(reader, self.hp.n_layer)
        self.rope_unrotated = self._rope_unrotated(reader)
        self._step_buffers: Optional[HybridBuffers] = None

    def _rope_unrotated(self, reader) -> Optional[np.ndarray]:
        """RoPE frequency divisors that leave unrotated the dims no section of `rope.dimension_sections`
        covers (inf: angle 0), as llama.cpp's interleaved M-RoPE does for text; None when all rotate."""
        key = reader.arch_key("rope.dimension_sections")
        if key not in reader.metadata:
            return None
        sections = list(reader.metadata.get_array(key, "int", min=0, max=MAX_WIDTH)) + [0, 0, 0, 0]
        t, h, w, e = (int(v) for v in sections[:4])
        total = t + h + w + e
        if total <= 0:
            reader.metadata.fail(key, "has no dims")
        pairs = self.hp.n_rot // 2
        divisors = np.ones(pairs, dtype=np.float32)
        for i in range(pairs):
            sector = i % total
            covered = ((sector % 3 == 0 and sector < 3 * t) or (sector % 3 == 1 and sector < 3 * h)
                       or (sector % 3 == 2 and sector < 3 * w))
            if not covered:
                divisors[i] = np.inf
        return None if np.isfinite(divisors).all() else divisors

    def rope_divisors(self, il: int):
        return self.rope_unrotated

    def kv_layout(self) -> list:
        return self.dn.layout(self.hp)

    @classmethod
    def kv_layout_of(cls, reader, hp) -> list:
        return DeltaNetShape.read(reader, hp.n_layer).layout(hp)

    # -- tensors --------------------------------------------------------------------------------------
    def block_specs(self, il: int) -> list[TensorSpec]:
        if self.dn.recurrent[il]:
            return self._delta_net_specs(il)
        hp, p = self.hp, f"blk.{il}."
        specs = [s for s in super().block_specs(il) if s.name != p + "attn_q.weight"]
        q_rows = hp.n_head * hp.head_dim
        # attn_q holds, per head, head_dim query rows then head_dim gate rows: each part a Weight of its own
        fused = dict(fused=p + "attn_q.weight", fused_shape=(hp.n_embd, 2 * q_rows), row_groups=(2 * hp.head_dim, hp.head_dim))
        return specs + [TensorSpec(p + "attn_q.weight", (hp.n_embd, q_rows), first_row=0, **fused),
                        TensorSpec(p + "attn_q_gate.weight", (hp.n_embd, q_rows), first_row=hp.head_dim, **fused)]

    def qkv_specs(self, il: int) -> list[TensorSpec]:
        hp, p = self.hp, f"blk.{il}."
        kv = hp.n_head_kv * hp.head_dim
        return [TensorSpec(p + "attn_q.weight", (hp.n_embd, hp.n_head * hp.head_dim)),  # replaced in block_specs
                TensorSpec(p + "attn_k.weight", (hp.n_embd, kv)), TensorSpec(p + "attn_v.weight", (hp.n_embd, kv))]

    def delta_net_projections(self, il: int) -> list[TensorSpec]:
        """The delta net's input projections, as the model reads them: attn_qkv.q, .k, .v (row ranges of
        attn_qkv), attn_gate.weight (z), ssm_alpha.weight and ssm_beta.weight."""
        hp, dn, p = self.hp, self.dn, f"blk.{il}."
        qkv = dict(fused=p + "attn_qkv.weight", fused_shape=(hp.n_embd, 2 * dn.key_dim + dn.value_dim))
        return [
            TensorSpec(p + "attn_qkv.q", (hp.n_embd, dn.key_dim), first_row=0, **qkv),
            TensorSpec(p + "attn_qkv.k", (hp.n_embd, dn.key_dim), first_row=dn.key_dim, **qkv),
            TensorSpec(p + "attn_qkv.v", (hp.n_embd, dn.value_dim), first_row=2 * dn.key_dim, **qkv),
            TensorSpec(p + "attn_gate.weight", (hp.n_embd, dn.value_dim)),
            TensorSpec(p + "ssm_alpha.weight", (hp.n_embd, dn.n_v)),
            TensorSpec(p + "ssm_beta.weight", (hp.n_embd, dn.n_v)),
        ]

    def _delta_net_specs(self, il: int) -> list[TensorSpec]:
        hp, dn, p = self.hp, self.dn, f"blk.{il}."
        conv_dim = 2 * dn.key_dim + dn.value_dim
        return [
            TensorSpec(p + "attn_norm.weight", (hp.n_embd,), vector=True),
            *self.delta_net_projections(il),
            TensorSpec(p + "ssm_conv1d.weight", (dn.conv_kernel, conv_dim), vector=True),
            TensorSpec(p + "ssm_dt.bias", (dn.n_v,), vector=True),
            TensorSpec(p + "ssm_a", (dn.n_v,), vector=True),
            TensorSpec(p + "ssm_norm.weight", (dn.size,), vector=True),
            TensorSpec(p + "ssm_out.weight", (dn.value_dim, hp.n_embd)),
            TensorSpec(p + self.FFN_NORM + ".weight", (hp.n_embd,), vector=True),
            *self.ffn_specs(il),
        ]

    # -- the forward pass -----------------------------------------------------------------------------
    def attention(self, il: int, b, start: int, cache, x=None) -> None:
        if self.dn.recurrent[il]:
            self.delta_net(il, b, cache, b.h if x is None else x)
        else:
            super().attention(il, b, start, cache, x)

    def step_buffers(self, t: int) -> dict:
        if self._step_buffers is None:
            self._step_buffers = HybridBuffers(self.ops, self.dn, self.hp.n_head * self.hp.head_dim)
            self._unit = np.ones(self.dn.size, dtype=np.float32)  # the L2 norm's rms_norm weight
        return self._step_buffers.for_rows(t)

    def gate_attention(self, il: int, b, x) -> None:
        """b.attn *= sigmoid(x attn_q_gate), per head and dim."""
        t = b.n_tokens
        gate = self.step_buffers(t)["gate"]
        self.linear(b, self.w[f"blk.{il}.attn_q_gate.weight"], x, gate)
        attn = b.attn.reshape(t, -1)
        self.ops.gated_act(gate, attn, attn, "sigmoid")

    def delta_net(self, il: int, b, cache, x) -> None:
        """b.o <- the gated delta net of layer il over x [T, E] (module docstring); its window and state
        in the cache carried forward."""
        ops, w, dn, p, eps = self.ops, self.w, self.dn, f"blk.{il}.", self.hp.eps
        t = b.n_tokens
        a = self.step_buffers(t)
        conv_w = w[p + "ssm_conv1d.weight"].reshape(-1, dn.conv_kernel)  # [q | k | v channels, K]
        firsts = (0, dn.key_dim, 2 * dn.key_dim, 2 * dn.key_dim + dn.value_dim)
        # each sequence's rows (one in a single-sequence step) carry their own windows and state
        segments = cache.recurrent_segments(il, t)
        for part, name in enumerate(("q", "k", "v")):
            self.linear(b, w[p + "attn_qkv." + name], x, a[name + "_in"])
            out, weight = a[name].reshape(t, -1), conv_w[firsts[part] : firsts[part + 1]]
            for r0, r1, buffers in segments:
                ops.short_conv(a[name + "_in"][r0:r1], weight, buffers[part], out[r0:r1], True)
        for name in ("q", "k"):  # L2 norm per head: rms_norm with eps / S, then 1 / sqrt(S) (llama.cpp's)
            ops.rms_norm(a[name], self._unit, eps / dn.size, a[name])
            ops.scale(a[name], 1.0 / np.sqrt(dn.size), a[name])
        self.linear(b, w[p + "ssm_alpha.weight"], x, a["alpha"])
        self.linear(b, w[p + "ssm_beta.weight"], x, a["beta"])
        g = (softplus(ops.to_host(a["alpha"]) + w[p + "ssm_dt.bias"]) * w[p + "ssm_a"]).astype(np.float32)
        beta = (1.0 / (1.0 + np.exp(-ops.to_host(a["beta"])))).astype(np.float32)
        for r0, r1, buffers in segments:  # rows computed as one-token steps compute them: stepwise
            ops.delta_net(a["q"][r0:r1], a["k"][r0:r1], a["v"][r0:r1], g[r0:r1], beta[r0:r1], buffers[3], a["out"][r0:r1],
                          self.DELTA_NET_GROUPED, stepwise=r1 <= b.n_rowwise)
        ops.rms_norm(a["out"], w[p + "ssm_norm.weight"], eps, a["out"])
        self.linear(b, w[p + "attn_gate.weight"], x, a["z"])
        out = a["out"].reshape(t, -1)
        ops.gated_act(a["z"], out, out, "silu")
        self.linear(b, w[p + "ssm_out.weight"], out, b.o)
