"""Tiny random models of each architecture, written as GGUF by our own writer.

Sizes are the smallest that every quant type can hold (rows a multiple of 256 for the K-quants) while
keeping every architectural feature in play: GQA (4 query heads over 2 KV heads), partial windows
(Gemma 3 gets six layers so a global layer follows five sliding-window layers, and a window shorter
than the test prompts), biases (qwen2), Q/K norms (qwen3, gemma3), llama3 RoPE frequency factors.
"""

from __future__ import annotations

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


ARCH_LAYERS = {"llama": 2, "qwen2": 2, "qwen3": 2, "gemma3": 6}


def write_tiny_model(path, arch: str, qtype: str = "F32", seed: int = 0) -> str:
    """Write a random `arch` model with its matrices in `qtype` (norms and biases F32) to `path`."""
    rng = np.random.default_rng(seed)
    n_layer = ARCH_LAYERS[arch]
    w = GGUFWriter(path)
    w.add("general.architecture", arch)
    w.add("general.name", f"tiny-{arch}-{qtype}")
    for key, value in {
        "context_length": 256,
        "embedding_length": N_EMBD,
        "block_count": n_layer,
        "feed_forward_length": N_FF,
        "attention.head_count": N_HEAD,
        "attention.head_count_kv": N_KV,
        "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM,
        "rope.dimension_count": HEAD_DIM,
    }.items():
        w.add(f"{arch}.{key}", value, ValueType.UINT32)
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add(f"{arch}.rope.freq_base", 10000.0 if arch != "gemma3" else 1000000.0)
    if arch == "gemma3":
        w.add("gemma3.attention.sliding_window", WINDOW, ValueType.UINT32)
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

    # token_embd std 1/sqrt(E) keeps logits O(1); gemma scales embeddings by sqrt(E) itself.
    matrix("token_embd.weight", N_EMBD, N_VOCAB, std=0.5 if arch != "gemma3" else 0.05)
    vector("output_norm.weight", N_EMBD)
    if arch == "llama":
        matrix("output.weight", N_EMBD, N_VOCAB, std=0.1)
        w.add_tensor("rope_freqs.weight", rng.uniform(1.0, 8.0, HEAD_DIM // 2).astype(np.float32))
    q_out, kv_out = N_HEAD * HEAD_DIM, N_KV * HEAD_DIM
    for il in range(n_layer):
        p = f"blk.{il}."
        vector(p + "attn_norm.weight", N_EMBD)
        matrix(p + "attn_q.weight", N_EMBD, q_out)
        matrix(p + "attn_k.weight", N_EMBD, kv_out)
        matrix(p + "attn_v.weight", N_EMBD, kv_out)
        matrix(p + "attn_output.weight", q_out, N_EMBD)
        vector(p + "ffn_norm.weight", N_EMBD)
        matrix(p + "ffn_gate.weight", N_EMBD, N_FF)
        matrix(p + "ffn_up.weight", N_EMBD, N_FF)
        matrix(p + "ffn_down.weight", N_FF, N_EMBD)
        if arch == "qwen2":
            for name, n in (("attn_q.bias", q_out), ("attn_k.bias", kv_out), ("attn_v.bias", kv_out)):
                vector(p + name, n, mean=0.0, std=0.5)
        if arch in ("qwen3", "gemma3"):
            vector(p + "attn_q_norm.weight", HEAD_DIM)
            vector(p + "attn_k_norm.weight", HEAD_DIM)
        if arch == "gemma3":
            vector(p + "post_attention_norm.weight", N_EMBD)
            vector(p + "post_ffw_norm.weight", N_EMBD)
    w.write()
    return str(path)
