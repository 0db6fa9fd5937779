"""MXFP4 (OCP microscaling FP4): 32 weights per 17-byte block, 4-bit E2M1 codes under a power-of-two scale.

Block layout (ggml `block_mxfp4`), little-endian:
  byte 0        e        E8M0 exponent: the block's scale is 2^(e - 128) (ggml's E8M0_TO_FP32_HALF: the
                         half of 2^(e - 127), since the table below holds the E2M1 values doubled)
  bytes 1..16   qs[16]   4-bit codes: element l (l < 16) is the low nibble of qs[l], element l + 16 its
                         high nibble
Weight = scale * KVALUES[code], KVALUES = ggml's kvalues_mxfp4 (E2M1's 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
their negatives, doubled to integers). gpt-oss ships its experts in it.

Pairs with q8_0 activations (llama.cpp's vec_dot_type Q8_0). The quantizer is ggml's
quantize_row_mxfp4_ref (what llama-quantize runs): e = floor(log2(max |x|)) - 2 + 127 (0 for an all-zero
block), each element to the code whose value is nearest (the first of equals).
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from ..jit import exact_kernel
from . import QuantType
from .blocks import as_blocks, as_float_blocks

BLOCK = 32
BLOCK_BYTES = 17

# ggml-common.h kvalues_mxfp4 (E2M1 values times 2)
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
LEVELS = KVALUES.astype(np.float32)


def scales(e: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> float32 2^(e - 128) (e < 2: the subnormals 2^-128, 2^-127), as ggml builds them."""
    e = np.asarray(e, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*17] -> float32[..., nb*32]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "MXFP4")
    qs = blocks[:, 1:]
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1)
    values = KVALUES[codes].astype(np.float32)
    return (scales(blocks[:, 0])[:, None] * values).reshape(*np.shape(raw)[:-1], -1)


@exact_kernel
def scale_of(e):
    """float32 2^(e - 128) of one E8M0 byte, exact (scales(); e 0 and 1 give float32's subnormals)."""
    return np.float32(math.ldexp(1.0, np.int64(e) - 128))


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*17] -> out: float32[nb*32], scale * KVALUES[code] (dequantize's bits)."""
    for b in range(out.shape[0] // BLOCK):
        base = b * BLOCK_BYTES
        d = scale_of(src[base])
        for l in range(16):
            q = src[base + 1 + l]
            out[b * BLOCK + l] = d * LEVELS[q & 15]
            out[b * BLOCK + 16 + l] = d * LEVELS[q >> 4]


@exact_kernel
def nearest_code(x, d):
    """The code whose value d * KVALUES[code] is nearest x (float32), the first of equals (best_index_mxfp4)."""
    best = 0
    best_err = abs(LEVELS[0] * d - x)
    for i in range(1, 16):
        err = abs(LEVELS[i] * d - x)
        if err < best_err:
            best = i
            best_err = err
    return best


@exact_kernel(parallel=True)
def _quantize_blocks(x, exponents, out):
    """x: float32[nb, 32], exponents: uint8[nb] -> out: uint8[nb, 17]; blocks are independent."""
    for b in prange(x.shape[0]):
        e = exponents[b]
        d = scale_of(e)
        out[b, 0] = e
        for l in range(16):
            out[b, 1 + l] = nearest_code(x[b, l], d) | (nearest_code(x[b, 16 + l], d) << 4)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/32*17], as ggml's quantize_row_mxfp4_ref."""
    blocks = as_float_blocks(x, BLOCK, "MXFP4")
    amax = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore"):
        # floorf(log2f(amax)): float32's log2 of a float32 is exact at powers of two, where the floor moves
        exponent = np.where(amax > 0, np.floor(np.log2(amax.astype(np.float32))) - 2 + 127, 0)
    out = np.empty((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    _quantize_blocks(blocks, exponent.astype(np.int64).astype(np.uint8), out)
    return out.reshape(*np.shape(x)[:-1], -1)


QUANT = QuantType(
    name="MXFP4",
    act="q8_0",
    dequantize=dequantize,
    dequantize_row=dequantize_row,
    quantize=quantize,
)
