"""IQ4_NL: 32 weights per 18-byte block, 4-bit indices into a fixed non-linear table.

Block layout (ggml `block_iq4_nl`), little-endian:
  bytes 0..1    d        float16   scale
  bytes 2..17   qs[16]   4-bit indices: element l (l < 16) is the low nibble of qs[l], element l + 16
                         its high nibble
Weight = d * KVALUES[index], KVALUES = ggml's kvalues_iq4nl (16 int8 levels, denser near zero).

Pairs with q8_0 activations (llama.cpp's vec_dot_type Q8_0). IQ4_XS shares the table.

The quantizer is ggml's `quantize_iq4_nl` without an importance matrix (what llama-quantize runs; the
`_ref` row function differs: it skips the scale search). Per 32-element block, with weights x^2: start
from the scale that maps the largest |x| onto the table's end, fit the least-squares scale for the
nearest levels, try 15 stretched grids around it and keep the best weighted fit. Checked bit for bit
against ggml's C function (tests/data/quantize/iq4_reference.npz, docs/quantize.md).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..jit import exact_kernel, f32_to_f16_bits, read_f16
from . import QuantType
from .blocks import as_blocks, as_float_blocks, f16_field

BLOCK = 32
BLOCK_BYTES = 18

# ggml-common.h kvalues_iq4nl
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
# The levels as float32, for the quantizer's arithmetic (a float32-by-int8 product would widen to float64).
LEVELS = KVALUES.astype(np.float32)
GROUP_MAX_EPS = np.float32(1e-15)  # ggml: a block whose largest |x| is below this gets scale 0
N_TRY = 7  # grids tried on each side of the first fit (ggml's ntry in quantize_iq4_nl / quantize_iq4_xs)


def lookup_nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8[nb, k, 16] packed index bytes -> int8[nb, k, 32] table values (low nibbles first)."""
    return KVALUES[np.concatenate([qs & 15, qs >> 4], axis=-1)]


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*18] -> float32[..., nb*32]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "IQ4_NL")
    values = lookup_nibbles(blocks[:, 2:].reshape(-1, 1, 16)).reshape(-1, BLOCK).astype(np.float32)
    return (f16_field(blocks, 0) * values).reshape(*np.shape(raw)[:-1], -1)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*18] -> out: float32[nb*32]."""
    for b in range(out.shape[0] // BLOCK):
        d = read_f16(src, b * BLOCK_BYTES)
        base = b * BLOCK_BYTES + 2
        for l in range(16):
            q = src[base + l]
            out[b * BLOCK + l] = d * np.float32(KVALUES[q & 15])
            out[b * BLOCK + 16 + l] = d * np.float32(KVALUES[q >> 4])


# ----- quantization (ggml's quantize_iq4_nl, no importance matrix; shared with IQ4_XS) -----


@exact_kernel
def nearest_level(x):
    """Index of the LEVELS entry nearest x (float32), a tie going to the upper one (best_index_int8)."""
    if x <= LEVELS[0]:
        return 0
    if x >= LEVELS[15]:
        return 15
    lo, hi = 0, 15
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if x < LEVELS[mid]:
            hi = mid
        else:
            lo = mid
    return hi - 1 if x - LEVELS[hi - 1] < LEVELS[hi] - x else hi


@exact_kernel
def weighted_fit(xb, inv_scale):
    """(sum w*q*x, sum w*q*q) with w = x^2 and q the level nearest inv_scale*x, in ggml's float32 order."""
    sum_qx = np.float32(0.0)
    sum_q2 = np.float32(0.0)
    for j in range(xb.shape[0]):
        q = LEVELS[nearest_level(inv_scale * xb[j])]
        w = xb[j] * xb[j]
        sum_qx += w * q * xb[j]
        sum_q2 += w * q * q
    return sum_qx, sum_q2


@exact_kernel
def fit_scale(xb):
    """Best float32 scale of one 32-element block xb (0 when the block is all but zero)."""
    amax = np.float32(0.0)
    signed_max = np.float32(0.0)  # the element of largest magnitude, with its sign
    for j in range(xb.shape[0]):
        if abs(xb[j]) > amax:
            amax = abs(xb[j])
            signed_max = xb[j]
    if amax < GROUP_MAX_EPS:
        return np.float32(0.0)
    d = -signed_max / LEVELS[0]
    sum_qx, sum_q2 = weighted_fit(xb, np.float32(1.0) / d)
    d = sum_qx / sum_q2 if sum_q2 > np.float32(0.0) else np.float32(0.0)
    best = d * sum_qx
    for step in range(-N_TRY, N_TRY + 1):
        sum_qx, sum_q2 = weighted_fit(xb, np.float32(step + KVALUES[0]) / signed_max)
        # larger sum_qx^2 / sum_q2 is a smaller weighted squared error
        if sum_q2 > np.float32(0.0) and sum_qx * sum_qx > best * sum_q2:
            d = sum_qx / sum_q2
            best = d * sum_qx
    return d


@exact_kernel
def pack_levels(xb, inv_scale, out, qs):
    """out[qs : qs+16] = indices of the levels nearest inv_scale * xb[0:32], low nibbles first."""
    for l in range(16):
        lo = nearest_level(inv_scale * xb[l])
        hi = nearest_level(inv_scale * xb[16 + l])
        out[qs + l] = lo | (hi << 4)


@exact_kernel(parallel=True)
def _quantize_blocks(x, out):
    """x: float32[nb, 32] -> out: uint8[nb, 18]; blocks are independent, so in parallel."""
    for b in prange(x.shape[0]):
        d = fit_scale(x[b])
        bits = f32_to_f16_bits(d)
        out[b, 0] = bits & 255
        out[b, 1] = bits >> 8
        # the levels follow the float32 scale, not its float16 rounding (as in ggml)
        pack_levels(x[b], np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0), out[b], 2)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/32*18], as ggml's quantize_iq4_nl without an importance matrix."""
    blocks = as_float_blocks(x, BLOCK, "IQ4_NL")
    out = np.empty((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    _quantize_blocks(blocks, out)
    return out.reshape(*np.shape(x)[:-1], -1)


QUANT = QuantType(
    name="IQ4_NL",
    act="q8_0",
    dequantize=dequantize,
    dequantize_row=dequantize_row,
    quantize=quantize,
)
