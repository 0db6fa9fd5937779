"""The local models directory: plain .gguf files with readable names, usable by other tools too."""

from __future__ import annotations

import os
from pathlib import Path


def models_dir() -> Path:
    """$LOCALLLM_MODELS, else <user cache>/localllm/models (XDG_CACHE_HOME respected). Not created here."""
    configured = os.environ.get("LOCALLLM_MODELS")
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "localllm" / "models"
