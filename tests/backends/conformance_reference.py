"""Plain NumPy float64 references for the backend ops, each with the error bound a float32 backend may
reach, derived below (test_conformance.py asserts |backend - reference| <= bound element by element).

Notation: U = 2^-24, the unit roundoff of float32 (one rounding moves a value by at most U of it);
summing n terms in float32, in any order and with or without FMA, moves the sum by at most
n * U * sum(|terms|) (the standard bound gamma_n ~ nU, first order). Where a bound below adds a few U
more than the operations counted, that spare covers one more rounding in another correct formula.
"""

from __future__ import annotations

import numpy as np

from localllm import quant

U = 2.0**-24  # float32 unit roundoff
F16_U = 2.0**-11  # float16 unit roundoff (normal range)
F16_SUBNORMAL_HALF_STEP = 2.0**-25  # float16 rounds values below 2^-14 to multiples of 2^-24


def dequantized(qtype: str, raw: np.ndarray, held_as: str) -> np.ndarray:
    """float64[N, K] of raw (uint8[N, row_bytes]) through the quant module's NumPy reference, as the
    backend holds it: a backend that stores a type it has no kernel for as float16 (held_as "F16", the
    CUDA backend) computes with the float16-rounded values."""
    values = quant.get(qtype).dequantize(raw).reshape(raw.shape[0], -1)
    if held_as == "F16" and qtype != "F16":
        values = values.astype(np.float16).astype(np.float32)
    return values.astype(np.float64)


# ----- matmul ----------------------------------------------------------------------------------------------
#
# llama.cpp (and our CPU backend) multiplies a quantized weight row with the activation row quantized to
# the weight type's pairing format (its vec_dot type): 32-element block types pair with Q8_0 (Q8_1 for
# the types with a min), 256-element super-block types with Q8_K; float types keep float32. Other paths
# keep the activation in float32 (the CUDA backend; the CPU's dequantize + BLAS path for many rows). So a
# product is checked against two references, and must be within the bound of one of them everywhere:
# x @ W.T with the float32 activation, and x^ @ W.T with the activation as its pairing format quantizes it.
#
# The pairing formats, per block of the activation with largest magnitude amax: step d = amax / 127,
# q = round(x / d) (so |q| <= 127, |x - q d| <= d / 2), x^ = q d. Q8_0 stores d as float16 (d16, rounded
# from the float32 amax / 127); Q8_K keeps d in float32 (computed as 1 / fl(-127 / max): within 2U of
# amax / 127). Any float32 formula for x / d (llama.cpp's x * fl(127 / amax)) is within 3U |x / d|
# <= 381U ~ 2.3e-5 of it, so q is the same for every such formula unless x / d lies within that of a
# half-integer; likewise d16 unless amax / 127 lies within 4U of a float16 rounding midpoint. There (rare)
# the reference takes x itself and the worst case of the format's error (activation_error_bound).

TIE_MARGIN = 1e-4  # in steps: above the 2.3e-5 by which two float32 formulas for x / d may differ


def activation_error_bound(x: np.ndarray, block_size: int) -> np.ndarray:
    """float64[T, K]: how far the pairing format may move each activation value at worst (0 for float
    types). Beyond |x - q d| <= d / 2 with the exact step: q computed as rint(x * fl(127 / amax)) moves by
    at most 127 * 2U; Q8_0's float16 scale is within (2^-11 + 2U) d of d, times |q| <= 127; Q8_K's float32
    scale within 2U d. Per value: d (1/2 + 127 * 2^-11 + 509U) for Q8_0 (~0.562 d), d (1/2 + 510U) for
    Q8_K; the U terms written as 1024U."""
    if block_size == 1:
        return np.zeros(x.shape)
    rows, k = x.shape
    amax = np.abs(x.astype(np.float64)).reshape(rows, k // block_size, block_size).max(axis=2, keepdims=True)
    f16_scale = 127 * F16_U if block_size == 32 else 0.0  # Q8_0 stores d as float16; Q8_K as float32
    per_block = amax / 127 * (0.5 + f16_scale + 1024 * U)
    return np.broadcast_to(per_block, (rows, k // block_size, block_size)).reshape(rows, k)


def paired_activation(x: np.ndarray, block_size: int):
    """(x^ float64[T, K], e float64[T, K]): x as its pairing format (block_size 32: Q8_0, 256: Q8_K)
    quantizes it, and how far a backend's quantization may be from x^: 0 where q and d are the same for
    every float32 formula (Q8_K: 3U |q| d, its float32 scale), the worst case where a tie is too close
    to call (x^ is then x itself)."""
    rows, k = x.shape
    shape = (rows, k // block_size, block_size)
    x64 = x.astype(np.float64).reshape(shape)
    amax = np.abs(x64).max(axis=2, keepdims=True)
    d = amax / 127
    if block_size == 32:
        low, high = (d * (1 - 4 * U)).astype(np.float16), (d * (1 + 4 * U)).astype(np.float16)
        scale, scale_known = high.astype(np.float64), low == high
    else:
        scale, scale_known = d, np.ones(d.shape, bool)
    steps = np.divide(x64, d, out=np.zeros(shape), where=d > 0)
    q = np.rint(steps)
    near_tie = np.abs(steps - np.floor(steps) - 0.5) < TIE_MARGIN
    known = ~near_tie & scale_known
    spread = 0.0 if block_size == 32 else 3 * U * np.abs(q) * d
    worst = activation_error_bound(x, block_size).reshape(shape)
    paired = np.where(known, q * scale, x64)
    error = np.where(known, spread, worst)
    return paired.reshape(rows, k), error.reshape(rows, k)


def summed_magnitudes(w: np.ndarray, block_size: int) -> np.ndarray:
    """float64[N, K]: a bound on the terms a float32 backend sums for each weight. A float weight is
    one term, |w|. A block decoded as d * q - m (types with a min, and K-quant sub-block scales) may be
    summed as its two parts, whose sizes are bounded by the block's largest |w|: |m| <= max|w| (the
    min is one of the block's values) and |d q| = |w + m| <= 2 max|w|; |w| + 2 max|w| covers either."""
    mag = np.abs(w)
    if block_size == 1:
        return mag
    n, k = w.shape
    block_max = mag.reshape(n, k // block_size, block_size).max(axis=2, keepdims=True)
    return mag + 2 * np.broadcast_to(block_max, (n, k // block_size, block_size)).reshape(n, k)


def product_reference(w: np.ndarray, x: np.ndarray, error: np.ndarray, bias, block_size: int):
    """(reference x @ w.T + bias, bound) float64[T, N] for an activation x float64[T, K] known to within
    `error` per value, and w float64[N, K] as the backend holds it. Bound, per output: the activation's
    error times |w|; float32 summation, at most K + 8 roundings per term (products, block scales, the
    K-term sum), over the summed magnitudes with the activation's size |x| + error; the bias add, one
    rounding. A weight the backend rounded to float16 at upload is rounded in w already (`dequantized`),
    and float16 values are exact in float32: nothing to add for it."""
    k = w.shape[1]
    ref = x @ w.T
    bound = error @ np.abs(w).T + (k + 8) * U * ((np.abs(x) + error) @ summed_magnitudes(w, block_size).T)
    if bias is not None:
        ref = ref + bias.astype(np.float64)
        bound = bound + U * np.abs(ref) + U * bound
    return ref, bound


def matmul_references(w: np.ndarray, x: np.ndarray, bias, block_size: int) -> dict:
    """{activation kind: (reference, bound)}: the product with the float32 activation, and for the
    quantized types with the activation in its pairing format (see above)."""
    x64 = x.astype(np.float64)
    references = {"float32": product_reference(w, x64, np.zeros(x.shape), bias, block_size)}
    if block_size > 1:
        paired, error = paired_activation(x, block_size)
        references["Q8_0" if block_size == 32 else "Q8_K"] = product_reference(w, paired, error, bias, block_size)
    return references


def pairing_block(qtype: str) -> int:
    """Elements per block of the activation pairing format: 1 (float32) for the float types, else the
    type's block size (32: Q8_0, 256: Q8_K)."""
    return quant.get(qtype).block_size


# ----- row ops ---------------------------------------------------------------------------------------------


def rms_norm_reference(x: np.ndarray, weight: np.ndarray, eps: float):
    """out = x / sqrt(mean(x^2) + eps) * weight over the last axis. Bound: the float32 sum of D squares
    (D U, all terms positive so relative to the sum), halved by the square root, plus the root, the
    division by D, + eps, the reciprocal and the two products: (D/2 + 6) U relative; 8 written."""
    x64 = x.astype(np.float64)
    d = x.shape[-1]
    ref = x64 / np.sqrt((x64**2).mean(axis=-1, keepdims=True) + eps) * weight.astype(np.float64)
    return ref, (d / 2 + 8) * U * np.abs(ref)


def layer_norm_reference(x: np.ndarray, weight: np.ndarray, bias, eps: float):
    """out = (x - mean) / sqrt(var + eps) * weight + bias over the last axis, in float64. Bound: the
    centred values carry the mean's rounding (U of max|x|, the float64 sums exact enough); the variance's
    float32 rounding and the root, reciprocal and products add a few U relative to the normalised value:
    8 U of |normalised * weight| plus U max|x| / std times |weight|, plus U |bias| for the last addition."""
    x64 = x.astype(np.float64)
    centred = x64 - x64.mean(axis=-1, keepdims=True)
    std = np.sqrt((centred**2).mean(axis=-1, keepdims=True) + eps)
    w64 = weight.astype(np.float64)
    b64 = np.zeros_like(w64) if bias is None else bias.astype(np.float64)
    normed = centred / std * w64
    ref = normed + b64
    bound = 8 * U * np.abs(normed) + 2 * U * np.abs(x64).max(axis=-1, keepdims=True) / std * np.abs(w64) + U * np.abs(ref)
    return ref, bound


def inverse_frequencies(n_rot: int, base: float, factors, freq_scale: float) -> np.ndarray:
    i = np.arange(n_rot // 2, dtype=np.float64)
    theta = freq_scale * base ** (-2.0 * i / n_rot)
    return theta / factors.astype(np.float64) if factors is not None else theta


def rope_reference(x, positions, n_rot, base, neox, factors, freq_scale, mscale=1.0):
    """Rotation of the first n_rot dims of each head of x[T, H, D] by positions[t] * theta_i (the
    interface's formula, base.py), in float64; dims from n_rot on are unchanged (bound 0).
    Bound for a rotated pair (a, b): the angle carries the float32 rounding of theta (U) and of any
    product or division that forms it (2U more): 3U |angle|; cos and sin within 2U each; the rotation's
    two products and sum, 3U of |a| + |b|; one spare: (|a| + |b|) (3 |angle| + 6) U. mscale multiplies cos
    and sin (one more rounding each: 2U more, times mscale)."""
    x64 = x.astype(np.float64)
    angle = positions.astype(np.float64)[:, None] * inverse_frequencies(n_rot, base, factors, freq_scale)[None, :]
    cos, sin = mscale * np.cos(angle)[:, None, :], mscale * np.sin(angle)[:, None, :]
    half = n_rot // 2
    first = np.arange(half) if neox else 2 * np.arange(half)
    second = first + half if neox else first + 1
    a, b = x64[:, :, first], x64[:, :, second]
    ref, bound = x64.copy(), np.zeros_like(x64)
    ref[:, :, first], ref[:, :, second] = a * cos - b * sin, a * sin + b * cos
    pair_bound = mscale * (np.abs(a) + np.abs(b)) * (3 * np.abs(angle)[:, None, :] + 8) * U
    bound[:, :, first], bound[:, :, second] = pair_bound, pair_bound
    return ref, bound


# ----- attention ----------------------------------------------------------------------------------------------


def visible_keys(position: int, window: int) -> np.ndarray:
    """Positions a query at `position` attends to: j <= position and position - j < window (0: all)."""
    first = max(0, position - window + 1) if window else 0
    return np.arange(first, position + 1)


def attend_reference(q, keys, values, scale, softcap=0.0, sink=None):
    """One query row q float64[D] over keys, values float64[n, D]: (out[D], bound[D]).

    Bound: a float32 score s_j = scale * q.k_j is off by at most delta_j = (D + 2) U scale sum|q k_j|;
    subtracting the largest score adds U |s_j - max|; so every exponent is off by at most
    eta = max_j (delta_j + delta_max + U |s_j - max|). Each softmax weight p_j is then off by at most
    2 eta of itself (first order: its own exponent and the normaliser's), plus the float32 exp (8U
    allowed: a polynomial exp within a few ulp), the n-term normalising sum and its division ((n + 2)U);
    the weighted sum of the values adds n U of sum p_j |v_j|. Together, per output dim d:
    sum_j p_j |v_jd| * (2 eta + (2n + 16) U).
    Soft-capping (softcap > 0: s -> softcap tanh(s / softcap)) does not widen delta (tanh's slope is at
    most 1) and adds its own rounding: the division, tanh (4U allowed) and the product, 8U of softcap.
    An attention sink (a logit with no value) joins the softmax as one more score, exact (delta 0)."""
    d = q.shape[0]
    s = keys @ q * scale
    delta = (d + 2) * U * scale * (np.abs(keys) @ np.abs(q))
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
        delta = delta + 8 * U * softcap
    top = s.max() if sink is None else max(s.max(), float(sink))
    eta = np.max(delta + delta.max() + U * np.abs(s - top))
    p = np.exp(s - top)
    p /= p.sum() + (0.0 if sink is None else np.exp(float(sink) - top))
    return p @ values, (p @ np.abs(values)) * (2 * eta + (2 * len(s) + 18) * U)


def attention_reference(q, cache_k, cache_v, positions, scale, window, softcap=0.0, sinks=None):
    """q float32[T, Hq, D], row t at positions[t], over float16 caches [n, Hkv, D] (GQA: query head h
    reads kv head h // (Hq / Hkv)): (reference, bound) float64[T, Hq, D]."""
    n_tok, n_head, _ = q.shape
    group = n_head // cache_k.shape[1]
    k64, v64, q64 = cache_k.astype(np.float64), cache_v.astype(np.float64), q.astype(np.float64)
    ref, bound = np.zeros(q.shape), np.zeros(q.shape)
    for t in range(n_tok):
        keys = visible_keys(int(positions[t]), window)
        for h in range(n_head):
            ref[t, h], bound[t, h] = attend_reference(q64[t, h], k64[keys, h // group], v64[keys, h // group], scale,
                                                      softcap, None if sinks is None else sinks[h])
    return ref, bound


# ----- elementwise ---------------------------------------------------------------------------------------------

GELU_MAX_SLOPE = 1.13  # the largest |d/dx| of the tanh GELU: 1.129 at x ~ 1.42 (the smallest is -0.129)


def gated_act_reference(gate, up, kind):
    """act(gate) * up in float64, kind 'silu' (g sigmoid(g)) or 'gelu_tanh'
    (g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))).
    Bound for SiLU: exp within 8U, then 1 + e, the division, two products: 16U of |out|, and the
    smallest normal float32 (2^-126) for a result that a backend flushes to zero.
    Bound for GELU: llama.cpp's CPU reads GELU from a table over float16 inputs whose entries are rounded
    to float16, and so do we (backends/cpu/kernels.gelu_table): the gate rounded to float16 moves it by
    2^-11 |g| (2^-25 below float16's normal range), which the slope moves by at most GELU_MAX_SLOPE
    times that; the entry's rounding adds 2^-11 |gelu|; then the table's float32 arithmetic and the
    product with up, 16U. A backend that computes GELU in float32 is well within it."""
    g = gate.astype(np.float64)
    u = up.astype(np.float64)
    if kind == "swiglu_oai":  # gpt-oss: clamps exact in float32; then SiLU's chain, with one more product
        g, u = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
        ref = g / (1 + np.exp(-1.702 * g)) * (u + 1)
        # the CPU's exp takes arguments below -87 as -87 (backends/cpu/kernels._exp_nonpositive): there
        # sigmoid(1.702 g) reads e^-87 (1.6e-38) for ~0, harmless, which the bound allows for
        floor = np.exp(-87.0) * np.abs(g) * np.abs(u + 1)
        return ref, 24 * U * np.abs(ref) + 8 * U * np.abs(g / (1 + np.exp(-1.702 * g))) + floor + 2.0**-126
    if kind == "silu":
        act = g / (1 + np.exp(-g))
        ref = act * u
        return ref, 16 * U * np.abs(ref) + 2.0**-126
    if kind == "sigmoid":  # SiLU's chain less its product with g
        ref = u / (1 + np.exp(-g))
        return ref, 16 * U * np.abs(ref) + 2.0**-126
    act = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
    ref = act * u
    moved_gate = np.maximum(F16_U * np.abs(g), F16_SUBNORMAL_HALF_STEP)
    table = GELU_MAX_SLOPE * moved_gate + F16_U * np.abs(act) + F16_SUBNORMAL_HALF_STEP
    return ref, table * np.abs(u) + 16 * U * np.abs(ref)


def short_conv_reference(x, weight, window, silu):
    """(out, bound, the window after) of Backend.short_conv in float64. Bound: K float32 products and
    adds of terms of at most sum |w x| (2K roundings of that), then SiLU's chain (16U of |out|)."""
    xin = np.concatenate([window, x]).astype(np.float64)
    k = weight.shape[1]
    terms = np.stack([xin[i : i + x.shape[0]] * weight[:, i].astype(np.float64) for i in range(k)])  # [K, T, C]
    conv = terms.sum(axis=0)
    bound = 2 * k * U * np.abs(terms).sum(axis=0)
    if silu:
        slope = 1.1  # |d silu / dx| <= 1.1 everywhere
        out = conv / (1 + np.exp(-conv))
        bound = slope * bound + 16 * U * np.abs(out) + 2.0**-126
    else:
        out = conv
    return out, bound, xin[x.shape[0] :].astype(np.float32)


def delta_net_reference(q, k, v, g, beta, state, grouped=False):
    """(out [T, Hv, S], the state after [Hv, S, S]) of Backend.delta_net, token by token in float64."""
    m = state.astype(np.float64).copy()
    out = np.zeros(v.shape, dtype=np.float64)
    n_k, scale = q.shape[1], 1.0 / np.sqrt(q.shape[2])
    group = m.shape[0] // n_k
    for t in range(q.shape[0]):
        for h in range(m.shape[0]):
            hk = h // group if grouped else h % n_k
            kt, qt = k[t, hk].astype(np.float64), q[t, hk].astype(np.float64)
            m[h] *= np.exp(np.float64(g[t, h]))
            d = np.float64(beta[t, h]) * (v[t, h].astype(np.float64) - m[h] @ kt)
            m[h] += np.outer(d, kt)
            out[t, h] = scale * (m[h] @ qt)
    return out, m
