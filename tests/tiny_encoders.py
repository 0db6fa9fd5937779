"""Tiny random embedding models, written as GGUF by our own writer: the encoders `bert` and `nomic-bert`
(with a small WordPiece vocabulary) and decoders used as embedders, for the llama.cpp embeddings oracle
(scripts/llamacpp_embeddings.py records, tests/model/test_embeddings.py checks).

Each file states its pooling in `<arch>.pooling_type` as llama.cpp's converter writes it (1 mean, 2 CLS,
3 last), except "llama-nopool", a decoder with none (llama.cpp then gives one vector per token).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localllm.gguf import GGUFWriter
from localllm.gguf.constants import ValueType
from tiny_models import TinyArch, quantized_matrix, write_tiny_model

N_EMBD, N_HEAD, HEAD_DIM, N_FF, N_LAYER, N_CTX = 256, 4, 64, 512, 2, 128

# name -> (general.architecture, pooling_type or None, what else): the encoders written here
TINY_ENCODERS = {
    "bert": dict(pooling=1),  # mean; learned positions, token types, separate Q/K/V with biases, GELU
    "nomic-bert": dict(pooling=2),  # CLS; RoPE (base 1000), fused QKV, SwiGLU, token types
}
# decoders used as embedders: tiny_models' layouts with a pooling type
TINY_DECODERS = {
    "qwen3-last": TinyArch(architecture="qwen3", qk_norm="head", metadata={"pooling_type": 3}),
    "llama-nopool": TinyArch(output=True, rope_freqs=True, architecture="llama"),
}
EMBED_MODELS = tuple(TINY_ENCODERS) + tuple(TINY_DECODERS)
EMBED_TYPES = ("F32", "Q8_0")
EMBED_SEED = 11
# Texts for the oracle: short and long, punctuation, digits, capitals (lowercased by WordPiece), a word
# no piece starts (the unknown token), and one past 32 tokens
EMBED_TEXTS = (
    "the quick brown fox",
    "Hello, world! 42 cats.",
    "a",
    "zebras don't sing; they hum quietly at night, and the dog barks back twice before the morning light "
    "comes over the hills",
    "naïve café Ωmega",
)

WORDS = ("the", "quick", "brown", "fox", "hello", "world", "cat", "dog", "sing", "night", "light", "morning",
         "hill", "back", "twice", "before", "and", "they", "at", "over", "comes")


def wpm_vocab() -> tuple[list[str], list[int]]:
    """A WordPiece vocabulary as llama.cpp's converter writes BERT's: [PAD] 0, [UNK] 100, [CLS] 101,
    [SEP] 102, [MASK] 103; word-initial pieces with "▁", continuation pieces bare. Letters, digits and
    punctuation in both forms, so that every ASCII word tokenizes; a few whole words and suffixes."""
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    types = [3] + [5] * 99 + [2, 3, 3, 3]
    pieces = [c for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    normal = ["▁" + c for c in pieces + list(".,!?;'-")] + pieces + ["▁" + w for w in WORDS] + ["ed", "ing", "ly"]
    tokens += normal
    types += [1] * len(normal)
    return tokens, types


def write_tiny_encoder(path, name: str, qtype: str = "F32", seed: int = EMBED_SEED) -> str:
    """A random `name` encoder (TINY_ENCODERS) with matrices and embedding tables in `qtype`, norms and
    biases F32."""
    rng = np.random.default_rng(seed)
    arch = name
    nomic = arch == "nomic-bert"
    tokens, types = wpm_vocab()
    n_vocab = len(tokens)
    w = GGUFWriter(path)
    w.add("general.architecture", arch)
    w.add("general.name", f"tiny-{name}-{qtype}")
    for key, value in (("context_length", N_CTX), ("embedding_length", N_EMBD), ("block_count", N_LAYER),
                       ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", N_HEAD), ("pooling_type", TINY_ENCODERS[name]["pooling"])):
        w.add(f"{arch}.{key}", value, ValueType.UINT32)
    w.add(f"{arch}.attention.layer_norm_epsilon", 1e-12)
    w.add(f"{arch}.attention.causal", False)
    if nomic:
        w.add(f"{arch}.rope.freq_base", 1000.0)
    w.add("tokenizer.ggml.model", "bert")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.token_type", np.array(types, dtype=np.int32))
    w.add("tokenizer.ggml.token_type_count", 2, ValueType.UINT32)
    for key, value in (("bos_token_id", 101), ("seperator_token_id", 102), ("unknown_token_id", 100),
                       ("padding_token_id", 0), ("mask_token_id", 103)):
        w.add(f"tokenizer.ggml.{key}", value, ValueType.UINT32)

    def matrix(tensor, n_in, n_out, std=0.05):
        w.add_tensor(tensor, quantized_matrix(rng, n_out, n_in, qtype, std), qtype, shape=(n_in, n_out))

    def vector(tensor, n, mean=1.0, std=0.1):
        w.add_tensor(tensor, (mean + rng.normal(0, std, n)).astype(np.float32))

    matrix("token_embd.weight", N_EMBD, n_vocab, std=0.5)
    # F32 whatever qtype: llama.cpp adds its row as it lies (ggml_add of a view), and llama-quantize leaves it
    w.add_tensor("token_types.weight", rng.normal(0, 0.3, (2, N_EMBD)).astype(np.float32))
    if not nomic:
        matrix("position_embd.weight", N_EMBD, N_CTX, std=0.3)
    vector("token_embd_norm.weight", N_EMBD)
    vector("token_embd_norm.bias", N_EMBD, mean=0.0)
    for il in range(N_LAYER):
        p = f"blk.{il}."
        if nomic:
            matrix(p + "attn_qkv.weight", N_EMBD, 3 * N_EMBD, std=0.1)
        else:
            for part in "qkv":
                matrix(p + f"attn_{part}.weight", N_EMBD, N_EMBD, std=0.1)
                vector(p + f"attn_{part}.bias", N_EMBD, mean=0.0, std=0.2)
        matrix(p + "attn_output.weight", N_EMBD, N_EMBD)
        vector(p + "attn_output.bias", N_EMBD, mean=0.0)
        vector(p + "attn_output_norm.weight", N_EMBD)
        vector(p + "attn_output_norm.bias", N_EMBD, mean=0.0)
        matrix(p + "ffn_up.weight", N_EMBD, N_FF, std=0.1)
        if nomic:
            matrix(p + "ffn_gate.weight", N_EMBD, N_FF, std=0.1)
        else:
            vector(p + "ffn_up.bias", N_FF, mean=0.0, std=0.5)
        matrix(p + "ffn_down.weight", N_FF, N_EMBD)
        if not nomic:
            vector(p + "ffn_down.bias", N_EMBD, mean=0.0)
        vector(p + "layer_output_norm.weight", N_EMBD)
        vector(p + "layer_output_norm.bias", N_EMBD, mean=0.0)
    w.write()
    return str(path)


def embed_model(directory: Path, name: str, qtype: str) -> Path:
    """The oracle's tiny embedding model `name` (EMBED_MODELS) in `qtype`, written into `directory`."""
    path = Path(directory) / f"{name}-{qtype}.gguf"
    if name in TINY_ENCODERS:
        write_tiny_encoder(path, name, qtype)
    else:
        spec = TINY_DECODERS[name]
        write_tiny_model(path, name, qtype, seed=EMBED_SEED, spec=spec)
    return path
