"""The error a conversion raises for anything in the input directory it cannot use."""

from ..errors import LocalLLMError


class ConversionError(LocalLLMError):
    """A Hugging Face model directory that cannot be converted (missing files, unsupported family,
    settings the engine would run differently from the original model)."""
