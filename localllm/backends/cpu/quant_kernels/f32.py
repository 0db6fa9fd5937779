"""F32's CPU kernel: the dot product of a float32 weight row with a float32 activation."""

from __future__ import annotations

import numpy as np

from ....jit import fast_kernel


@fast_kernel
def vec_dot(w, x):
    """w: uint8[4n] weight row; x: float32[n] activation."""
    values = w.view(np.float32)
    acc = np.float32(0.0)
    for j in range(x.shape[0]):
        acc += values[j] * x[j]
    return acc
