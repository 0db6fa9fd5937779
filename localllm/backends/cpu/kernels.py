"""Numba CPU kernels for the non-matmul ops (see backends/base.py for the contracts); decode attention
is in attention_decode.py, prefill attention in attention_blas.py."""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from ...quant.activation import quantize_q8_0, quantize_q8_k
from ...jit import cached_kernel, exact_kernel, f16_to_f32, f32_to_f16_bits, fast_kernel, u32_as_f32

SQRT_2_OVER_PI = 0.7978845608028654


@exact_kernel
def _row_rms_scale(row, eps):
    """1/sqrt(mean(row^2) + eps), the sum in float64 in order, as ggml sums: deterministic whatever the
    compiler does (a fast-math float32 reduction changed with how it was vectorised, measured). ggml
    rounds each square to float32 before adding it and takes the mean and the root in float32; here the
    squares (exact in float64) and the root are float64, the result rounded once to float32."""
    total = 0.0
    for i in range(row.shape[0]):
        total += np.float64(row[i]) * np.float64(row[i])
    return np.float32(1.0 / np.sqrt(total / row.shape[0] + np.float64(eps)))


@fast_kernel
def _rms_norm_row(x, weight, eps, out):
    inv = _row_rms_scale(x, eps)
    for i in range(x.shape[0]):
        out[i] = x[i] * inv * weight[i]


# Each small op below comes twice: a prange loop over its rows or jobs, and the same loop as a plain
# `range` (`*_serial`) for the ops of a decode step too small to share (ThreadPolicy.parallel says which): calling
# the serial twin leaves Numba's thread count alone, where running the parallel one on one thread meant
# two set_num_threads calls around it (~1.7 us each, ~130 per Gemma 3 270M step). Both run the same
# per-row function, so their results are the same.
@fast_kernel(parallel=True)
def rms_norm(x, weight, eps, out):
    """x float32[R, D], weight float32[D] -> out float32[R, D] (out may be x)."""
    for r in prange(x.shape[0]):
        _rms_norm_row(x[r], weight, eps, out[r])


@fast_kernel
def rms_norm_serial(x, weight, eps, out):
    for r in range(x.shape[0]):
        _rms_norm_row(x[r], weight, eps, out[r])


@exact_kernel
def _layer_norm_row(x, weight, bias, eps, out):
    """As ggml_norm (mean, then the centred values' mean square, both summed in float64 in order; the
    centred values scaled by 1/sqrt(variance + eps) in float32), then times weight, plus bias."""
    n = x.shape[0]
    total = 0.0
    for i in range(n):
        total += np.float64(x[i])
    mean = np.float32(total / n)
    squares = 0.0
    for i in range(n):
        v = x[i] - mean
        out[i] = v
        squares += np.float64(v * v)
    inv = np.float32(1.0) / np.float32(math.sqrt(np.float32(squares / n) + eps))
    for i in range(n):
        out[i] = out[i] * inv * weight[i] + bias[i]


@fast_kernel(parallel=True)
def layer_norm(x, weight, bias, eps, out):
    """x float32[R, D], weight and bias float32[D] -> out float32[R, D] (out may be x)."""
    for r in prange(x.shape[0]):
        _layer_norm_row(x[r], weight, bias, eps, out[r])


@fast_kernel
def rope_inv_freqs(n_rot, base, freq_scale, freq_factors, out):
    """out float32[n_rot/2] = freq_scale * base^(-2i/n_rot) / freq_factors[i] (freq_factors may be empty)."""
    for i in range(n_rot // 2):
        value = freq_scale * base ** (-2.0 * i / n_rot)
        if freq_factors.shape[0] > 0:
            value /= freq_factors[i]
        out[i] = value


@fast_kernel
def rope_table(positions, inv_freq, cos, sin):
    """cos, sin float32[T, n_rot/2] of the angles positions[t] * inv_freq[i], computed in float64 then
    rounded (a step's table serves q and k of every layer with the same RoPE base)."""
    for t in range(positions.shape[0]):
        pos = np.float64(positions[t])
        for i in range(inv_freq.shape[0]):
            angle = pos * np.float64(inv_freq[i])
            cos[t, i] = np.float32(math.cos(angle))
            sin[t, i] = np.float32(math.sin(angle))


@fast_kernel
def _rope_row(x, cos, sin, neox):
    """Rotate one token's heads x float32[H, D] by the angles cos, sin float32[n_rot/2]."""
    half = cos.shape[0]
    for i in range(half):
        c = cos[i]
        s = sin[i]
        for h in range(x.shape[0]):
            if neox:
                a = x[h, i]
                b = x[h, i + half]
                x[h, i] = a * c - b * s
                x[h, i + half] = a * s + b * c
            else:
                a = x[h, 2 * i]
                b = x[h, 2 * i + 1]
                x[h, 2 * i] = a * c - b * s
                x[h, 2 * i + 1] = a * s + b * c


@fast_kernel(parallel=True)
def rope(x, cos, sin, neox):
    """Rotate x float32[T, H, D] in place by the angles of rope_table (cos, sin float32[T, n_rot/2])."""
    for t in prange(x.shape[0]):
        _rope_row(x[t], cos[t], sin[t], neox)


@fast_kernel
def rope_serial(x, cos, sin, neox):
    for t in range(x.shape[0]):
        _rope_row(x[t], cos[t], sin[t], neox)


# From this many rows the activation quantizers run their rows in parallel (a prefill's: 512 x 640 to
# q8_0 took ~280 us on one thread, before each of ~5 products per layer); fewer (the server's batched
# decode steps) stay on the calling thread, where waking the pool would cost more than the rows.
PARALLEL_QUANTIZE_ROWS = 16


@exact_kernel(parallel=True)
def quantize_rows_q8_0(x, qs, d, s):
    """quantize_q8_0 of each row of x float32[T, n] into qs, d, s [T, ...]: one call for a prompt's rows
    (a Python loop over 512 rows cost ~1.5 ms a matrix)."""
    if x.shape[0] < PARALLEL_QUANTIZE_ROWS:
        for t in range(x.shape[0]):
            quantize_q8_0(x[t], qs[t], d[t], s[t])
        return
    for t in prange(x.shape[0]):
        quantize_q8_0(x[t], qs[t], d[t], s[t])


@exact_kernel(parallel=True)
def quantize_rows_q8_k(x, qs, d, s):
    """quantize_q8_k of each row of x float32[T, n] into qs, d, s [T, ...]."""
    if x.shape[0] < PARALLEL_QUANTIZE_ROWS:
        for t in range(x.shape[0]):
            quantize_q8_k(x[t], qs[t], d[t], s[t])
        return
    for t in prange(x.shape[0]):
        quantize_q8_k(x[t], qs[t], d[t], s[t])


@exact_kernel(parallel=True)
def store_f16_block(src, dst, start):
    """dst[start + t] = src[t] rounded to float16 as store_f16_rows rounds, rows in parallel: a prefill's
    keys or values into the contiguous cache (NumPy's own conversion is scalar: ~0.7 ms a layer for
    Gemma 3 270M's 512-token prefill, ~2% of it)."""
    for t in prange(src.shape[0]):
        for h in range(src.shape[1]):
            for i in range(src.shape[2]):
                dst[start + t, h, i] = f32_to_f16_bits(src[t, h, i])


@exact_kernel
def store_f16_rows(src, dst, slots):
    """dst[slots[t]] = src[t] rounded to float16 (nearest even, as NumPy rounds): src float32[T, H, D],
    dst the cache's float16 bits uint16[N, H, D]. One pass instead of NumPy's fancy-index assignment
    (31 us for the 8 rows of a server step, most of it per-call overhead)."""
    for t in range(src.shape[0]):
        slot = slots[t]
        for h in range(src.shape[1]):
            for i in range(src.shape[2]):
                dst[slot, h, i] = f32_to_f16_bits(src[t, h, i])


def gelu_table() -> np.ndarray:
    """float32[65536]: GELU (tanh form) of every float16 value, rounded to float16, as ggml's CPU
    backend tabulates it (ggml_table_gelu_f16). The gate is looked up by its float16 bits: one load per
    element instead of a tanh (which Numba cannot vectorise), and the same numbers llama.cpp uses."""
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        inner = np.float32(SQRT_2_OVER_PI) * x * (np.float32(1.0) + np.float32(0.044715) * x * x)
        y = np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))
        return y.astype(np.float16).astype(np.float32)


@fast_kernel
def _gelu(g, table):
    """GELU (tanh form) of g as ggml's CPU backend computes it: its float16 table inside (-10, 10)."""
    if g <= np.float32(-10.0):
        return np.float32(0.0)
    if g >= np.float32(10.0):
        return g
    return table[np.int64(f32_to_f16_bits(g))]


@fast_kernel
def _silu(g):
    """SiLU(g) = g * sigmoid(g), sigmoid from e = exp(-|g|) (never overflows) by the vectorised
    _exp_nonpositive: 1 / (1 + e) for g >= 0, e / (1 + e) below. np.exp here was a scalar libm call per
    element: 90 us per 14,336-wide row (a Llama-3-8B FFN), 3% of its decode step."""
    e = _exp_nonpositive(-abs(g))
    return g * _divide(np.float32(1.0) if g >= np.float32(0.0) else e, np.float32(1.0) + e)


# Each activation has an out-of-place and an in-place row function. The decoder writes the result over
# the gate (out is gate); through the out-of-place loop, LLVM's runtime overlap check then failed and
# it ran its scalar fallback: a Llama-3-8B-shaped prefill's 512 x 14,336 SiLU took 15 ms per layer
# instead of 1.6 (30 ms in the pass, 6% of it). With one array read and written at the same index, the
# only check left (against `up`) passes and the loop runs packed.
@fast_kernel
def _geglu_row(gate, up, out, table):
    for i in range(gate.shape[0]):
        out[i] = _gelu(gate[i], table) * up[i]


@fast_kernel
def _geglu_row_in_place(x, up, table):
    for i in range(x.shape[0]):
        x[i] = _gelu(x[i], table) * up[i]


@fast_kernel
def _swiglu_row(gate, up, out):
    for i in range(gate.shape[0]):
        out[i] = _silu(gate[i]) * up[i]


@fast_kernel
def _swiglu_row_in_place(x, up):
    for i in range(x.shape[0]):
        x[i] = _silu(x[i]) * up[i]


@fast_kernel
def _gated_act_row(gate, up, out, gelu, table, in_place):
    if gelu:
        if in_place:
            _geglu_row_in_place(out, up, table)
        else:
            _geglu_row(gate, up, out, table)
    elif in_place:
        _swiglu_row_in_place(out, up)
    else:
        _swiglu_row(gate, up, out)


# gpt-oss's clamped SwiGLU (ggml_swiglu_oai): the gate clamped above at LIMIT, the up side into
# [-LIMIT, LIMIT], out = g * sigmoid(ALPHA * g) * (u + 1).
OAI_ALPHA, OAI_LIMIT = np.float32(1.702), np.float32(7.0)


@fast_kernel
def _swiglu_oai_row(gate, up, out):
    for i in range(gate.shape[0]):
        g = min(gate[i], OAI_LIMIT)
        u = min(max(up[i], -OAI_LIMIT), OAI_LIMIT)
        e = _exp_nonpositive(-abs(OAI_ALPHA * g))  # sigmoid(a g) from exp(-|a g|), as _silu
        sig = _divide(np.float32(1.0) if g >= np.float32(0.0) else e, np.float32(1.0) + e)
        out[i] = g * sig * (u + np.float32(1.0))


@fast_kernel(parallel=True)
def swiglu_oai(gate, up, out):
    """out[T, F] = gpt-oss's clamped SwiGLU of gate and up (out may be gate)."""
    for t in prange(gate.shape[0]):
        _swiglu_oai_row(gate[t], up[t], out[t])


@fast_kernel
def swiglu_oai_serial(gate, up, out):
    for t in range(gate.shape[0]):
        _swiglu_oai_row(gate[t], up[t], out[t])


# The sigmoid gate (Qwen3.5's and Qwen3-Next's gated attention output): out = sigmoid(gate) * up,
# sigmoid from exp(-|g|) as _silu computes it.
@fast_kernel
def _sigmoid_gate_row(gate, up, out):
    for i in range(gate.shape[0]):
        g = gate[i]
        e = _exp_nonpositive(-abs(g))
        out[i] = _divide(np.float32(1.0) if g >= np.float32(0.0) else e, np.float32(1.0) + e) * up[i]


@fast_kernel(parallel=True)
def sigmoid_gate(gate, up, out):
    """out[T, F] = sigmoid(gate) * up (out may be gate)."""
    for t in prange(gate.shape[0]):
        _sigmoid_gate_row(gate[t], up[t], out[t])


@fast_kernel
def sigmoid_gate_serial(gate, up, out):
    for t in range(gate.shape[0]):
        _sigmoid_gate_row(gate[t], up[t], out[t])


@fast_kernel(parallel=True)
def gated_act(gate, up, out, gelu, table):
    """out[T, F] = act(gate) * up; gelu: GELU (tanh approximation) via `table` (gelu_table()), else SiLU.
    out may be gate itself (in place); no other overlap."""
    in_place = out.ctypes.data == gate.ctypes.data
    for t in prange(gate.shape[0]):
        _gated_act_row(gate[t], up[t], out[t], gelu, table, in_place)


@fast_kernel
def gated_act_serial(gate, up, out, gelu, table):
    in_place = out.ctypes.data == gate.ctypes.data
    for t in range(gate.shape[0]):
        _gated_act_row(gate[t], up[t], out[t], gelu, table, in_place)


# exp(r) on |r| <= ln2/2: Taylor terms to r^7 (truncation < 3e-9 relative, under float32's rounding)
_EXP_C = (1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5)
_LN2_HI = 0.693145751953125  # ln 2 split so that n * _LN2_HI is exact for |n| < 2^9
_LN2_LO = 1.4286068203094173e-06  # ln 2 - _LN2_HI


# fastmath=False said explicitly: an undecorated option is inherited from the caller (Numba's flag
# inheritance), and this runs inside a fast-math kernel where reassociation would fold the two-part ln2
# into one float32 constant (measured: errors growing with |x| to 4.4 ulp near -87, against 1.2).
@cached_kernel(nogil=True, fastmath=False, error_model="numpy")
def _exp_nonpositive(x):
    """exp(x) for float32 x <= 0, in float32, written so that LLVM vectorises it (math.exp is a scalar
    libm call in Numba without SVML): x = n ln2 + r, exp(r) by polynomial, 2^n built from its bits.
    Measured within 1.2 ulp of exp (NumPy's float32 exp: 2.4), so the two may differ in the last bits.
    x below -87 gives exp(-87) (~1.6e-38) instead of a denormal or zero: nothing next to the 1 that the
    maximum of a softmax row contributes. Compiled without fast-math so that the two-part ln2 stays
    as written (LLVM inlines it into the fast-math caller, keeping its own instructions' flags)."""
    x = max(x, np.float32(-87.0))
    n = np.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))  # llvm.floor: vectorises
    r = (x - n * np.float32(_LN2_HI)) - n * np.float32(_LN2_LO)
    p = np.float32(_EXP_C[0])
    p = p * r + np.float32(_EXP_C[1])
    p = p * r + np.float32(_EXP_C[2])
    p = p * r + np.float32(_EXP_C[3])
    p = p * r + np.float32(_EXP_C[4])
    p = p * r + np.float32(_EXP_C[5])
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return p * u32_as_f32(np.uint32(np.int32(n) + np.int32(127)) << np.uint32(23))


# The same bits on every CPU: in a fast-math kernel LLVM turns a vector division into an approximate
# reciprocal (vrcpps, whose bits differ between Intel and AMD) refined by one Newton step, and sums a loop
# with as many partial sums as the CPU's tuning prefers (its vector width and interleaving). Both gave
# other bits on an Intel machine than on the AMD ones where tests/data/golden was recorded. These two are
# compiled without fast-math (kept as written when inlined, as _exp_nonpositive is).
@cached_kernel(nogil=True, fastmath=False, error_model="numpy")
def _divide(a, b):
    """a / b, correctly rounded."""
    return a / b


@cached_kernel(nogil=True, fastmath=False, error_model="numpy")
def _sum_by_eights(x):
    """The sum of x (float32[n]) in one fixed order: element j into partial sum j % 8 (eight independent
    chains, which LLVM packs into one vector add), the eight summed by halving, then the last n % 8."""
    n8 = x.shape[0] - x.shape[0] % 8
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
    for j in range(0, n8, 8):
        a0 += x[j]
        a1 += x[j + 1]
        a2 += x[j + 2]
        a3 += x[j + 3]
        a4 += x[j + 4]
        a5 += x[j + 5]
        a6 += x[j + 6]
        a7 += x[j + 7]
    total = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))
    for j in range(n8, x.shape[0]):
        total += x[j]
    return total


@fast_kernel
def masked_softmax_rows(scores, first_pos, group, key0, scale, softcap, window, sinks):
    """Softmax, in place, of a block of raw scores (q . k) for prefill attention through BLAS.

    scores float32[R, n]: row r is query position first_pos + r // group (the `group` query heads of
    one KV head, position-major) against keys key0 .. key0 + n - 1. Each row becomes
    softmax(scale * row) over the keys that position sees (causal, and within `window` when > 0) and
    0 elsewhere; with softcap > 0, softmax(softcap * tanh(scale * row / softcap)) (Gemma 2). Every row must see its own position: key0 <= first_pos and key0 + n > the last row's.
    sinks float32[group]: each head's attention sink (gpt-oss), -inf for none: a logit in the softmax's
    sum that takes a share of the weights and gives no value (added after the sum, as llama.cpp adds it).

    Serial on purpose: each worker of prefill attention runs it on its own block, between its BLAS
    calls (attention_blas._run_shares). As prange loops between two-thread BLAS calls, whose workers
    spin for the cores meanwhile, it was 5x slower (Gemma 3 270M shapes, T 512, medians of 15 passes
    alternating: 352 ms per pass against 70 with this and f16_head_to_f32 on one thread)."""
    n = scores.shape[1]
    if key0 > first_pos or key0 + n <= first_pos + (scores.shape[0] - 1) // group:
        raise ValueError("masked_softmax_rows: a row's own position lies outside the block's keys")
    for r in range(scores.shape[0]):
        row = scores[r]
        pos = first_pos + r // group
        lo = 0
        if window > 0 and pos - window + 1 > key0:
            lo = pos - window + 1 - key0
        hi = pos - key0 + 1  # exclusive
        row[:lo] = 0.0
        row[hi:] = 0.0
        seen = row[lo:hi]  # indices from 0: no negative-index wrap-around checks in the loops
        row_scale = scale
        if softcap > 0:
            for j in range(seen.shape[0]):
                seen[j] = softcap * np.float32(math.tanh(seen[j] * scale * (np.float32(1.0) / softcap)))
            row_scale = np.float32(1.0)
        best = seen[0]
        for j in range(1, seen.shape[0]):
            best = max(best, seen[j])
        best *= row_scale
        sink = sinks[r % group]
        if sink > best:
            best = sink
        for j in range(seen.shape[0]):
            seen[j] = _exp_nonpositive(seen[j] * row_scale - best)
        total = _sum_by_eights(seen)
        if sink > -np.inf:
            total += _exp_nonpositive(sink - best)
        inv = _divide(np.float32(1.0), total)
        for j in range(seen.shape[0]):
            seen[j] *= inv


@fast_kernel
def f16_head_to_f32(bits, head, first, out):
    """out float32[n, D] = rows first .. first + n - 1 of KV head `head` of a float16 cache given as
    its bits uint16[n_ctx, Hkv, D]; exact (F16C), and faster than NumPy's float16 conversion."""
    for i in range(out.shape[0]):
        src = bits[first + i, head]
        dst = out[i]
        for d in range(dst.shape[0]):
            dst[d] = f16_to_f32(src[d])


@exact_kernel(parallel=True)
def combine_experts(src, slots, weights, out):
    """out float32[T, E][t] = sum_j weights[t, j] * src[slots[t, j]] (src float32[P, E], slots int32[T, J],
    weights float32[T, J]), j in order, each product rounded to float32 before it is added (no fast-math:
    the order is llama.cpp's, so nothing may fuse or reorder it)."""
    for t in prange(out.shape[0]):
        _combine_row(src, slots[t], weights[t], out[t])


@exact_kernel
def combine_experts_serial(src, slots, weights, out):
    for t in range(out.shape[0]):
        _combine_row(src, slots[t], weights[t], out[t])


@exact_kernel
def _combine_row(src, slots, weights, out):
    first = src[slots[0]]
    w0 = weights[0]
    for c in range(out.shape[0]):
        out[c] = w0 * first[c]
    for j in range(1, slots.shape[0]):
        row = src[slots[j]]
        w = weights[j]
        for c in range(out.shape[0]):
            out[c] = out[c] + w * row[c]
