"""Turn what a user typed as MODEL into a local file path."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelNotFound
from .default_model import DEFAULT_MODEL_NAME, default_model_path


def resolve_model(name: str | None) -> Path:
    """None or the default model's name -> the PyPI-shipped Gemma file; an existing path -> itself."""
    if name is None or name == DEFAULT_MODEL_NAME:
        return default_model_path()
    path = Path(name).expanduser()
    if path.exists():
        return path
    raise ModelNotFound(
        f"no model named '{name}': give a path to a .gguf file, or '{DEFAULT_MODEL_NAME}' (the default)"
    )
