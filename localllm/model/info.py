"""What a GGUF file holds, summarised for `localllm show` and the memory estimate.

Reads metadata and tensor infos only (no tensor data is touched).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..gguf.constants import FILE_TYPES


def _as_int(reader, suffix: str):
    """An integer '<arch>.<suffix>' (per-layer arrays shown as their largest entry), None when absent; a
    wrong-typed value is the GGUFError that load would raise, naming the key."""
    return reader.metadata.get_int(reader.arch_key(suffix), None, min=0, per_layer=True)


def describe(reader) -> dict[str, Any]:
    """A JSON-serialisable summary of the model in `reader` (a GGUFReader). Keys are documented in docs/cli.md."""
    tensors = reader.tensors.values()
    mix: dict[str, dict[str, int]] = {}
    for tensor in tensors:
        entry = mix.setdefault(tensor.ggml_type.name, {"tensors": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["bytes"] += tensor.nbytes
    meta = reader.metadata
    tokens = meta.get_array("tokenizer.ggml.tokens", "str", None)
    file_type = meta.get_int("general.file_type", None)
    n_head = _as_int(reader, "attention.head_count")
    n_embd = _as_int(reader, "embedding_length")
    head_dim = _as_int(reader, "attention.key_length")
    if head_dim is None and n_head:
        head_dim = n_embd // n_head if n_embd else None
    return {
        "path": str(reader.path),
        "architecture": reader.architecture,
        "name": meta.get_str("general.name", None),
        "parameters": int(sum(t.n_elements for t in tensors)),
        "file_size": reader.file_size,
        "gguf_version": reader.version,
        "file_type": FILE_TYPES.get(file_type, f"unknown ({file_type})") if file_type is not None else None,
        "context_length": _as_int(reader, "context_length"),
        "n_layers": _as_int(reader, "block_count"),
        "n_embd": n_embd,
        "n_ff": _as_int(reader, "feed_forward_length"),
        "n_head": n_head,
        "n_head_kv": _as_int(reader, "attention.head_count_kv") or n_head,
        "head_dim": head_dim,
        "sliding_window": _as_int(reader, "attention.sliding_window"),
        "rope_freq_base": meta.get_float(reader.arch_key("rope.freq_base"), None),
        "quant_mix": dict(sorted(mix.items(), key=lambda kv: -kv[1]["bytes"])),
        "n_tensors": len(reader.tensors),
        "tokenizer_model": meta.get_str("tokenizer.ggml.model", None),
        "vocab_size": len(tokens) if tokens is not None else None,
        "chat_template": reader.get("tokenizer.chat_template") is not None,
    }


def count_by_type(reader) -> Counter:
    return Counter(t.ggml_type.name for t in reader.tensors.values())
