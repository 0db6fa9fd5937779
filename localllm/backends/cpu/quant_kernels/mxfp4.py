"""MXFP4's CPU kernels (format: localllm/quant/mxfp4.py): the one-row dot product with a q8_0 activation
and the row dequantizer, plain Numba loops (no vector intrinsics yet, no multi-row kernels)."""

from __future__ import annotations

import numpy as np

from ....jit import exact_kernel
from ....quant.mxfp4 import BLOCK, BLOCK_BYTES, KVALUES, dequantize_row, scale_of

__all__ = ["vec_dot", "dequantize_row"]


@exact_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*17] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32] (unused): a q8_0
    activation. Per block the integer sum of code values times activation quants, then, as llama.cpp's
    ggml_vec_dot_mxfp4_q8_0, sum += (activation scale * block scale) * that sum, block by block."""
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        base, a = b * BLOCK_BYTES + 1, b * BLOCK
        total = np.int32(0)
        for l in range(16):
            q = w[base + l]
            total += np.int32(KVALUES[q & 15]) * np.int32(aqs[a + l]) + np.int32(KVALUES[q >> 4]) * np.int32(aqs[a + 16 + l])
        acc += (ad[b] * scale_of(w[base - 1])) * np.float32(total)
    return acc
