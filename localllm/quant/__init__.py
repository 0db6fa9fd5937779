"""Quant formats: one module per ggml type, registered in one table (`_MODULES`). Formats only: the CPU
backend's dot products and multi-row kernels for each type are in localllm/backends/cpu/quant_kernels/
(one record per type there), CUDA's in localllm/backends/cuda/.

Each module defines `QUANT = QuantType(...)` with:
- the block layout documented field by field in its docstring;
- `dequantize`: vectorised NumPy reference, uint8[..., row_bytes] -> float32[..., n] (bit-exact with llama.cpp);
- `dequantize_row`: plain Numba kernel (src: uint8[row_bytes], out: float32[n]) -> None, IEEE arithmetic,
  bit-exact with the reference;
- `act`: the activation format its dot products pair with (see activation.py): "f32", "q8_0" (int8
  quants, a float32 scale and an int32 sum per 32) or "q8_k" (a scale per 256, a sum per 16);
- `quantize`: NumPy quantizer float32[..., n] -> uint8[..., row_bytes], or None where localllm has none.
Shared block helpers are in blocks.py, the K-quants' fitting search in kquant_fit.py.

Adding a type: write its module, add its name to `_MODULES` (and its CPU kernel record). Tests are
parametrised over `all_types()`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..errors import UnsupportedQuantType
from ..gguf.constants import GGML_TYPES, GGML_TYPES_BY_NAME, GGMLTypeInfo
from ..jit import configure_numba

ACT_KINDS = ("f32", "q8_0", "q8_k")


@dataclass(frozen=True)
class QuantType:
    name: str
    act: str
    dequantize: Callable[[np.ndarray], np.ndarray]
    dequantize_row: Callable
    quantize: Optional[Callable[[np.ndarray], np.ndarray]] = None

    @property
    def info(self) -> GGMLTypeInfo:
        return GGML_TYPES_BY_NAME[self.name]

    @property
    def type_id(self) -> int:
        return self.info.type_id

    @property
    def block_size(self) -> int:
        return self.info.block_size

    @property
    def type_size(self) -> int:
        return self.info.type_size

    def row_bytes(self, n: int) -> int:
        return self.info.row_bytes(n)


# The registry table: ggml type name -> module under localllm.quant.
_MODULES: dict[str, str] = {
    "F32": "f32",
    "F16": "f16",
    "BF16": "bf16",
    "Q4_0": "q4_0",
    "Q4_1": "q4_1",
    "Q5_0": "q5_0",
    "Q5_1": "q5_1",
    "Q8_0": "q8_0",
    "Q2_K": "q2_k",
    "Q3_K": "q3_k",
    "Q4_K": "q4_k",
    "Q5_K": "q5_k",
    "Q6_K": "q6_k",
    "Q8_K": "q8_k",
    "IQ4_NL": "iq4_nl",
    "IQ4_XS": "iq4_xs",
    "MXFP4": "mxfp4",
}

_loaded: dict[str, QuantType] = {}


def supported_names() -> list[str]:
    return list(_MODULES)


def get(name_or_id: str | int) -> QuantType:
    """The QuantType for a ggml type name or id; UnsupportedQuantType if localllm has no kernels for it."""
    if isinstance(name_or_id, (int, np.integer)):
        info = GGML_TYPES.get(int(name_or_id))
        name = info.name if info else f"type id {int(name_or_id)}"
    else:
        name = str(name_or_id).upper()
    if name not in _MODULES:
        raise UnsupportedQuantType(
            f"tensor type {name} is not supported (supported: {', '.join(_MODULES)})"
        )
    if name not in _loaded:
        configure_numba()  # before the module's kernels are compiled (idempotent)
        module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
        _loaded[name] = module.QUANT
    return _loaded[name]


def is_supported(name_or_id: str | int) -> bool:
    try:
        get(name_or_id)
    except UnsupportedQuantType:
        return False
    return True


def all_types() -> list[QuantType]:
    return [get(name) for name in _MODULES]
