"""BF16's CPU kernel: the dot product of a bfloat16 weight row with a float32 activation."""

from __future__ import annotations

import numpy as np

from ....jit import fast_kernel, u32_as_f32


@fast_kernel
def vec_dot(w, x):
    """w: uint8[2n] weight row; x: float32[n] activation."""
    bits = w.view(np.uint16)
    acc = np.float32(0.0)
    for j in range(x.shape[0]):
        acc += u32_as_f32(np.uint32(bits[j]) << np.uint32(16)) * x[j]
    return acc
