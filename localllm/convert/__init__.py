"""Hugging Face checkpoints (config.json + safetensors + tokenizer) to GGUF."""

from .errors import ConversionError
from .hf import OUT_TYPES, convert_checkpoint

__all__ = ["ConversionError", "OUT_TYPES", "convert_checkpoint"]
