"""Activation quantization: the pairing formats the vec_dot kernels read.

llama.cpp quantizes the activation vector once per matmul to the weight type's `vec_dot_type`:
Q8_0 (or Q8_1) for 32-element block types, Q8_K for 256-element super-block types. We keep the same
numbers in unpacked arrays, which the kernels index directly:

q8_0: qs int8[n]; d float32[n/32] (the scale, rounded through float16 as ggml stores it);
      s int32[n/32] = sum of qs in each block (what Q8_1's `s` field holds divided by d; used by
      the types with a min, Q4_1 and Q5_1).
q8_k: qs int8[n]; d float32[n/256]; s int32[n/16] = sum of qs in each group of 16 (Q8_K's `bsums`).

`QuantizedActivation` owns the buffers so a decode loop quantizes into them without allocating.
"""

from __future__ import annotations

import numpy as np

from .jit import exact_kernel, round_to_f16

QK8_0 = 32
QK_K = 256


@exact_kernel
def quantize_q8_0(x, qs, d, s):
    """x: float32[n] -> qs int8[n], d float32[n/32], s int32[n/32]; n % 32 == 0.

    Matches llama.cpp's x86 CPU path (quantize_row_q8_0/_q8_1 with AVX): d = amax/127, values scaled by
    127/amax and rounded to nearest even; the scale is stored as float16.
    """
    nb = x.shape[0] // QK8_0
    for b in range(nb):
        base = b * QK8_0
        amax = np.float32(0.0)
        for j in range(QK8_0):
            v = abs(x[base + j])
            if v > amax:
                amax = v
        dscale = amax / np.float32(127.0)
        inv = np.float32(127.0) / amax if amax != np.float32(0.0) else np.float32(0.0)
        total = 0
        for j in range(QK8_0):
            q = np.int32(np.rint(x[base + j] * inv))
            qs[base + j] = q
            total += q
        d[b] = round_to_f16(dscale)
        s[b] = total


@exact_kernel
def quantize_q8_k(x, qs, d, s):
    """x: float32[n] -> qs int8[n], d float32[n/256], s int32[n/16]; n % 256 == 0.

    llama.cpp's quantize_row_q8_K_ref: the value of largest magnitude (with its sign) maps to -127;
    iscale = -127/max, q = nearest_int(iscale*x) clamped to 127, d = 1/iscale.
    """
    nb = x.shape[0] // QK_K
    for b in range(nb):
        base = b * QK_K
        amax = np.float32(0.0)
        vmax = np.float32(0.0)
        for j in range(QK_K):
            v = abs(x[base + j])
            if v > amax:
                amax = v
                vmax = x[base + j]
        if amax == np.float32(0.0):
            d[b] = np.float32(0.0)
            for j in range(QK_K):
                qs[base + j] = 0
            for g in range(QK_K // 16):
                s[b * (QK_K // 16) + g] = 0
            continue
        iscale = np.float32(-127.0) / vmax
        for j in range(QK_K):
            q = np.int32(np.rint(iscale * x[base + j]))
            qs[base + j] = min(127, q)
        for g in range(QK_K // 16):
            total = 0
            for j in range(16):
                total += qs[base + g * 16 + j]
            s[b * (QK_K // 16) + g] = total
        d[b] = np.float32(1.0) / iscale


class QuantizedActivation:
    """Preallocated buffers for one activation vector of n floats in pairing format `kind`."""

    def __init__(self, kind: str, n: int):
        self.kind = kind
        self.n = n
        self.x = np.zeros(n, dtype=np.float32)
        if kind == "f32":
            self.arrays = (self.x,)
            return
        block = QK8_0 if kind == "q8_0" else QK_K
        if n % block:
            raise ValueError(f"activation length {n} is not a multiple of {block} ({kind})")
        self.qs = np.zeros(n, dtype=np.int8)
        self.d = np.zeros(n // block, dtype=np.float32)
        self.s = np.zeros(n // (QK8_0 if kind == "q8_0" else 16), dtype=np.int32)
        self.arrays = (self.qs, self.d, self.s)

    def quantize(self, x: np.ndarray) -> tuple:
        """Quantize x (float32[n]) into the buffers; returns the argument tuple vec_dot takes after w."""
        if self.kind == "f32":
            self.x[:] = x
        elif self.kind == "q8_0":
            quantize_q8_0(x, self.qs, self.d, self.s)
        else:
            quantize_q8_k(x, self.qs, self.d, self.s)
        return self.arrays
