"""F32: plain little-endian float32 weights (4 bytes per element, "block" of 1).

Pairs with float32 activations: the dot product is a plain float32 sum (reordered by fast-math).
"""

from __future__ import annotations

import numpy as np

from ..jit import exact_kernel
from . import QuantType
from .blocks import as_blocks

def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., 4n] -> float32[..., n]."""
    values = as_blocks(raw, 4, "F32").view(np.float32).copy()
    return values.reshape(*np.shape(raw)[:-1], -1)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., 4n]."""
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint8).copy()


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[4n] -> out: float32[n]."""
    values = src.view(np.float32)
    for j in range(out.shape[0]):
        out[j] = values[j]


QUANT = QuantType(name="F32", act="f32", dequantize=dequantize, dequantize_row=dequantize_row, quantize=quantize)
