"""Tiny random models of each architecture, written as GGUF by our own writer.

Sizes are the smallest that every quant type can hold (rows a multiple of 256 for the K-quants) while
keeping every architectural feature in play: GQA (4 query heads over 2 KV heads), partial windows
(Gemma 3 gets six layers so a global layer follows five sliding-window layers, and a window shorter
than the test prompts), biases (qwen2), Q/K norms (qwen3, gemma3), llama3 RoPE frequency factors.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from localllm import quant
from localllm.gguf import GGUFWriter
from localllm.gguf.constants import GGML_TYPES_BY_NAME, ValueType

N_EMBD, N_HEAD, N_KV, HEAD_DIM, N_FF, N_VOCAB = 256, 4, 2, 64, 512, 384
WINDOW = 5

# Byte offsets and widths of the scale fields that random blocks need set to sane values.
_SCALE_FIELDS = {
    "Q2_K": [(80, 2), (82, 2)],
    "Q3_K": [(108, 2)],
    "Q4_K": [(0, 2), (2, 2)],
    "Q5_K": [(0, 2), (2, 2)],
    "Q6_K": [(208, 2)],
    "Q8_K": [(0, 4)],
    "IQ4_NL": [(0, 2)],
    "IQ4_XS": [(0, 2)],
}


def _set_scales(blocks: np.ndarray, qtype: str, value: float) -> None:
    for offset, width in _SCALE_FIELDS[qtype]:
        dtype = np.float16 if width == 2 else np.float32
        blocks[:, offset : offset + width] = np.full((blocks.shape[0], 1), value, dtype=dtype).view(np.uint8)


def quantized_matrix(rng, n_out: int, n_in: int, qtype: str, std: float = 0.05) -> np.ndarray:
    """Raw bytes [n_out, row_bytes] of a random matrix in `qtype` whose values have about `std`."""
    qt = quant.get(qtype)
    if qt.quantize is not None:
        return qt.quantize(rng.normal(0, std, (n_out, n_in)).astype(np.float32))
    info = GGML_TYPES_BY_NAME[qtype]
    blocks = rng.integers(0, 256, (n_out * n_in // info.block_size, info.type_size), dtype=np.uint8)
    _set_scales(blocks, qtype, 1.0)
    measured = qt.dequantize(blocks.reshape(-1)).std()
    _set_scales(blocks, qtype, std / measured)
    return blocks.reshape(n_out, -1)


def _vocab() -> tuple[list[str], np.ndarray, np.ndarray]:
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [3, 3, 3, 2] + [6] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while len(tokens) < N_VOCAB:
        piece = "▁" + letters[i % 26] + letters[(i // 26) % 26] * (i >= 26)
        tokens.append(piece)
        types.append(1)
        i += 1
    scores = np.array([0.0] * 260 + [-float(j) for j in range(N_VOCAB - 260)], dtype=np.float32)
    return tokens, scores, np.array(types, dtype=np.int32)


@dataclass(frozen=True)
class TinyArch:
    """What a tiny model of one architecture holds beyond the llama layout (see each arch module)."""

    n_layer: int = 2
    rope_base: float = 10000.0
    metadata: dict = field(default_factory=dict)  # extra `<arch>.<key>` values: int -> UINT32, float -> FLOAT32
    output: bool = False  # a separate output.weight (else tied to token_embd)
    rope_freqs: bool = False  # llama 3.1's rope_freqs.weight
    pre_norms: bool = True  # attn_norm / ffn_norm before each sub-block
    post_norms: bool = False  # post_attention_norm / post_ffw_norm after each sub-block
    qk_norm: str = ""  # "head": per-head attn_q/k_norm [head_dim]; "full": over the whole projection
    qkv_bias: bool = False
    fused_qkv: bool = False  # one attn_qkv.weight (Q rows, K rows, V rows) instead of three
    fused_gate_up: bool = False  # ffn_up.weight [n_embd, 2 * n_ff]: gate rows, then up rows (no ffn_gate)
    longrope: bool = False  # rope_factors_long / rope_factors_short
    name: str = ""  # general.name's stem (default: the architecture)
    # Gemma 4: local layers (the pattern's True) with heads local_head_dim wide, the last shared_kv
    # layers reading earlier caches, per-layer embeddings of n_ple values, layers without attn_v, and a
    # layer_output_scale per layer
    pattern: tuple = ()
    local_head_dim: int = 0
    shared_kv: int = 0
    n_ple: int = 0
    no_v_layers: tuple = ()
    output_scale: bool = False
    qk_norm_mean: float = 1.0  # Q/K norm weights: Gemma 4 scales no scores, so smaller norms keep them O(1)
    embd_std: float = 0.5  # token_embd std; 1/sqrt(E) keeps logits O(1) unless the arch scales embeddings
    # Mixture of experts: n_expert experts of which n_used per token, each n_ff_expert wide (0: the
    # architecture's default, not written), and a shared expert (Qwen2-MoE)
    n_expert: int = 0
    n_used: int = 0
    n_ff_expert: int = 0
    shared_expert: bool = False
    router_std: float = 0.5  # the router's weights (larger: the experts' scores further apart)
    ff_from_used: bool = False  # the architecture's default expert width is feed_forward_length / n_used
    architecture: str = ""  # general.architecture when it is not the entry's name (Mixtral: llama)
    kv_as_query: bool = False  # as many KV heads as query heads (OLMoE: llama.cpp assumes it)
    fused_experts: bool = False  # ffn_gate_up_exps (each expert's gate rows, then its up rows) for gate and up
    expert_scales: bool = False  # ffn_down_exps.scale: one float per expert
    # gpt-oss: biases on the router, the experts and attn_output; attention sinks; the feed-forward's norm
    # named post_attention_norm
    biases: bool = False
    sinks: bool = False
    ffn_norm_name: str = "ffn_norm"
    # Qwen3.5's hybrid: every attention_interval-th layer attention (its queries carrying an output gate,
    # partial interleaved M-RoPE), the others gated delta nets with a short convolution; heads of
    # ssm_state wide, ssm_groups key heads and ssm_heads value heads
    attention_interval: int = 0
    ssm_state: int = 0  # 0: the attention heads' width
    ssm_groups: int = 2
    ssm_heads: int = 4
    ssm_conv: int = 4
    ssm_in: bool = False  # Qwen3-Next's first GGUF layout: one ssm_in (q, k, v, z per key head) and ssm_ba
    rope_sections: bool = True  # Qwen3.5's rope.dimension_sections (Qwen3-Next has none)
    mtp: bool = False  # a multi-token-prediction block after the trunk (nextn_predict_layers 1), as Qwen3.5's files have


ROUTER_STD = 0.3
TINY_ARCHS = {
    "llama": TinyArch(output=True, rope_freqs=True),
    "qwen2": TinyArch(qkv_bias=True),
    "qwen3": TinyArch(qk_norm="head"),
    # six layers: a global layer follows five sliding-window layers
    "gemma3": TinyArch(n_layer=6, rope_base=1000000.0, qk_norm="head", post_norms=True, embd_std=0.05,
                       metadata={"attention.sliding_window": WINDOW}),
    # four layers: two local, two global; caps low enough to bend the tiny model's scores and logits
    "gemma2": TinyArch(n_layer=4, post_norms=True, embd_std=0.05,
                       metadata={"attention.sliding_window": WINDOW, "attn_logit_softcapping": 2.0,
                                 "final_logit_softcapping": 3.0}),
    # six layers, local and global alternating (heads 64 and 128 wide), the last two sharing the caches of
    # layers 2 and 3; per-layer embeddings; layer 1 without attn_v; logits soft-capped at llama.cpp's
    # default 30 (no key)
    "gemma4": TinyArch(n_layer=6, rope_base=1000000.0, qk_norm="head", post_norms=True, embd_std=0.2, rope_freqs=True,
                       pattern=(True, False, True, False, True, False), local_head_dim=64, shared_kv=2, n_ple=256,
                       no_v_layers=(1,), output_scale=True, qk_norm_mean=0.25,
                       metadata={"attention.sliding_window": WINDOW, "rope.freq_base_swa": 10000.0}),
    "olmo2": TinyArch(output=True, pre_norms=False, post_norms=True, qk_norm="full", rope_base=500000.0),
    # four layers: llama.cpp leaves RoPE out of every fourth
    "smollm3": TinyArch(n_layer=4, rope_base=5000000.0),
    # fused Q/K/V and gate/up; LongRoPE with an original context (32) shorter than the tests' (64): the
    # long factors, and an attention factor
    # named "tiny-phi": llama.cpp sets token attributes of "</s>" etc. for models named phi3, absent here
    "phi3": TinyArch(name="phi", fused_qkv=True, fused_gate_up=True, longrope=True,
                     metadata={"rope.scaling.original_context_length": 32, "rope.scaling.attn_factor": 1.2}),
    # YaRN over an original context of 8 and the attention temperature, which both act within the
    # tests' prompts
    "mistral3": TinyArch(rope_base=1000000.0,
                         metadata={"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                   "rope.scaling.original_context_length": 8, "rope.scaling.yarn_beta_fast": 32.0,
                                   "rope.scaling.yarn_beta_slow": 1.0, "attention.temperature_scale": 0.1}),
    "granite": TinyArch(metadata={"embedding_scale": 2.0, "residual_scale": 0.8, "attention.scale": 0.25,
                                  "logit_scale": 4.0}),
    # Mixtures of experts: several experts, more than one per token. Qwen3-MoE: eight experts, two per
    # token, their width from feed_forward_length / expert_used_count (no key); Qwen2-MoE: its own
    # expert width key and a shared expert; OLMoE: three of eight; Mixtral: llama files with experts as
    # wide as feed_forward_length
    "qwen3moe": TinyArch(qk_norm="head", n_expert=8, n_used=2, ff_from_used=True),
    "qwen2moe": TinyArch(qkv_bias=True, output=True, n_expert=4, n_used=2, n_ff_expert=256, shared_expert=True),
    "olmoe": TinyArch(output=True, qk_norm="full", n_expert=8, n_used=3, kv_as_query=True),
    "mixtral": TinyArch(architecture="llama", output=True, n_expert=4, n_used=2, rope_base=1000000.0),
    # Gemma 4's mixture of experts (26B-A4B's layout): a dense feed-forward beside the experts in every
    # layer, fused gate/up experts with per-expert output scales; local and global layers as the dense
    # tiny Gemma 4, without its shared caches and per-layer embeddings
    # gpt-oss: every other layer local from layer 0, YaRN over an original context of 8, sinks, biases
    # everywhere, the clamped SwiGLU; its published files keep the experts in MXFP4 (oracle_types)
    "gpt-oss": TinyArch(qkv_bias=True, output=True, n_expert=4, n_used=2, n_ff_expert=256, biases=True, sinks=True,
                        ffn_norm_name="post_attention_norm", rope_base=150000.0,
                        metadata={"attention.sliding_window": WINDOW, "rope.scaling.type": "yarn",
                                  "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 8,
                                  "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0}),
    # Qwen3.5: four layers, delta nets 0 and 2, attention 1 and 3, then a multi-token-prediction block that
    # a forward pass skips; RoPE on half of each head's dims
    # in three interleaved sections, as its files give them; feed-forward norm named post_attention_norm
    "qwen35": TinyArch(n_layer=4, qk_norm="head", attention_interval=2, ffn_norm_name="post_attention_norm",
                       rope_base=10000000.0, output=True, mtp=True,
                       metadata={"full_attention_interval": 2}),
    # Qwen3.5's mixture of experts: a delta net then an attention layer (the dense tiny Qwen3.5 has
    # two of each), eight experts (two per token, as wide as feed_forward_length / 2), a shared expert
    "qwen35moe": TinyArch(n_layer=2, qk_norm="head", attention_interval=2, ffn_norm_name="post_attention_norm",
                          rope_base=10000000.0, output=True, n_expert=8, n_used=2, ff_from_used=True,
                          shared_expert=True, metadata={"full_attention_interval": 2}),
    # Qwen3-Next: Qwen3.5's MoE in its earlier form, in the layout of llama.cpp's first converter (ssm_in,
    # ssm_ba), value heads grouped by key head, RoPE without sections; router weights 0.7 (the others'
    # 0.5): at 0.5 (or 0.3) 5-6 of the 48 oracle rows had a route within the oracle's 0.1 margin on some
    # type, at 0.7 at most 3 (at 1.0 also 3, but the sharper routing moved the logits further from the
    # float64 reference: worst rows up to 0.32)
    "qwen3next": TinyArch(n_layer=2, qk_norm="head", attention_interval=2, ffn_norm_name="post_attention_norm",
                          rope_base=10000000.0, output=True, n_expert=8, n_used=2, ff_from_used=True,
                          shared_expert=True, ssm_in=True, rope_sections=False, router_std=0.7,
                          metadata={"full_attention_interval": 2}),
    "gemma4moe": TinyArch(architecture="gemma4", n_layer=4, rope_base=1000000.0, qk_norm="head", post_norms=True,
                          embd_std=0.2, rope_freqs=True, pattern=(True, False, True, False), local_head_dim=64,
                          output_scale=True, qk_norm_mean=0.25, n_expert=4, n_used=2, n_ff_expert=256,
                          fused_experts=True, expert_scales=True,
                          metadata={"attention.sliding_window": WINDOW, "rope.freq_base_swa": 10000.0}),
}
ARCH_LAYERS = {arch: spec.n_layer for arch, spec in TINY_ARCHS.items()}


@dataclass(frozen=True)
class Dims:
    """A model's sizes (scripts/bench_archs.py writes larger ones). None: the module's constant at the
    time of the call (tests/backends/cuda/cuda_checks.py shrinks those for the simulator); n_layer None:
    the architecture's own."""

    n_embd: Optional[int] = None
    n_head: Optional[int] = None
    n_kv: Optional[int] = None
    head_dim: Optional[int] = None
    n_ff: Optional[int] = None
    n_layer: Optional[int] = None


def write_tiny_model(path, arch: str, qtype: str = "F32", seed: int = 0, dims: Dims = Dims(),
                     spec: Optional[TinyArch] = None) -> str:
    """Write a random `arch` model with its matrices in `qtype` (norms and biases F32) to `path` (`spec`:
    a TinyArch not in TINY_ARCHS, named `arch`: tests/tiny_encoders.py's decoders with a pooling type)."""
    rng = np.random.default_rng(seed)
    spec = spec or TINY_ARCHS[arch]
    sizes = globals()
    N_EMBD, N_HEAD, N_KV, HEAD_DIM, N_FF = (  # noqa: N806
        sizes[name] if value is None else value
        for name, value in (("N_EMBD", dims.n_embd), ("N_HEAD", dims.n_head), ("N_KV", dims.n_kv),
                            ("HEAD_DIM", dims.head_dim), ("N_FF", dims.n_ff)))
    if spec.kv_as_query and dims.n_kv is None:
        N_KV = N_HEAD  # noqa: N806
    n_layer = dims.n_layer or ARCH_LAYERS.get(arch, spec.n_layer)  # ARCH_LAYERS: cuda_checks.py shrinks it too (by entry name)
    name, arch = arch, spec.architecture or arch
    w = GGUFWriter(path)
    w.add("general.architecture", arch)
    w.add("general.name", f"tiny-{spec.name or name}-{qtype}")
    shapes = {
        "context_length": 256,
        "embedding_length": N_EMBD,
        "block_count": n_layer + spec.mtp,
        "feed_forward_length": N_FF,
        "attention.head_count": N_HEAD,
        "attention.head_count_kv": N_KV,
    }
    if not spec.local_head_dim:
        shapes.update({"attention.key_length": HEAD_DIM, "attention.value_length": HEAD_DIM,
                       "rope.dimension_count": HEAD_DIM})
    for key, value in shapes.items():
        w.add(f"{arch}.{key}", value, ValueType.UINT32)
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add(f"{arch}.rope.freq_base", spec.rope_base)
    head_dim_full = HEAD_DIM * 2 if spec.local_head_dim else HEAD_DIM
    if spec.local_head_dim:  # Gemma 4: global heads twice as wide as the local ones
        w.add(f"{arch}.attention.key_length", head_dim_full, ValueType.UINT32)
        w.add(f"{arch}.attention.value_length", head_dim_full, ValueType.UINT32)
        w.add(f"{arch}.rope.dimension_count", head_dim_full, ValueType.UINT32)
        w.add(f"{arch}.attention.key_length_swa", spec.local_head_dim, ValueType.UINT32)
        w.add(f"{arch}.attention.value_length_swa", spec.local_head_dim, ValueType.UINT32)
        w.add(f"{arch}.rope.dimension_count_swa", spec.local_head_dim, ValueType.UINT32)
    if spec.pattern:
        w.add(f"{arch}.attention.sliding_window_pattern", [bool(v) for v in spec.pattern])
    if spec.shared_kv:
        w.add(f"{arch}.attention.shared_kv_layers", spec.shared_kv, ValueType.UINT32)
    if spec.n_ple or arch == "gemma4":  # llama.cpp requires the key of every Gemma 4 file (0: none)
        w.add(f"{arch}.embedding_length_per_layer_input", spec.n_ple, ValueType.UINT32)
    if spec.n_expert:
        w.add(f"{arch}.expert_count", spec.n_expert, ValueType.UINT32)
        w.add(f"{arch}.expert_used_count", spec.n_used, ValueType.UINT32)
    if spec.n_ff_expert:
        w.add(f"{arch}.expert_feed_forward_length", spec.n_ff_expert, ValueType.UINT32)
    ssm_state = spec.ssm_state or HEAD_DIM
    if spec.mtp:
        w.add(f"{arch}.nextn_predict_layers", 1, ValueType.UINT32)
    if spec.attention_interval:  # RoPE on half of each head's dims (Qwen3.5's files: a quarter)
        w.add(f"{arch}.rope.dimension_count", HEAD_DIM // 2, ValueType.UINT32)
        if spec.rope_sections:
            w.add(f"{arch}.rope.dimension_sections", np.array([6, 5, 5, 0], dtype=np.int32))
        for key, value in (("ssm.conv_kernel", spec.ssm_conv), ("ssm.state_size", ssm_state),
                           ("ssm.group_count", spec.ssm_groups), ("ssm.time_step_rank", spec.ssm_heads),
                           ("ssm.inner_size", spec.ssm_heads * ssm_state)):
            w.add(f"{arch}.{key}", value, ValueType.UINT32)
    for key, value in spec.metadata.items():
        if isinstance(value, str):
            w.add(f"{arch}.{key}", value)
        else:
            w.add(f"{arch}.{key}", value, ValueType.UINT32 if isinstance(value, int) else ValueType.FLOAT32)
    tokens, scores, types = _vocab()
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.scores", scores)
    w.add("tokenizer.ggml.token_type", types)
    w.add("tokenizer.ggml.bos_token_id", 2, ValueType.UINT32)
    w.add("tokenizer.ggml.eos_token_id", 1, ValueType.UINT32)
    w.add("tokenizer.ggml.unknown_token_id", 3, ValueType.UINT32)

    def matrix(name, n_in, n_out, std=0.05):
        w.add_tensor(name, quantized_matrix(rng, n_out, n_in, qtype, std), qtype, shape=(n_in, n_out))

    def vector(name, n, mean=1.0, std=0.1):
        w.add_tensor(name, (mean + rng.normal(0, std, n)).astype(np.float32))

    def experts(p, n_ff, n_expert, router_std=0.5):
        """A router (F32, as llama-quantize leaves it) and n_expert experts stored one after another."""
        w.add_tensor(p + "ffn_gate_inp.weight", rng.normal(0, router_std, (n_expert, N_EMBD)).astype(np.float32))
        parts = [("gate_up", N_EMBD, 2 * n_ff)] if spec.fused_experts else [("gate", N_EMBD, n_ff), ("up", N_EMBD, n_ff)]
        for part, n_in, n_out in (*parts, ("down", n_ff, N_EMBD)):
            w.add_tensor(f"{p}ffn_{part}_exps.weight", quantized_matrix(rng, n_out * n_expert, n_in, qtype), qtype,
                         shape=(n_in, n_out, n_expert))
        if spec.expert_scales:
            vector(p + "ffn_down_exps.scale", n_expert, mean=1.0, std=0.3)
        if spec.biases:
            vector(p + "ffn_gate_inp.bias", n_expert, mean=0.0, std=0.5)
            for part, width in (("gate", n_ff), ("up", n_ff), ("down", N_EMBD)):
                w.add_tensor(f"{p}ffn_{part}_exps.bias", rng.normal(0, 0.1, (n_expert, width)).astype(np.float32))

    def gated_attention_layer(p):
        """Qwen3.5's attention: attn_q gives each head's queries then its output gate."""
        matrix(p + "attn_q.weight", N_EMBD, 2 * N_HEAD * HEAD_DIM)
        matrix(p + "attn_k.weight", N_EMBD, N_KV * HEAD_DIM)
        matrix(p + "attn_v.weight", N_EMBD, N_KV * HEAD_DIM)
        matrix(p + "attn_output.weight", N_HEAD * HEAD_DIM, N_EMBD)

    def delta_net_layer(p):
        """Qwen3.5's gated delta net: q, k, v through a short convolution, an output gate (attn_gate), the
        decay's and the write strength's projections (ssm_alpha, ssm_beta) with the decay's bias and rate
        (ssm_dt.bias, ssm_a = -exp(A_log)), the output's per-head norm and projection."""
        key_dim, value_dim = spec.ssm_groups * ssm_state, spec.ssm_heads * ssm_state
        if spec.ssm_in:
            matrix(p + "ssm_in.weight", N_EMBD, 2 * key_dim + 2 * value_dim)
        else:
            matrix(p + "attn_qkv.weight", N_EMBD, 2 * key_dim + value_dim)
            matrix(p + "attn_gate.weight", N_EMBD, value_dim)
        w.add_tensor(p + "ssm_conv1d.weight", rng.normal(0, 0.3, (2 * key_dim + value_dim, spec.ssm_conv)).astype(np.float32))
        if spec.ssm_in:
            matrix(p + "ssm_ba.weight", N_EMBD, 2 * spec.ssm_heads, std=0.1)
        else:
            matrix(p + "ssm_alpha.weight", N_EMBD, spec.ssm_heads, std=0.1)
            matrix(p + "ssm_beta.weight", N_EMBD, spec.ssm_heads, std=0.1)
        vector(p + "ssm_dt.bias", spec.ssm_heads, mean=0.0, std=1.0)
        w.add_tensor(p + "ssm_a", (-np.exp(rng.normal(0, 0.5, spec.ssm_heads))).astype(np.float32))
        vector(p + "ssm_norm.weight", ssm_state)
        matrix(p + "ssm_out.weight", value_dim, N_EMBD)

    matrix("token_embd.weight", N_EMBD, N_VOCAB, std=spec.embd_std)
    vector("output_norm.weight", N_EMBD)
    if spec.output:
        matrix("output.weight", N_EMBD, N_VOCAB, std=0.1)
    if spec.rope_freqs:
        w.add_tensor("rope_freqs.weight", rng.uniform(1.0, 8.0, head_dim_full // 2).astype(np.float32))
    if spec.longrope:
        w.add_tensor("rope_factors_long.weight", rng.uniform(1.0, 8.0, HEAD_DIM // 2).astype(np.float32))
        w.add_tensor("rope_factors_short.weight", rng.uniform(1.0, 1.5, HEAD_DIM // 2).astype(np.float32))
    if spec.n_ple:
        matrix("per_layer_token_embd.weight", spec.n_ple * n_layer, N_VOCAB, std=0.5)
        matrix("per_layer_model_proj.weight", N_EMBD, spec.n_ple * n_layer)
        vector("per_layer_proj_norm.weight", spec.n_ple)
    for il in range(n_layer):
        p = f"blk.{il}."
        layer_head_dim = spec.local_head_dim if spec.pattern and spec.pattern[il] else head_dim_full
        q_out, kv_out = N_HEAD * layer_head_dim, N_KV * layer_head_dim
        has_kv = il < n_layer - spec.shared_kv
        if spec.pre_norms:
            vector(p + "attn_norm.weight", N_EMBD)
        recurrent = spec.attention_interval and (il + 1) % spec.attention_interval != 0
        if spec.attention_interval:
            delta_net_layer(p) if recurrent else gated_attention_layer(p)
        elif not has_kv:
            matrix(p + "attn_q.weight", N_EMBD, q_out)
        elif spec.fused_qkv:
            matrix(p + "attn_qkv.weight", N_EMBD, q_out + 2 * kv_out)
        else:
            matrix(p + "attn_q.weight", N_EMBD, q_out)
            matrix(p + "attn_k.weight", N_EMBD, kv_out)
            if il not in spec.no_v_layers:
                matrix(p + "attn_v.weight", N_EMBD, kv_out)
        if not spec.attention_interval:
            matrix(p + "attn_output.weight", q_out, N_EMBD)
        if spec.biases:
            vector(p + "attn_output.bias", N_EMBD, mean=0.0, std=0.1)
        if spec.sinks:
            vector(p + "attn_sinks.weight", N_HEAD, mean=0.0, std=1.0)
        if spec.pre_norms:
            vector(p + spec.ffn_norm_name + ".weight", N_EMBD)
        if spec.n_expert and arch == "gemma4":  # the dense feed-forward stays, beside the experts
            # its router reads rms_norm(x) / sqrt(n_embd): weights 16 times the others' give scores as spread
            experts(p, spec.n_ff_expert, spec.n_expert, router_std=8.0)
            vector(p + "ffn_gate_inp.scale", N_EMBD, mean=1.0, std=0.2)
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                vector(p + name + ".weight", N_EMBD)
            matrix(p + "ffn_gate.weight", N_EMBD, N_FF)
            matrix(p + "ffn_up.weight", N_EMBD, N_FF)
        elif spec.n_expert:
            expert_ff = spec.n_ff_expert or (N_FF // spec.n_used if spec.ff_from_used else N_FF)
            experts(p, expert_ff, spec.n_expert, router_std=spec.router_std)
            if spec.shared_expert:
                vector(p + "ffn_gate_inp_shexp.weight", N_EMBD, mean=0.0, std=0.1)
                matrix(p + "ffn_gate_shexp.weight", N_EMBD, N_FF)
                matrix(p + "ffn_up_shexp.weight", N_EMBD, N_FF)
                matrix(p + "ffn_down_shexp.weight", N_FF, N_EMBD)
        elif spec.fused_gate_up:
            matrix(p + "ffn_up.weight", N_EMBD, 2 * N_FF)
        else:
            matrix(p + "ffn_gate.weight", N_EMBD, N_FF)
            matrix(p + "ffn_up.weight", N_EMBD, N_FF)
        if not spec.n_expert or arch == "gemma4":
            matrix(p + "ffn_down.weight", N_FF, N_EMBD)
        if spec.qkv_bias:
            for name, n in (("attn_q.bias", q_out), ("attn_k.bias", kv_out), ("attn_v.bias", kv_out)):
                vector(p + name, n, mean=0.0, std=0.5)
        if spec.qk_norm and not recurrent:
            vector(p + "attn_q_norm.weight", layer_head_dim if spec.qk_norm == "head" else q_out, mean=spec.qk_norm_mean)
            if has_kv:
                vector(p + "attn_k_norm.weight", layer_head_dim if spec.qk_norm == "head" else kv_out,
                       mean=spec.qk_norm_mean)
        if spec.post_norms:
            vector(p + "post_attention_norm.weight", N_EMBD)
            vector(p + "post_ffw_norm.weight", N_EMBD)
        if spec.n_ple:
            matrix(p + "inp_gate.weight", N_EMBD, spec.n_ple)
            matrix(p + "proj.weight", spec.n_ple, N_EMBD)
            vector(p + "post_norm.weight", N_EMBD)
        if spec.output_scale:
            vector(p + "layer_output_scale.weight", 1, mean=0.8, std=0.1)
    if spec.mtp:  # Qwen3.5's prediction block: an attention block with its input projection and norms
        p = f"blk.{n_layer}."
        for name in ("attn_norm", "post_attention_norm", "nextn.enorm", "nextn.hnorm"):
            vector(p + name + ".weight", N_EMBD)
        gated_attention_layer(p)
        vector(p + "attn_q_norm.weight", HEAD_DIM)
        vector(p + "attn_k_norm.weight", HEAD_DIM)
        matrix(p + "ffn_gate.weight", N_EMBD, N_FF)
        matrix(p + "ffn_up.weight", N_EMBD, N_FF)
        matrix(p + "ffn_down.weight", N_FF, N_EMBD)
        matrix(p + "nextn.eh_proj.weight", 2 * N_EMBD, N_EMBD)
    w.write()
    return str(path)


# The llama.cpp oracle (scripts/llamacpp_arch_logits.py records, tests/model/test_llamacpp_archs.py checks):
# every architecture in these types, with these prompts.
ORACLE_TYPES = ("F32", "F16", "Q8_0", "Q4_K", "Q4_K_M")
ORACLE_SEED = 7
# BOS then vocabulary ids: 36 tokens (a prefill past 32 rows, where some types switch kernels, and longer
# than the tiny sliding windows) and 12 (a short prefill).
ORACLE_PROMPTS = (
    [2, 300, 17, 281, 299, 5, 260, 310, 333, 290, 301, 7, 270, 275, 12, 318, 263, 297, 40, 311,
     288, 9, 325, 266, 302, 31, 279, 315, 258, 294, 21, 307, 272, 330, 285, 14],
    [2, 261, 322, 291, 268, 350, 377, 264, 383, 299, 262, 341],
)


# llama-quantize's mixes among the oracle's types: our `quantize` of the F32 file (byte-identical to
# llama-quantize's output for both: checked on the tiny Qwen3-MoE file, `llama-quantize F32 OUT TYPE 2`)
MIXES = ("Q4_K_M", "MXFP4_MOE")


def oracle_types(arch: str) -> tuple:
    """The types the oracle records for a tiny model: ORACLE_TYPES, and for a mixture of experts also
    llama-quantize's MXFP4_MOE mix (experts in MXFP4, the rest Q8_0: gpt-oss's own)."""
    return ORACLE_TYPES + (("MXFP4_MOE",) if TINY_ARCHS[arch].n_expert else ())


def oracle_model(directory: Path, arch: str, qtype: str) -> Path:
    """The oracle's tiny `arch` model in `qtype`, written into `directory` (a mix of MIXES: our quantize of
    the F32 file)."""
    path = Path(directory) / f"{arch}-{qtype}.gguf"
    if qtype in MIXES:
        from localllm.quantize import quantize_file

        quantize_file(oracle_model(directory, arch, "F32"), path, qtype, force=True, threads=2)
    else:
        write_tiny_model(path, arch, qtype, seed=ORACLE_SEED)
    return path


def file_sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
