"""GGUF files: a validating zero-copy reader and an atomic writer."""

from .constants import GGML_TYPES, GGML_TYPES_BY_NAME, GGMLTypeInfo, ValueType
from .reader import GGUFReader, TensorInfo
from .writer import GGUFWriteError, GGUFWriter

__all__ = [
    "GGML_TYPES",
    "GGML_TYPES_BY_NAME",
    "GGMLTypeInfo",
    "GGUFReader",
    "GGUFWriteError",
    "GGUFWriter",
    "TensorInfo",
    "ValueType",
]
