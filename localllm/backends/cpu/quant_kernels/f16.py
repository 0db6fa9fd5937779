"""F16's CPU kernel: the dot product of a float16 weight row with a float32 activation."""

from __future__ import annotations

import numpy as np

from ....jit import f16_to_f32, fast_kernel


@fast_kernel
def vec_dot(w, x):
    """w: uint8[2n] weight row; x: float32[n] activation."""
    bits = w.view(np.uint16)
    acc = np.float32(0.0)
    for j in range(x.shape[0]):
        acc += f16_to_f32(bits[j]) * x[j]
    return acc
