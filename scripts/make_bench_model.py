#!/usr/bin/env python3
"""Write a Llama-3-8B-shaped (or Qwen3-30B-A3B-shaped) GGUF with random weights in llama.cpp's Q4_K_M mix,
for speed tests.

    python scripts/make_bench_model.py bench-llama3-8b-q4_k_m.gguf [--layers 32]
    python scripts/make_bench_model.py bench-qwen3-30b-a3b-16l.gguf --shape qwen3-30b-a3b --layers 16

gpt-oss-20b (`--shape gpt-oss-20b`, architecture gpt-oss): 24 layers (the speed issue uses the first 8),
2880 embedding, 64 query heads over 8 KV heads of 64, attention sinks and biases, 32 experts of 2880 of
which 4 per token, every other layer windowed to 128 positions, a 201,088-token vocabulary; in
llama-quantize's MXFP4_MOE mix as OpenAI's files are: experts MXFP4, every other matrix Q8_0.

Qwen3.5-4B (`--shape qwen3.5-4b`, architecture qwen35): 32 layers, 2560 embedding, 9216 feed-forward; every
fourth layer attention (16 query heads over 4 KV heads of 256, an output gate beside each head's
queries, RoPE on 64 of each head's dims in three interleaved sections, base 10,000,000), the others gated
delta nets (16 key heads and 32 value heads of 128, a 4-long convolution); a 248,320-token vocabulary,
the output tied to the embeddings. Each tensor in the type llama-quantize's Q4_K_M gives it (our
quantize's recipe, localllm/quantize/recipes.py: byte-identical to llama-quantize's on the tiny hybrids).

Qwen3-30B-A3B (`--shape qwen3-30b-a3b`, architecture qwen3moe): 48 layers (the speed issue uses the first
16: ~6 GB), 2048 embedding, 32 query heads over 4 KV heads of 128 with per-head Q/K norms, 128 experts of
768 of which 8 per token, a 151,936-token vocabulary, RoPE base 1,000,000. The router (`ffn_gate_inp`)
is F32, as llama-quantize leaves it; `ffn_down_exps` gets Q6_K where `ffn_down` would.

Shape (Llama 3 8B): 32 layers, 4096 embedding, 14336 FFN, 32 query heads over 8 KV heads of 128,
a 128,256-token byte-level BPE vocabulary (pre-tokenizer `llama-bpe`), RoPE base 500,000.
Mix (llama.cpp's Q4_K_M, llama-quant.cpp): Q4_K everywhere, except Q6_K for `output.weight` and for
`attn_v`/`ffn_down` in the layers llama.cpp gives more bits (the first and last eighth, and every third
layer between). Norms are F32. The weights are random blocks with scales set so values have std ~0.02:
the file measures speed, not quality, and both llama.cpp and localllm load it (~4.6 GB).
The vocabulary is synthetic but consistent: 256 byte tokens, two- and three-byte tokens each with the
merge that makes it, and Llama 3's special tokens from id 128,000.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from localllm.gguf import GGUFWriter, ValueType  # noqa: E402
from localllm.gguf.constants import GGML_TYPES_BY_NAME  # noqa: E402
from localllm.tokenizer.bpe import BYTE_TO_CHAR  # noqa: E402

N_EMBD, N_FF, N_HEAD, N_KV, HEAD_DIM = 4096, 14336, 32, 8, 128
N_VOCAB, N_SPECIAL = 128_256, 256
# Qwen3-30B-A3B
MOE_EMBD, MOE_HEAD, MOE_KV, MOE_EXPERTS, MOE_USED, MOE_FF, MOE_VOCAB = 2048, 32, 4, 128, 8, 768, 151_936
F16_FIELDS = {"Q4_K": (0, 2), "Q6_K": (208,), "Q8_0": (0,)}  # byte offsets of the float16 scales per block
# Qwen3.5-4B
Q35_EMBD, Q35_FF, Q35_HEAD, Q35_KV, Q35_HEAD_DIM, Q35_VOCAB = 2560, 9216, 16, 4, 256, 248_320
Q35_K_HEADS, Q35_V_HEADS, Q35_STATE, Q35_CONV = 16, 32, 128, 4
# gpt-oss-20b
OSS_EMBD, OSS_HEAD, OSS_KV, OSS_HEAD_DIM, OSS_EXPERTS, OSS_USED, OSS_VOCAB = 2880, 64, 8, 64, 32, 4, 201_088


def more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits: layers whose attn_v / ffn_down get Q6_K in the Q4_K_M mix."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def random_matrix(rng, n_out: int, n_in: int, qtype: str, zero_mean: bool = False, d: float = 5e-4) -> np.ndarray:
    """uint8[n_out, row_bytes] of random blocks whose float16 scales keep values around 0.02 (zero_mean:
    Q4_K blocks without an offset and with scale d, zero_mean_q4_k; Q6_K's are near zero-mean already)."""
    info = GGML_TYPES_BY_NAME[qtype]
    blocks = rng.integers(0, 256, (n_out * n_in // info.block_size, info.type_size), dtype=np.uint8)
    if qtype == "MXFP4":  # an E8M0 exponent byte: 2^-8 times levels up to 12, values around 0.02
        blocks[:, 0] = 120
        return blocks.reshape(n_out, -1)
    scale = np.frombuffer(np.float16({"Q6_K": 2e-4, "Q8_0": 3e-4}.get(qtype, 1e-3)).tobytes(), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        blocks[:, offset : offset + 2] = scale
    if zero_mean and qtype == "Q4_K":
        zero_mean_q4_k(blocks, rng, d)
    return blocks.reshape(n_out, -1)


def zero_mean_q4_k(blocks: np.ndarray, rng, d: float = 5e-4) -> None:
    """Make random Q4_K blocks (uint8[n, 144]) zero-mean: each sub-block's min equal to its scale s_j
    (random 1..15, so the 12 packed bytes need no high bits) and dmin = 7.5 d, so that a value is
    d s_j (q - 7.5). Random offsets would give every hidden row of the MoE shape the same direction, and
    every token the same experts."""
    s = rng.integers(1, 16, (blocks.shape[0], 8), dtype=np.uint8)
    blocks[:, 4:8] = s[:, :4]  # scales of sub-blocks 0-3
    blocks[:, 8:12] = s[:, :4]  # their mins, equal
    blocks[:, 12:16] = s[:, 4:] | (s[:, 4:] << 4)  # sub-blocks 4-7: scale in the low nibble, min in the high
    blocks[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)  # 5e-4: values around 0.02
    blocks[:, 2:4] = np.frombuffer(np.float16(7.5 * d).tobytes(), dtype=np.uint8)  # dmin


def vocabulary(n_vocab: int = N_VOCAB) -> tuple[list[str], list[str], np.ndarray]:
    chars = [BYTE_TO_CHAR[b] for b in range(256)]
    tokens, merges = list(chars), []
    n_regular = n_vocab - N_SPECIAL
    for a in chars:
        for b in chars:
            if len(tokens) == n_regular:
                break
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    i = 0
    while len(tokens) < n_regular:
        pair, c = tokens[256 + i // 256], chars[i % 256]
        tokens.append(pair + c)
        merges.append(f"{pair} {c}")
        i += 1
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    specials += [f"<|reserved_special_token_{k}|>" for k in range(3, 3 + N_SPECIAL - len(specials))]
    types = np.array([1] * len(tokens) + [3] * len(specials), dtype=np.int32)
    return tokens + specials, merges, types


def add_tokenizer(w: GGUFWriter, n_vocab: int) -> None:
    tokens, merges, types = vocabulary(n_vocab)
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.pre", "llama-bpe")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.token_type", types)
    w.add("tokenizer.ggml.merges", merges)
    first_special = n_vocab - N_SPECIAL
    w.add("tokenizer.ggml.bos_token_id", first_special, ValueType.UINT32)
    w.add("tokenizer.ggml.eos_token_id", first_special + 9, ValueType.UINT32)  # <|eot_id|>


def router(rng, n_expert: int, n_embd: int) -> np.ndarray:
    """float32[n_expert, n_embd] with rows of mean zero: the random blocks' values share an offset (every
    element of a hidden row moves together), which would otherwise pick the same experts for every token;
    without it tokens spread over the experts as a trained router spreads them."""
    weights = rng.normal(0, 0.02, (n_expert, n_embd))
    return (weights - weights.mean(axis=1, keepdims=True)).astype(np.float32)


def write_qwen3_moe(path: str, n_layer: int, rng) -> str:
    """The Qwen3-30B-A3B shape's first n_layer layers (module docstring)."""
    e, f, n, d = MOE_EMBD, MOE_FF, MOE_EXPERTS, HEAD_DIM
    w = GGUFWriter(path)
    w.add("general.architecture", "qwen3moe")
    w.add("general.name", "bench-qwen3-30b-a3b-shaped")
    w.add("general.file_type", 15, ValueType.UINT32)  # Q4_K_M
    for key, value in {
        "context_length": 40960, "embedding_length": e, "block_count": n_layer, "feed_forward_length": 6144,
        "attention.head_count": MOE_HEAD, "attention.head_count_kv": MOE_KV, "attention.key_length": d,
        "attention.value_length": d, "expert_count": n, "expert_used_count": MOE_USED, "expert_feed_forward_length": f,
    }.items():
        w.add(f"qwen3moe.{key}", value, ValueType.UINT32)
    w.add("qwen3moe.rope.freq_base", 1000000.0)
    w.add("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6)
    add_tokenizer(w, MOE_VOCAB)
    w.add_tensor("token_embd.weight", random_matrix(rng, MOE_VOCAB, e, "Q4_K", True), "Q4_K", shape=(e, MOE_VOCAB))
    w.add_tensor("output_norm.weight", np.ones(e, np.float32))
    w.add_tensor("output.weight", random_matrix(rng, MOE_VOCAB, e, "Q6_K"), "Q6_K", shape=(e, MOE_VOCAB))
    for il in range(n_layer):
        p = f"blk.{il}."
        heavy = "Q6_K" if more_bits(il, n_layer) else "Q4_K"
        for name, n_in, n_out, qtype in (
            ("attn_q", e, MOE_HEAD * d, "Q4_K"), ("attn_k", e, MOE_KV * d, "Q4_K"), ("attn_v", e, MOE_KV * d, heavy),
            ("attn_output", MOE_HEAD * d, e, "Q4_K"),
        ):
            # random attention is near uniform: its output, nearly the same for every token, is kept small
            # so that the hidden rows (and the experts chosen) stay the tokens' own
            scale = 5e-5 if name == "attn_output" else 5e-4
            w.add_tensor(f"{p}{name}.weight", random_matrix(rng, n_out, n_in, qtype, True, scale), qtype, shape=(n_in, n_out))
        for name, n_in, n_out, qtype in (("ffn_gate_exps", e, f, "Q4_K"), ("ffn_up_exps", e, f, "Q4_K"),
                                         ("ffn_down_exps", f, e, heavy)):
            w.add_tensor(f"{p}{name}.weight", random_matrix(rng, n_out * n, n_in, qtype, True), qtype, shape=(n_in, n_out, n))
        w.add_tensor(p + "ffn_gate_inp.weight", router(rng, n, e))
        for name, size in (("attn_norm", e), ("ffn_norm", e), ("attn_q_norm", d), ("attn_k_norm", d)):
            w.add_tensor(f"{p}{name}.weight", np.ones(size, np.float32))
    return w.write()


def write_qwen35(path: str, n_layer: int, rng) -> str:
    """The Qwen3.5-4B shape's first n_layer layers (module docstring)."""
    from localllm.quantize.recipes import ModelShape, TensorSpec, choose_types

    e, d, s = Q35_EMBD, Q35_HEAD_DIM, Q35_STATE
    key_dim, value_dim = Q35_K_HEADS * s, Q35_V_HEADS * s
    w = GGUFWriter(path)
    w.add("general.architecture", "qwen35")
    w.add("general.name", "bench-qwen3.5-4b-shaped")
    w.add("general.file_type", 15, ValueType.UINT32)  # Q4_K_M
    for key, value in {
        "context_length": 262144, "embedding_length": e, "block_count": n_layer, "feed_forward_length": Q35_FF,
        "attention.head_count": Q35_HEAD, "attention.head_count_kv": Q35_KV, "attention.key_length": d,
        "attention.value_length": d, "rope.dimension_count": d // 4, "ssm.conv_kernel": Q35_CONV,
        "ssm.state_size": s, "ssm.group_count": Q35_K_HEADS, "ssm.time_step_rank": Q35_V_HEADS,
        "ssm.inner_size": value_dim, "full_attention_interval": 4,
    }.items():
        w.add(f"qwen35.{key}", value, ValueType.UINT32)
    w.add("qwen35.rope.dimension_sections", np.array([11, 11, 10, 0], dtype=np.int32))
    w.add("qwen35.rope.freq_base", 10000000.0)
    w.add("qwen35.attention.layer_norm_rms_epsilon", 1e-6)
    add_tokenizer(w, Q35_VOCAB)
    matrices = [("token_embd.weight", e, Q35_VOCAB)]  # (name, n_in, n_out) in llama-quantize's order
    vectors = {"output_norm.weight": np.ones(e, np.float32)}
    for il in range(n_layer):
        p = f"blk.{il}."
        if (il + 1) % 4:
            matrices += [(p + "attn_gate.weight", e, value_dim), (p + "attn_qkv.weight", e, 2 * key_dim + value_dim),
                         (p + "ssm_alpha.weight", e, Q35_V_HEADS), (p + "ssm_beta.weight", e, Q35_V_HEADS),
                         (p + "ssm_out.weight", value_dim, e)]
            vectors[p + "ssm_conv1d.weight"] = rng.normal(0, 0.3, (2 * key_dim + value_dim, Q35_CONV)).astype(np.float32)
            vectors[p + "ssm_a"] = (-np.exp(rng.normal(0, 0.5, Q35_V_HEADS))).astype(np.float32)
            vectors[p + "ssm_dt.bias"] = rng.normal(0, 1, Q35_V_HEADS).astype(np.float32)
            vectors[p + "ssm_norm.weight"] = np.ones(s, np.float32)
        else:
            matrices += [(p + "attn_k.weight", e, Q35_KV * d), (p + "attn_output.weight", Q35_HEAD * d, e),
                         (p + "attn_q.weight", e, 2 * Q35_HEAD * d), (p + "attn_v.weight", e, Q35_KV * d)]
            vectors[p + "attn_q_norm.weight"] = np.ones(d, np.float32)
            vectors[p + "attn_k_norm.weight"] = np.ones(d, np.float32)
        matrices += [(p + "ffn_down.weight", Q35_FF, e), (p + "ffn_gate.weight", e, Q35_FF), (p + "ffn_up.weight", e, Q35_FF)]
        vectors[p + "attn_norm.weight"] = np.ones(e, np.float32)
        vectors[p + "post_attention_norm.weight"] = np.ones(e, np.float32)
    specs = [TensorSpec(name, (n_in, n_out), "F32") for name, n_in, n_out in matrices]
    types = choose_types(specs, "Q4_K_M", ModelShape("qwen35", n_layer, Q35_HEAD, Q35_KV))
    for (name, n_in, n_out), qtype in zip(matrices, types):
        w.add_tensor(name, random_matrix(rng, n_out, n_in, qtype, zero_mean=True), qtype, shape=(n_in, n_out))
    for name, values in vectors.items():
        w.add_tensor(name, values)
    return w.write()


def write_gpt_oss(path: str, n_layer: int, rng) -> str:
    """The gpt-oss-20b shape's first n_layer layers (module docstring)."""
    e, d, n, f = OSS_EMBD, OSS_HEAD_DIM, OSS_EXPERTS, OSS_EMBD
    w = GGUFWriter(path)
    w.add("general.architecture", "gpt-oss")
    w.add("general.name", "bench-gpt-oss-20b-shaped")
    w.add("general.file_type", 38, ValueType.UINT32)  # MXFP4_MOE
    for key, value in {
        "context_length": 131072, "embedding_length": e, "block_count": n_layer, "feed_forward_length": f,
        "attention.head_count": OSS_HEAD, "attention.head_count_kv": OSS_KV, "attention.key_length": d,
        "attention.value_length": d, "rope.dimension_count": d, "expert_count": n, "expert_used_count": OSS_USED,
        "expert_feed_forward_length": f, "attention.sliding_window": 128, "rope.scaling.original_context_length": 4096,
    }.items():
        w.add(f"gpt-oss.{key}", value, ValueType.UINT32)
    w.add("gpt-oss.rope.freq_base", 150000.0)
    w.add("gpt-oss.rope.scaling.type", "yarn")
    w.add("gpt-oss.rope.scaling.factor", 32.0)
    w.add("gpt-oss.attention.layer_norm_rms_epsilon", 1e-5)
    add_tokenizer(w, OSS_VOCAB)

    def vector(name, size, std=0.0, mean=1.0):
        w.add_tensor(name, (mean + rng.normal(0, std, size)).astype(np.float32) if std else np.full(size, mean, np.float32))

    w.add_tensor("token_embd.weight", random_matrix(rng, OSS_VOCAB, e, "Q8_0"), "Q8_0", shape=(e, OSS_VOCAB))
    vector("output_norm.weight", e)
    w.add_tensor("output.weight", random_matrix(rng, OSS_VOCAB, e, "Q8_0"), "Q8_0", shape=(e, OSS_VOCAB))
    for il in range(n_layer):
        p = f"blk.{il}."
        for name, n_in, n_out in (("attn_q", e, OSS_HEAD * d), ("attn_k", e, OSS_KV * d), ("attn_v", e, OSS_KV * d),
                                  ("attn_output", OSS_HEAD * d, e)):
            w.add_tensor(f"{p}{name}.weight", random_matrix(rng, n_out, n_in, "Q8_0"), "Q8_0", shape=(n_in, n_out))
            vector(f"{p}{name}.bias", n_out, 0.02, 0.0)
        for name, n_in, n_out in (("ffn_gate_exps", e, f), ("ffn_up_exps", e, f), ("ffn_down_exps", f, e)):
            w.add_tensor(f"{p}{name}.weight", random_matrix(rng, n_out * n, n_in, "MXFP4"), "MXFP4", shape=(n_in, n_out, n))
            w.add_tensor(f"{p}{name}.bias", rng.normal(0, 0.02, (n, n_out)).astype(np.float32))
        w.add_tensor(p + "ffn_gate_inp.weight", router(rng, n, e))
        vector(p + "ffn_gate_inp.bias", n, 0.02, 0.0)
        vector(p + "attn_sinks.weight", OSS_HEAD, 1.0, 0.0)
        vector(p + "attn_norm.weight", e)
        vector(p + "post_attention_norm.weight", e)
    return w.write()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--shape", choices=("llama3-8b", "qwen3-30b-a3b", "gpt-oss-20b", "qwen3.5-4b"), default="llama3-8b")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    n_layer = args.layers
    writers = {"qwen3-30b-a3b": write_qwen3_moe, "gpt-oss-20b": write_gpt_oss, "qwen3.5-4b": write_qwen35}
    if args.shape in writers:
        path = writers[args.shape](args.path, n_layer, rng)
        print(f"wrote {path} ({os.path.getsize(path) / 1e9:.2f} GB)")
        return

    w = GGUFWriter(args.path)
    w.add("general.architecture", "llama")
    w.add("general.name", "bench-llama3-8b-shaped")
    w.add("general.size_label", "8B")
    w.add("general.file_type", 15, ValueType.UINT32)  # Q4_K_M
    for key, value in {
        "context_length": 8192, "embedding_length": N_EMBD, "block_count": n_layer, "feed_forward_length": N_FF,
        "attention.head_count": N_HEAD, "attention.head_count_kv": N_KV, "rope.dimension_count": HEAD_DIM,
        "vocab_size": N_VOCAB,
    }.items():
        w.add(f"llama.{key}", value, ValueType.UINT32)
    w.add("llama.rope.freq_base", 500000.0)
    w.add("llama.attention.layer_norm_rms_epsilon", 1e-5)
    add_tokenizer(w, N_VOCAB)

    w.add_tensor("token_embd.weight", random_matrix(rng, N_VOCAB, N_EMBD, "Q4_K"), "Q4_K", shape=(N_EMBD, N_VOCAB))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    w.add_tensor("output.weight", random_matrix(rng, N_VOCAB, N_EMBD, "Q6_K"), "Q6_K", shape=(N_EMBD, N_VOCAB))
    for il in range(n_layer):
        p = f"blk.{il}."
        heavy = "Q6_K" if more_bits(il, n_layer) else "Q4_K"
        for name, n_in, n_out, qtype in (
            ("attn_q", N_EMBD, N_HEAD * HEAD_DIM, "Q4_K"), ("attn_k", N_EMBD, N_KV * HEAD_DIM, "Q4_K"),
            ("attn_v", N_EMBD, N_KV * HEAD_DIM, heavy), ("attn_output", N_HEAD * HEAD_DIM, N_EMBD, "Q4_K"),
            ("ffn_gate", N_EMBD, N_FF, "Q4_K"), ("ffn_up", N_EMBD, N_FF, "Q4_K"), ("ffn_down", N_FF, N_EMBD, heavy),
        ):
            w.add_tensor(f"{p}{name}.weight", random_matrix(rng, n_out, n_in, qtype), qtype, shape=(n_in, n_out))
        w.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(N_EMBD, np.float32))
    path = w.write()
    print(f"wrote {path} ({os.path.getsize(path) / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
