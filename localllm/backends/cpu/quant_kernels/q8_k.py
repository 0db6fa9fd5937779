"""Q8_K's CPU kernel: the dot product of a Q8_K weight row with a q8_k activation (a plain integer loop).

Each block's float step is one explicit fused multiply-add. Written as `acc += total * scale` under
fast-math, whether LLVM fused it depended on where vec_dot was compiled: inlined into a driver loaded
from Numba's on-disk cache it was fused, in the process that first compiled the driver it was not, so
the first process and every later one gave different bits (up to 17 ulp; found by scripts/golden_ops.py,
on the code before the restructure too). With the fma written out, every process computes the fused one."""

from __future__ import annotations

import numpy as np

from ....jit import exact_kernel, fma_f32, read_f32
from ....quant.q8_k import BLOCK, BLOCK_BYTES, _QS


@exact_kernel
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
        acc = fma_f32(np.float32(total), read_f32(w, b * BLOCK_BYTES) * ad[b], acc)
    return acc
