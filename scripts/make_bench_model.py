#!/usr/bin/env python3
"""Write a Llama-3-8B-shaped GGUF with random weights in llama.cpp's Q4_K_M mix, for speed tests.

    python scripts/make_bench_model.py bench-llama3-8b-q4_k_m.gguf [--layers 32]

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
F16_FIELDS = {"Q4_K": (0, 2), "Q6_K": (208,)}  # byte offsets of the float16 scale fields per block


def more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits: layers whose attn_v / ffn_down get Q6_K in the Q4_K_M mix."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def random_matrix(rng, n_out: int, n_in: int, qtype: str) -> np.ndarray:
    """uint8[n_out, row_bytes] of random blocks whose float16 scales keep values around 0.02."""
    info = GGML_TYPES_BY_NAME[qtype]
    blocks = rng.integers(0, 256, (n_out * n_in // info.block_size, info.type_size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(2e-4 if qtype == "Q6_K" else 1e-3).tobytes(), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        blocks[:, offset : offset + 2] = scale
    return blocks.reshape(n_out, -1)


def vocabulary() -> tuple[list[str], list[str], np.ndarray]:
    chars = [BYTE_TO_CHAR[b] for b in range(256)]
    tokens, merges = list(chars), []
    n_regular = N_VOCAB - N_SPECIAL
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    n_layer = args.layers

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
    tokens, merges, types = vocabulary()
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.pre", "llama-bpe")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.token_type", types)
    w.add("tokenizer.ggml.merges", merges)
    w.add("tokenizer.ggml.bos_token_id", 128000, ValueType.UINT32)
    w.add("tokenizer.ggml.eos_token_id", 128009, ValueType.UINT32)

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
