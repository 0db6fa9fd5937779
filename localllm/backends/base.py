"""The backend interface: a small set of ops, not whole layers.

Architecture code is written once against these ops and runs on every backend. Every op writes into a
caller-supplied buffer (allocated once with `alloc`), so a decode step allocates nothing. Shapes use
T = tokens in the batch, K = input features, N = output features, H = heads, D = head dim.
A backend handles device memory through `upload` (weights, once), `alloc` (activations, KV cache) and
`to_host` (only the logits come back per step).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Weight:
    """A bound model tensor: its name, ggml type name, ggml shape (ne0 first) and raw data (backend handle)."""

    name: str
    qtype: str
    shape: tuple[int, ...]
    data: Any
    # Only rows of it are ever read (an embedding table that is not also the output projection): a
    # backend may leave it where it lies (the CPU: in the file's mapping, not copied at load).
    gathered: bool = False

    @property
    def n_out(self) -> int:
        """Output features of a matrix (its number of rows)."""
        return int(np.prod(self.shape[1:])) if len(self.shape) > 1 else 1

    @property
    def n_in(self) -> int:
        return self.shape[0]


def expert_views(w: Weight) -> list[Weight]:
    """The n_expert matrices of an expert tensor (ggml shape [K, N, n_expert]) as Weights [K, N] whose data
    are row slices of w's (host or device arrays alike): no copy."""
    n_in, n_out, n_expert = w.shape[0], w.shape[1], w.shape[2]
    return [Weight(f"{w.name}[{e}]", w.qtype, (n_in, n_out), w.data[e * n_out : (e + 1) * n_out])
            for e in range(n_expert)]


class Backend(ABC):
    name: str = "abstract"
    # Buffers are host NumPy arrays in this machine's memory (so api.check_context checks the KV cache
    # against it); False for a device backend, whose buffers only the ops touch.
    host_buffers: bool = True
    # The ops read the weights where they lie in the file's mapping (`upload` returns the view itself), so
    # a file that fits the memory is worth reading ahead (api.read_ahead_if_small); False where upload copies.
    reads_mapped_weights: bool = False

    def plan_memory(self, reader, memory, hp, ctx_given: bool) -> None:
        """Check that the model fits the backend's own memory before anything is uploaded and record what
        it takes in `memory` (an api.MemoryEstimate; a device backend may lower memory.n_ctx when the user
        did not set it, and raises a typed error naming both sizes). Host backends check nothing; the CPU
        backend decides here whether upload copies the matrices (backends/cpu/weight_memory.py)."""

    def prepare_kernels(self, model_path) -> None:
        """The model at model_path is bound: a backend that compiles kernels may start doing so now
        (the CPU backend: in a background process on a cold start, backends/cpu/tiers.py)."""

    def wait_for_kernels(self) -> None:
        """Return once the backend runs its fastest kernels (a benchmark measures those)."""

    # -- memory ---------------------------------------------------------------------------------
    @abstractmethod
    def supports(self, qtype: str) -> bool:
        """Whether matmul/embed can read weights of this ggml type."""

    @abstractmethod
    def upload(self, weight: Weight) -> Weight:
        """Make a weight usable by the ops (CPU: the zero-copy view itself)."""

    @abstractmethod
    def alloc(self, shape: tuple[int, ...], dtype=np.float32) -> Any:
        """A zero-filled buffer for activations or the KV cache."""

    @abstractmethod
    def to_host(self, buffer: Any) -> np.ndarray:
        """A host NumPy copy (or view) of a buffer."""

    def begin_step(self, rows: int) -> None:
        """A forward pass over `rows` activation rows starts (a backend may tune itself per step: the
        CPU backend picks its decode thread count by measuring steps, see backends/cpu/threads.py)."""

    def end_step(self) -> None:
        """The forward pass begun by begin_step has returned its logits."""

    # -- ops --------------------------------------------------------------------------------------
    @abstractmethod
    def matmul(self, w: Weight, x, out, bias=None) -> None:
        """out[T, N] = x[T, K] @ W[N, K].T (+ bias[N])."""

    def matmul_rows(self, w: Weight, x, out, bias=None) -> None:
        """out[T, N] = x[T, K] @ W[N, K].T with every row computed exactly as a T=1 matmul computes it
        (so a row's result does not depend on the other rows: the server's batched decode needs this).
        A backend overrides it to read the weights once for all rows."""
        for t in range(x.shape[0]):
            self.matmul(w, x[t : t + 1], out[t : t + 1], bias)

    def matmul_segments(self, w: Weight, x, out, bounds, bias=None) -> None:
        """out = x @ W.T for rows cut into segments bounds[i]..bounds[i+1] (the prompt chunks of several
        sequences in one server step), each segment computed exactly as matmul computes it alone (so a
        chunk's result does not depend on what else ran in the step). A backend overrides it to share
        work between the segments (the CPU backend dequantizes each weight tile once for all)."""
        for a, b in zip(bounds[:-1], bounds[1:]):
            self.matmul(w, x[a:b], out[a:b], bias)

    def matmul_experts(self, w: Weight, x, groups: np.ndarray, bounds: np.ndarray, out, bias=None) -> None:
        """Routed experts' products (llama.cpp's mul_mat_id). w holds n_expert matrices [N, K] one after
        another (ggml shape [K, N, n_expert]); the rows of x[P, K] come grouped by expert, rows
        bounds[g]..bounds[g+1] going through expert groups[g]: out[a:b] = x[a:b] @ W[groups[g]].T. Only
        the listed experts' matrices are read, each once for all its rows; every row is computed exactly
        as a one-row matmul of its expert computes it (a row's result does not depend on which rows share
        its expert). groups: host int32[G]; bounds: host int32[G+1]; bias: host float32[n_expert, N] or
        None, expert e's bias added to its rows (gpt-oss). A backend overrides it to run the groups together."""
        experts = self.expert_matrices(w)
        for g in range(groups.shape[0]):
            a, b = int(bounds[g]), int(bounds[g + 1])
            if b > a:
                e = int(groups[g])
                self.matmul_rows(experts[e], x[a:b], out[a:b], None if bias is None else bias[e])

    def expert_matrices(self, w: Weight) -> list[Weight]:
        """w's experts as matrices (expert_views), made once per weight and kept with the backend."""
        kept = self.__dict__.setdefault("_expert_matrices", {})
        entry = kept.get(id(w))
        if entry is None or entry[0] is not w:
            entry = kept[id(w)] = (w, expert_views(w))
        return entry[1]

    @abstractmethod
    def combine_experts(self, src, slots: np.ndarray, weights: np.ndarray, out) -> None:
        """out[t] = sum over j of weights[t, j] * src[slots[t, j]], in float32, j in order, each product
        rounded before it is added (llama.cpp's order: a token's weighted expert outputs added one after
        another). src [P, E]; slots: host int32[T, J], rows of src; weights: host float32[T, J]; out [T, E]."""

    def take_rows(self, x, rows: np.ndarray, out) -> None:
        """out[R, E] = x[rows[R], E]: gather rows of an activation buffer (the batched forward keeps the
        row of each sequence that gives its logits). rows: host int32[R], each in 0..T-1. Host buffers:
        np.take; a device backend overrides it. mode "clip" as the rows are in range by contract: with
        the default "raise" NumPy writes through a temporary as large as out (32 MiB for a 512-token
        prompt's expert rows of Qwen3-30B-A3B)."""
        np.take(x, rows, axis=0, out=out, mode="clip")

    @abstractmethod
    def embed(self, w: Weight, ids: np.ndarray, out) -> None:
        """out[T, K] = rows ids[T] of the embedding matrix W[vocab, K], dequantized."""

    @abstractmethod
    def rms_norm(self, x, weight, eps: float, out) -> None:
        """out[R, D] = x[R, D] / sqrt(mean(x^2) + eps) * weight[D], row by row (R may be T or T*H)."""

    @abstractmethod
    def layer_norm(self, x, weight, bias, eps: float, out) -> None:
        """out[R, D] = (x - mean(x)) / sqrt(var(x) + eps) * weight[D] + bias[D], row by row (BERT's LayerNorm,
        ggml_norm then the weight and the bias). Mean and variance summed in float64, as ggml does;
        weight and bias: host float32[D]; bias may be None."""

    @abstractmethod
    def rope(self, x, positions: np.ndarray, n_rot: int, base: float, neox: bool, freq_factors=None,
             freq_scale: float = 1.0, mscale: float = 1.0) -> None:
        """Rotate x[T, H, D] in place: position positions[t], first n_rot dims of each head.

        Normal pairing rotates (x[2i], x[2i+1]); NeoX pairing rotates (x[i], x[i + n_rot/2]).
        Angle = positions[t] * freq_scale * base^(-2i/n_rot) / freq_factors[i]; the rotated pairs are
        also multiplied by mscale (YaRN's and LongRoPE's attention factor: cos and sin times mscale).
        """

    @abstractmethod
    def kv_store(self, cache_k, cache_v, k, v, start: int) -> None:
        """cache_k[start:start+T] = k[T, Hkv, D]; cache_v likewise."""

    @abstractmethod
    def attention(self, q, cache_k, cache_v, start: int, scale: float, window: int, out, softcap: float = 0.0,
                  sinks=None) -> None:
        """Causal attention of q[T, Hq, D] (positions start..start+T-1) over cache[0:start+T, Hkv, D].

        GQA: query head h reads kv head h // (Hq / Hkv). Query position p sees keys at positions j with
        j <= p and p - j < window (window 0: unbounded). Scores are scale * q.k, soft-capped to
        softcap * tanh(score / softcap) when softcap > 0 (Gemma 2). sinks: host float32[Hq] or None, each
        head's attention sink (gpt-oss): a logit that joins the softmax's sum (after the scores', as
        llama.cpp adds it) and brings no value, so the weights sum to less than one. out[T, Hq, D].
        """

    def attention_bidirectional(self, q, cache_k, cache_v, start: int, scale: float, out, sinks=None) -> None:
        """Non-causal attention (encoders: BERT): every row of q[T, Hq, D] sees every key 0..start+T-1 of
        the cache (none masked, no window, no soft cap); GQA as in `attention`. out[T, Hq, D].

        This default runs each row through `attention` as a one-row step at the last position, where the
        causal mask covers every key: exact by construction on any backend, one call per row. A backend
        overrides it to do the rows together (the CPU: its BLAS prefill path)."""
        n_tokens = q.shape[0]
        last = start + n_tokens - 1
        for t in range(n_tokens):
            self.attention(q[t : t + 1], cache_k, cache_v, last, scale, 0, out[t : t + 1], 0.0, sinks)

    # -- paged KV cache (several sequences per step; see localllm/model/kv_paged.py) ------------------
    @abstractmethod
    def kv_store_paged(self, cache_k, cache_v, k, v, slots: np.ndarray) -> None:
        """cache_k[NB, BS, Hkv, D] viewed as [NB*BS, Hkv, D]: row slots[t] = k[t]; cache_v likewise."""

    @abstractmethod
    def attention_paged(self, q, cache_k, cache_v, layout, scale: float, window: int, out, softcap: float = 0.0,
                        sinks=None) -> None:
        """Causal attention of each row t of q[T, Hq, D] (sequence layout.row_seq[t], position
        layout.positions[t]) over that sequence's keys 0..positions[t], read through its block table
        layout.tables[s] from cache[NB, BS, Hkv, D]. Same masking and GQA as `attention`; each
        sequence's rows give exactly what `attention` gives for them on a contiguous cache (soft-capping
        and sinks as there). out[T, Hq, D]."""

    @abstractmethod
    def short_conv(self, x, weight, window, out, silu: bool) -> None:
        """The recurrent layers' causal convolution over time, one channel at a time (ggml_ssm_conv):
        out[t, c] = sum_i weight[c, i] * xin[t + i, c] for i = 0..K-1, xin being the window's rows then
        x's; then SiLU when `silu`. Afterwards the window holds the last K-1 rows of xin, for the next
        call. x float32[T, C], weight float32[C, K] (the file's ssm_conv1d), window float32[K-1, C] (zero
        at a sequence's start), out float32[T, C] (not x)."""

    @abstractmethod
    def delta_net(self, q, k, v, g: np.ndarray, beta: np.ndarray, state, out, grouped: bool = False,
                  stepwise: bool = False) -> None:
        """The gated delta rule over T tokens of one sequence, the state carried in place (Qwen3.5's and
        Qwen3-Next's linear attention, ggml_gated_delta_net). Per value head h and token t, with M =
        state[h] [S (value), S (key)] and key head h % Hk (Qwen3.5), or h // (Hv / Hk) when `grouped`
        (Qwen3-Next: each key head's value heads side by side):
            M <- exp(g[t, h]) M;  d = beta[t, h] (v[t, h] - M k[t]);  M <- M + d k[t]^T;
            out[t, h] = (M q[t]) / sqrt(S).
        q, k float32[T, Hk, S] (L2-normalised by the caller), v and out float32[T, Hv, S], state
        float32[Hv, S, S] (zero at a sequence's start); g (log decay, <= 0) and beta host float32[T, Hv].
        A backend may compute a prompt in chunks (the same rule in another order): within float32
        rounding of the token loop. `stepwise`: token by token, each exactly as a one-token call computes
        it (the rows Decoder.verify checks: Buffers.n_rowwise)."""

    @abstractmethod
    def gated_act(self, gate, up, out, kind: str) -> None:
        """out = act(gate) * up, kind 'silu', 'gelu_tanh' or 'sigmoid'; or kind 'swiglu_oai' (gpt-oss,
        ggml's swiglu_oai): g = min(gate, 7), u = clamp(up, -7, 7), out = g * sigmoid(1.702 g) * (u + 1)."""

    @abstractmethod
    def add(self, a, b, out) -> None:
        """out = a + b."""

    @abstractmethod
    def scale(self, x, factor: float, out) -> None:
        """out = x * factor."""

    @abstractmethod
    def softcap(self, x, cap: float, out) -> None:
        """out = cap * tanh(x / cap) (Gemma 2's soft-capping of the logits)."""
