"""F16: IEEE half-precision weights (2 bytes per element, "block" of 1).

Pairs with float32 activations (llama.cpp converts the activation to F16 instead; keeping it in float32
is at least as accurate). Each half is widened exactly with the `f16_to_f32` intrinsic (F16C on x86).
"""

from __future__ import annotations

import numpy as np

from ..jit import exact_kernel, f16_to_f32
from . import QuantType
from .blocks import as_blocks

def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., 2n] -> float32[..., n]."""
    values = as_blocks(raw, 2, "F16").view(np.float16).astype(np.float32)
    return values.reshape(*np.shape(raw)[:-1], -1)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., 2n], rounding to nearest even (as ggml's fp32 -> fp16)."""
    with np.errstate(over="ignore"):  # beyond 65504 is inf in half precision, as in ggml
        return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint8)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[2n] -> out: float32[n]."""
    bits = src.view(np.uint16)
    for j in range(out.shape[0]):
        out[j] = f16_to_f32(bits[j])


QUANT = QuantType(name="F16", act="f32", dequantize=dequantize, dequantize_row=dequantize_row, quantize=quantize)
