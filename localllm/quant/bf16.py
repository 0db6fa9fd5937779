"""BF16: bfloat16 weights, the top 16 bits of a float32 (2 bytes per element, "block" of 1).

Widening is exact: the bits shifted left by 16. Pairs with float32 activations.
"""

from __future__ import annotations

import numpy as np

from ..jit import exact_kernel, u32_as_f32
from . import QuantType
from .blocks import as_blocks

def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., 2n] -> float32[..., n]."""
    bits = as_blocks(raw, 2, "BF16").view(np.uint16).astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32).reshape(*np.shape(raw)[:-1], -1)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., 2n], as ggml's fp32 -> bf16: NaNs become quiet NaNs (sign and top
    payload bits kept, quiet bit set), everything else rounds to nearest even on the 16 dropped bits."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    quiet = ((bits & 0xFFFF0000) >> 16) | 0x40
    return np.where(is_nan, quiet, rounded).astype(np.uint16).view(np.uint8)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[2n] -> out: float32[n]."""
    bits = src.view(np.uint16)
    for j in range(out.shape[0]):
        out[j] = u32_as_f32(np.uint32(bits[j]) << np.uint32(16))


QUANT = QuantType(name="BF16", act="f32", dequantize=dequantize, dequantize_row=dequantize_row, quantize=quantize)
