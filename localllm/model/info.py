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
    n_expert, n_used = experts(reader)
    parameters = int(sum(t.n_elements for t in tensors))
    expert_parameters = sum(t.n_elements for t in tensors if t.name.endswith("_exps.weight"))
    return {
        "path": str(reader.path),
        "architecture": reader.architecture,
        "name": meta.get_str("general.name", None),
        "parameters": parameters,
        "n_expert": n_expert,
        "n_expert_used": n_used,
        "active_parameters": parameters - (expert_parameters - expert_parameters * n_used // n_expert if n_expert else 0),
        "bytes_per_token": bytes_per_token(reader),
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


def experts(reader) -> tuple:
    """(expert_count, expert_used_count) of a mixture of experts, as the file states them; (None, None)
    for a dense model (or a file whose counts are missing, wrong-typed or inconsistent)."""
    meta = reader.metadata
    n_expert = hparams.peek_count(reader, "n_expert")
    try:
        n_used = meta.get_int(reader.arch_key("expert_used_count"), None, min=1, per_layer=True)
    except Exception:  # a file that may not load is still described
        n_used = None
    if not n_expert or not n_used or n_used > n_expert:
        return None, None
    return n_expert, n_used


def bytes_per_token(reader) -> int:
    """Weight bytes one decode step reads: every tensor, except that the embedding table gives one row
    unless it is also the (tied) output matrix, and an expert tensor (`*_exps`) its used experts' share."""
    n_expert, n_used = experts(reader)
    total = 0
    for info in reader.tensors.values():
        if info.name == "token_embd.weight" and "output.weight" in reader.tensors:
            total += info.row_bytes
        elif n_expert and info.name.endswith("_exps.weight"):
            total += info.nbytes * n_used // n_expert
        else:
            total += info.nbytes
    return total


def count_by_type(reader) -> Counter:
    return Counter(t.ggml_type.name for t in reader.tensors.values())
