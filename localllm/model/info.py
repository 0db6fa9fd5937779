"""What a GGUF file holds, summarised for `localllm show` and the memory estimate.

Reads metadata and tensor infos only (no tensor data is touched).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..gguf.constants import FILE_TYPES
from . import hparams


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
    hyperparameters = hparams.summary(reader)  # context_length ... rope_freq_base, null when absent
    return {
        "path": str(reader.path),
        "architecture": reader.architecture,
        "name": meta.get_str("general.name", None),
        "parameters": int(sum(t.n_elements for t in tensors)),
        "file_size": reader.file_size,
        "gguf_version": reader.version,
        "file_type": FILE_TYPES.get(file_type, f"unknown ({file_type})") if file_type is not None else None,
        **hyperparameters,
        "quant_mix": dict(sorted(mix.items(), key=lambda kv: -kv[1]["bytes"])),
        "n_tensors": len(reader.tensors),
        "tokenizer_model": meta.get_str("tokenizer.ggml.model", None),
        "vocab_size": len(tokens) if tokens is not None else None,
        "chat_template": reader.get("tokenizer.chat_template") is not None,
    }


def count_by_type(reader) -> Counter:
    return Counter(t.ggml_type.name for t in reader.tensors.values())
