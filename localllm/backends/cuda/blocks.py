"""Device functions that read ggml blocks in place (layouts: the docstrings of localllm/quant/<type>.py).

Every quantized matrix is a uint8[N, row_bytes] device array, the file's bytes unchanged. The kernels
split a row into *units* of 32 consecutive elements (one Q4_0/Q5_0/Q8_0 block, one sub-block of a
K-quant super-block, 32 floats of an F32/F16/BF16 row); `UNIT_DECODERS[qtype](w, row, u, k, buf)`
writes the 32 float32 values of unit u of row `row` into buf (a thread-local float32[32]); elements at
or past k (only possible for float types) are written as 0.

Written for numba.cuda and its simulator alike, so: bytes are widened to int32 before any shift (the
simulator computes in NumPy, where uint8 << 8 stays uint8), float constants are float32 (a Python float
literal makes Numba compute in float64), and float16 / bfloat16 values are decoded with
arithmetic on integers and powers of two rather than bit casts (neither the simulator nor numba.cuda's
Python API offers a bit cast), and device functions here use no `cuda.*` call (the simulator swaps the
`cuda` module per module and per call, which is not safe across the threads of a block).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

UNIT = 32  # elements per unit

F32_ZERO = np.float32(0.0)


# ----- float16 / bfloat16 <-> float32 ------------------------------------------------------------------


TWO_POW_M24 = np.float32(2.0**-24)
TWO_POW_M25 = np.float32(2.0**-25)
# 2^(32i - 134) for i = 0..7: bfloat16 exponents span 2^-133 .. 2^127, wider than one integer shift.
BF16_POW2 = tuple(2.0 ** (32 * i - 134) for i in range(8))


@cuda.jit(device=True)
def f16_to_f32(bits):
    """float16 bits (0..65535, any int) -> float32, exact (subnormals, inf and NaN included): products of
    small integers and powers of two, no bit cast needed."""
    h = np.int32(bits)
    exponent = (h >> 10) & 31
    mantissa = h & 1023
    if exponent == 0:  # zero or subnormal: mantissa * 2^-24
        value = np.float32(mantissa) * TWO_POW_M24
    elif exponent == 31:
        value = np.float32(math.inf) if mantissa == 0 else np.float32(math.nan)
    else:  # (1024 + mantissa) * 2^(exponent - 25)
        value = np.float32(1024 + mantissa) * np.float32(np.int64(1) << exponent) * TWO_POW_M25
    return -value if h & 0x8000 else value


@cuda.jit(device=True)
def bf16_to_f32(bits):
    """bfloat16 bits -> float32, exact: (128 + mantissa) * 2^(exponent - 134), formed in float64."""
    h = np.int32(bits)
    exponent = (h >> 7) & 255
    mantissa = h & 127
    if exponent == 255:
        value = np.float32(math.inf) if mantissa == 0 else np.float32(math.nan)
    else:
        significand = mantissa if exponent == 0 else 128 + mantissa
        e = 1 if exponent == 0 else exponent
        value = np.float32(np.float64(significand) * np.float64(np.int64(1) << (e % 32)) * BF16_POW2[e // 32])
    return -value if h & 0x8000 else value


@cuda.jit(device=True)
def _round_half_even(v):
    """Nearest integer to a non-negative float, ties to even (IEEE's default rounding)."""
    qi = np.int32(math.floor(v))
    frac = v - np.float32(qi)
    if frac > np.float32(0.5) or (frac == np.float32(0.5) and (qi & 1) == 1):
        qi += 1
    return qi


@cuda.jit(device=True)
def f32_to_f16(x):
    """float32 -> float16 bits (int32), round to nearest even like NumPy's astype(float16)."""
    sign = np.int32(0x8000) if math.copysign(np.float32(1.0), x) < F32_ZERO else np.int32(0)  # -0.0 too
    a = abs(x)
    if a != a:
        return np.int32(0x7E00)
    if a >= np.float32(65520.0):  # rounds to infinity (65504 is the largest half)
        return sign | np.int32(0x7C00)
    if a < np.float32(6.103515625e-05):  # below 2^-14: subnormal, steps of 2^-24 (1024 = smallest normal)
        return sign | _round_half_even(a * np.float32(16777216.0))
    exponent = np.int32(15)  # largest e with 2^e <= a, found by halving (exact): at most 29 steps
    p = np.float32(32768.0)
    while a < p:
        p *= np.float32(0.5)
        exponent -= 1
    q = _round_half_even(a * (np.float32(1024.0) / p))  # 1024..2048
    if q == 2048:
        q = np.int32(1024)
        exponent += 1
    if exponent > 15:
        return sign | np.int32(0x7C00)
    return sign | ((exponent + 15) << 10) | (q - 1024)


@cuda.jit(device=True)
def _byte(w, row, offset):
    return np.int32(w[row, offset])


@cuda.jit(device=True)
def _f16_at(w, row, offset):
    return f16_to_f32(_byte(w, row, offset) | (_byte(w, row, offset + 1) << 8))


# ----- float rows ---------------------------------------------------------------------------------------


@cuda.jit(device=True)
def unit_f32(w, row, u, k, buf):
    """w float32[N, K]."""
    for j in range(UNIT):
        e = u * UNIT + j
        buf[j] = w[row, e] if e < k else F32_ZERO


@cuda.jit(device=True)
def unit_f16(w, row, u, k, buf):
    """w uint16[N, K] (float16 bits)."""
    for j in range(UNIT):
        e = u * UNIT + j
        buf[j] = f16_to_f32(w[row, e]) if e < k else F32_ZERO


@cuda.jit(device=True)
def unit_bf16(w, row, u, k, buf):
    """w uint16[N, K] (bfloat16 bits)."""
    for j in range(UNIT):
        e = u * UNIT + j
        buf[j] = bf16_to_f32(w[row, e]) if e < k else F32_ZERO


# ----- 32-element blocks ----------------------------------------------------------------------------------


@cuda.jit(device=True)
def unit_q4_0(w, row, u, k, buf):
    """18-byte block: d f16, qs[16]: element j low nibble of qs[j], element j+16 high nibble."""
    base = u * 18
    d = _f16_at(w, row, base)
    for j in range(16):
        b = _byte(w, row, base + 2 + j)
        buf[j] = d * np.float32((b & 15) - 8)
        buf[j + 16] = d * np.float32((b >> 4) - 8)


@cuda.jit(device=True)
def unit_q5_0(w, row, u, k, buf):
    """22-byte block: d f16, qh uint32 (bit j = fifth bit of element j), qs[16] as in Q4_0."""
    base = u * 22
    d = _f16_at(w, row, base)
    qh = _byte(w, row, base + 2) | (_byte(w, row, base + 3) << 8)
    qh_high = _byte(w, row, base + 4) | (_byte(w, row, base + 5) << 8)
    for j in range(16):
        b = _byte(w, row, base + 6 + j)
        lo = (b & 15) | (((qh >> j) & 1) << 4)
        hi = (b >> 4) | (((qh_high >> j) & 1) << 4)
        buf[j] = d * np.float32(lo - 16)
        buf[j + 16] = d * np.float32(hi - 16)


@cuda.jit(device=True)
def unit_q8_0(w, row, u, k, buf):
    """34-byte block: d f16, qs[32] int8."""
    base = u * 34
    d = _f16_at(w, row, base)
    for j in range(UNIT):
        b = _byte(w, row, base + 2 + j)
        buf[j] = d * np.float32(b - 256 if b > 127 else b)


# ----- K-quants (256-element super-blocks, 8 units each) -------------------------------------------------


@cuda.jit(device=True)
def _scale_min_k4(w, row, offset, sub):
    """(scale, min) of sub-block `sub` from the 12 packed bytes at offset (ggml's get_scale_min_k4)."""
    if sub < 4:
        return _byte(w, row, offset + sub) & 63, _byte(w, row, offset + sub + 4) & 63
    packed = _byte(w, row, offset + sub + 4)
    sc = (packed & 15) | ((_byte(w, row, offset + sub - 4) >> 6) << 4)
    mn = (packed >> 4) | ((_byte(w, row, offset + sub) >> 6) << 4)
    return sc, mn


@cuda.jit(device=True)
def unit_q4_k(w, row, u, k, buf):
    """144-byte super-block: d, dmin f16; scales[12]; qs[128]. Sub-block s = 2c (+1) reads the low
    (high) nibbles of qs[32c .. 32c+31]. Weight = (d*scale)*q - dmin*min, products in float32."""
    base = (u // 8) * 144
    sub = u % 8
    sc, mn = _scale_min_k4(w, row, base + 4, sub)
    step = _f16_at(w, row, base) * np.float32(sc)
    offset = _f16_at(w, row, base + 2) * np.float32(mn)
    qs = base + 16 + 32 * (sub // 2)
    shift = 4 * (sub % 2)
    for j in range(UNIT):
        q = (_byte(w, row, qs + j) >> shift) & 15
        buf[j] = step * np.float32(q) - offset


@cuda.jit(device=True)
def unit_q5_k(w, row, u, k, buf):
    """176-byte super-block: d, dmin f16; scales[12] (as Q4_K); qh[32] (bit s of qh[l]: fifth bit of
    element 32s + l); qs[128] (as Q4_K)."""
    base = (u // 8) * 176
    sub = u % 8
    sc, mn = _scale_min_k4(w, row, base + 4, sub)
    step = _f16_at(w, row, base) * np.float32(sc)
    offset = _f16_at(w, row, base + 2) * np.float32(mn)
    qs = base + 48 + 32 * (sub // 2)
    shift = 4 * (sub % 2)
    for j in range(UNIT):
        q = ((_byte(w, row, qs + j) >> shift) & 15) | (((_byte(w, row, base + 16 + j) >> sub) & 1) << 4)
        buf[j] = step * np.float32(q) - offset


@cuda.jit(device=True)
def unit_q6_k(w, row, u, k, buf):
    """210-byte super-block: ql[128], qh[64], scales[16] int8, d f16. Unit v = u % 8 is quarter m = v % 4
    of half h = v // 4: low bits from ql[64h + 32*(m % 2) + l] (nibble m // 2), high bits
    (qh[32h + l] >> 2m) & 3; group (16 elements) 2v + l // 16."""
    base = (u // 8) * 210
    v = u % 8
    half, m = v // 4, v % 4
    d = _f16_at(w, row, base + 208)
    ql = base + 64 * half + 32 * (m % 2)
    qh = base + 128 + 32 * half
    for g in range(2):
        s = _byte(w, row, base + 192 + 2 * v + g)
        step = d * np.float32(s - 256 if s > 127 else s)
        for j in range(16 * g, 16 * g + 16):
            low = (_byte(w, row, ql + j) >> (4 * (m // 2))) & 15
            high = (_byte(w, row, qh + j) >> (2 * m)) & 3
            buf[j] = step * np.float32((low | (high << 4)) - 32)


# qtype -> (decoder, element dtype of the uploaded array: "u8" raw blocks, "f32", "u16" half bits)
UNIT_DECODERS = {
    "F32": (unit_f32, "f32"),
    "F16": (unit_f16, "u16"),
    "BF16": (unit_bf16, "u16"),
    "Q4_0": (unit_q4_0, "u8"),
    "Q5_0": (unit_q5_0, "u8"),
    "Q8_0": (unit_q8_0, "u8"),
    "Q4_K": (unit_q4_k, "u8"),
    "Q5_K": (unit_q5_k, "u8"),
    "Q6_K": (unit_q6_k, "u8"),
}
