"""Architecture registry: `general.architecture` -> (module, class). One line per architecture."""

from __future__ import annotations

import importlib

from ...errors import UnsupportedArchitecture

ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "Llama"),
    "qwen2": ("qwen2", "Qwen2"),
    "qwen3": ("qwen3", "Qwen3"),
    "gemma2": ("gemma2", "Gemma2"),
    "gemma3": ("gemma3", "Gemma3"),
    "gemma4": ("gemma4", "Gemma4"),
    "olmo2": ("olmo2", "Olmo2"),
    "smollm3": ("smollm3", "SmolLM3"),
    "granite": ("granite", "Granite"),
    "phi3": ("phi3", "Phi3"),
    "mistral3": ("mistral3", "Mistral3"),
    "qwen2moe": ("qwen2moe", "Qwen2Moe"),
    "qwen3moe": ("qwen3moe", "Qwen3Moe"),
    "olmoe": ("olmoe", "Olmoe"),
    "gpt-oss": ("gpt_oss", "GptOss"),
    "qwen35": ("qwen35", "Qwen35"),
    "qwen35moe": ("qwen35moe", "Qwen35Moe"),
    "qwen3next": ("qwen3next", "Qwen3Next"),
    "bert": ("bert", "Bert"),
    "nomic-bert": ("bert", "NomicBert"),
}


def architecture_class(name: str | None):
    if name not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"unsupported architecture {name!r} (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    module, cls = ARCHITECTURES[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)
