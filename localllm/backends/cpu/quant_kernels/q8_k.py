"""Q8_K's CPU kernel: the dot product of a Q8_K weight row with a q8_k activation (a plain integer loop)."""

from __future__ import annotations

import numpy as np

from ....jit import fast_kernel, read_f32
from ....quant.q8_k import BLOCK, BLOCK_BYTES, _QS


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*292] weight row; aqs int8[n], ad float32[n/256], asum int32[n/16]: q8_k activation."""
    wq = w.view(np.int8)
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        wbase = b * BLOCK_BYTES + _QS
        abase = b * BLOCK
        total = np.int32(0)
        for j in range(BLOCK):
            total += np.int32(wq[wbase + j]) * np.int32(aqs[abase + j])
        acc += np.float32(total) * (read_f32(w, b * BLOCK_BYTES) * ad[b])
    return acc
