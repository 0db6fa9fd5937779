"""The local models directory: plain .gguf files with readable names, usable by other tools too."""

from __future__ import annotations

from pathlib import Path

from .. import runtime


def models_dir() -> Path:
    """$LOCALLLM_MODELS, else <user cache>/localllm/models (XDG_CACHE_HOME respected). Not created here."""
    return runtime.models_dir()
