"""Quant formats: one module per ggml type, registered in one table (`_MODULES`).

Each module defines `QUANT = QuantType(...)` with:
- the block layout documented field by field in its docstring;
- `dequantize`: vectorised NumPy reference, uint8[..., row_bytes] -> float32[..., n] (bit-exact with llama.cpp);
- `dequantize_row`: Numba kernel (src: uint8[row_bytes], out: float32[n]) -> None, bit-exact with the reference;
- `vec_dot`: Numba kernel, dot product of one weight row with an activation vector quantized to the
  type's pairing format `act` (see activation.py):
    act "f32":  vec_dot(w: uint8[row_bytes], x: float32[n]) -> float32
    act "q8_0": vec_dot(w, qs: int8[n], d: float32[n/32], s: int32[n/32]) -> float32   (s = sum of qs per block)
    act "q8_k": vec_dot(w, qs: int8[n], d: float32[n/256], s: int32[n/16]) -> float32  (s = sum of qs per 16)
- `quantize`: NumPy quantizer float32[..., n] -> uint8[..., row_bytes], or None where localllm has none.

Adding a type: write its module, add its name to `_MODULES`. Tests are parametrised over `all_types()`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..errors import UnsupportedQuantType
from ..gguf.constants import GGML_TYPES, GGML_TYPES_BY_NAME, GGMLTypeInfo

ACT_KINDS = ("f32", "q8_0", "q8_k")


@dataclass(frozen=True)
class QuantType:
    name: str
    act: str
    dequantize: Callable[[np.ndarray], np.ndarray]
    dequantize_row: Callable
    vec_dot: Callable
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
