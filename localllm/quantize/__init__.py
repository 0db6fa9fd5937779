"""`localllm quantize`: GGUF -> GGUF with llama.cpp's per-tensor mixes (recipes), a plan (types, sizes),
and a streaming run (one tensor at a time, temporary file renamed into place when complete)."""

from .plan import QuantizePlan, TensorPlan, make_plan
from .recipes import FILE_TYPES, QuantizeError, choose_types
from .run import QuantizeResult, dry_run, quantize_file

__all__ = [
    "FILE_TYPES",
    "QuantizeError",
    "QuantizePlan",
    "QuantizeResult",
    "TensorPlan",
    "choose_types",
    "dry_run",
    "make_plan",
    "quantize_file",
]
