"""Kernels of the recurrent layers (Qwen3.5's and Qwen3-Next's gated delta net): the short causal
convolution over time and the gated delta rule, as Backend.short_conv and Backend.delta_net define them.

The delta rule's state of one value head is a matrix M [S (value), S (key)], stored as llama.cpp stores
it (row j of the value dimension contiguous over the key dimension i). One token t of head h:

    M <- exp(g[t, h]) * M                          (decay; g is a log, <= 0)
    d[j] = beta[t, h] * (v[t, h, j] - M[j] . k)     (the delta: what the state mispredicts for k)
    M[j] <- M[j] + d[j] * k                         (a rank-one write)
    out[t, h, j] = scale * (M[j] . q)

Per row j that is one pass over M[j] (decay, dot, write, dot), and rows are independent, so a token
costs 4 S^2 multiply-adds per head and heads run in parallel.

A prompt goes through the same rule a chunk of CHUNK tokens at a time (`delta_net_chunks`), the form
that replaces the token loop by products over the chunk (the "WY" form of the delta rule, as the chunked
kernels of flash-linear-attention and llama.cpp's graph do it). With G[t] the running sum of g inside
the chunk, M0 the state before it and all d solved at once:

    d[t] = beta[t] * (v[t] - exp(G[t]) M0 k[t]) - sum_{s<t} beta[t] exp(G[t] - G[s]) (k[t] . k[s]) d[s]
    out[t] = scale * (exp(G[t]) M0 q[t] + sum_{s<=t} exp(G[t] - G[s]) (q[t] . k[s]) d[s])
    M = exp(G[n]) M0 + sum_s exp(G[n] - G[s]) d[s] k[s]^T

The same arithmetic in another order: it agrees with the token loop within float32 rounding (the tests
bound it), and every exp(G[t] - G[s]) is of a non-positive number, so nothing overflows. Both forms are
float32 with vectorised sums (fastmath: each dot product in partial sums across 16 lanes); the float64
scalar loops they replaced took 14 ms of a 29 ms Qwen3.5-4B-shaped prompt token.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from ...jit import exact_kernel, fast_kernel

CHUNK = 64  # tokens per chunk of delta_net_chunks (llama.cpp's chunk size for scalar gates)


@exact_kernel
def _silu(x):
    return x / (np.float32(1.0) + np.float32(math.exp(-x))) if x > np.float32(-80.0) else np.float32(0.0)


@exact_kernel(parallel=True)
def short_conv(x, weight, window, out, silu):
    """out[t, c] = sum_i weight[c, i] * xin[t + i, c], i = 0..K-1 in order (ggml_ssm_conv), then SiLU
    when `silu`; xin = window rows then x rows. x float32[T, C], weight float32[C, K], window
    float32[K-1, C] (the K-1 inputs before x), out float32[T, C] (not x). The window is left for the
    next call by short_conv_window."""
    n_window = window.shape[0]
    for t in prange(x.shape[0]):
        row = out[t]
        for c in range(row.shape[0]):
            row[c] = np.float32(0.0)
        for i in range(weight.shape[1]):
            s = t + i
            src = window[s] if s < n_window else x[s - n_window]
            for c in range(row.shape[0]):
                row[c] += src[c] * weight[c, i]
        if silu:
            for c in range(row.shape[0]):
                row[c] = _silu(row[c])


@exact_kernel
def short_conv_window(x, window):
    """window float32[K-1, C] <- the last K-1 rows of (window rows, then x float32[T, C] rows)."""
    n_window, n = window.shape[0], x.shape[0]
    for j in range(n_window):  # reads index n + j >= j + 1 of the old window: never one already written
        s = n + j
        if s < n_window:
            window[j, :] = window[s]
        else:
            window[j, :] = x[s - n_window]


@fast_kernel(parallel=True)
def delta_net_steps(q, k, v, g, beta, state, out, scale, group):
    """The gated delta rule token by token (module docstring). q, k float32[T, Hk, S]; v, out
    float32[T, Hv, S]; g, beta float32[T, Hv]; state float32[Hv, S, S], updated in place. Value head h
    reads key head h % Hk (group 0: ggml_repeat's tiling, as llama.cpp's op reads it), or h // group.
    Vectorised sums (fastmath): each dot product in 16-lane partial sums."""
    n_k = q.shape[1]
    for h in prange(state.shape[0]):
        m = state[h]
        hk = h // group if group else h % n_k
        for t in range(q.shape[0]):
            decay = np.float32(math.exp(g[t, h]))
            b = beta[t, h]
            kt, qt = k[t, hk], q[t, hk]
            for j in range(m.shape[0]):
                row = m[j]
                s = np.float32(0.0)
                for i in range(row.shape[0]):
                    row[i] *= decay
                    s += row[i] * kt[i]
                d = (v[t, h, j] - s) * b
                o = np.float32(0.0)
                for i in range(row.shape[0]):
                    row[i] += d * kt[i]
                    o += row[i] * qt[i]
                out[t, h, j] = o * scale


@fast_kernel
def _state_products(m, x, first, n, hk, out):
    """out[t, j] = m[j] . x[first + t, hk] for t < n (a head's state rows against a chunk's q or k)."""
    for j in range(m.shape[0]):
        row = m[j]
        for t in range(n):
            xt = x[first + t, hk]
            s = np.float32(0.0)
            for i in range(row.shape[0]):
                s += row[i] * xt[i]
            out[t, j] = s


@fast_kernel(parallel=True)
def delta_net_chunks(q, k, v, g, beta, state, out, scale, group):
    """delta_net_steps' result computed CHUNK tokens at a time (module docstring); same arguments. Every
    inner loop runs along a contiguous row (vectorised, fastmath)."""
    n_k, n_tokens, size = q.shape[1], q.shape[0], q.shape[2]
    for h in prange(state.shape[0]):
        m = state[h]
        hk = h // group if group else h % n_k
        cum = np.empty(CHUNK + 1, dtype=np.float32)
        weight = np.empty(CHUNK, dtype=np.float32)
        dots = np.empty((CHUNK, CHUNK), dtype=np.float32)
        d = np.empty((CHUNK, size), dtype=np.float32)
        mk = np.empty((CHUNK, size), dtype=np.float32)  # rows t: M0 k[t], then M0 q[t]
        acc = np.empty(size, dtype=np.float32)
        for first in range(0, n_tokens, CHUNK):
            n = min(CHUNK, n_tokens - first)
            cum[0] = 0.0
            for t in range(n):
                cum[t + 1] = cum[t] + g[first + t, h]
            _state_products(m, k, first, n, hk, mk)  # mk[t, j] = M0[j] . k[t]
            # d[t] = beta[t] (v[t] - exp(G[t]) M0 k[t]) - sum_{s<t} beta[t] exp(G[t]-G[s]) (k[t].k[s]) d[s]
            for t in range(n):
                kt = k[first + t, hk]
                grow, b = np.float32(math.exp(cum[t + 1])), beta[first + t, h]
                vt = v[first + t, h]
                for j in range(size):
                    d[t, j] = b * (vt[j] - grow * mk[t, j])
                for s_ in range(t):
                    ks = k[first + s_, hk]
                    dot = np.float32(0.0)
                    for i in range(size):
                        dot += kt[i] * ks[i]
                    f = b * np.float32(math.exp(cum[t + 1] - cum[s_ + 1])) * dot
                    ds = d[s_]
                    dt = d[t]
                    for j in range(size):
                        dt[j] -= f * ds[j]
            _state_products(m, q, first, n, hk, mk)  # mk[t, j] = M0[j] . q[t]
            # out[t] = scale (exp(G[t]) M0 q[t] + sum_{s<=t} exp(G[t]-G[s]) (q[t].k[s]) d[s])
            for t in range(n):
                qt = q[first + t, hk]
                grow = np.float32(math.exp(cum[t + 1]))
                for j in range(size):
                    acc[j] = grow * mk[t, j]
                for s_ in range(t + 1):
                    ks = k[first + s_, hk]
                    dot = np.float32(0.0)
                    for i in range(size):
                        dot += qt[i] * ks[i]
                    f = dot * np.float32(math.exp(cum[t + 1] - cum[s_ + 1]))
                    ds = d[s_]
                    for j in range(size):
                        acc[j] += f * ds[j]
                o = out[first + t, h]
                for j in range(size):
                    o[j] = acc[j] * scale
            # M = exp(G[n]) M0 + sum_s exp(G[n]-G[s]) d[s] k[s]^T
            total = np.float32(math.exp(cum[n]))
            for s_ in range(n):
                weight[s_] = np.float32(math.exp(cum[n] - cum[s_ + 1]))
            for j in range(size):
                row = m[j]
                for i in range(size):
                    row[i] *= total
                for s_ in range(n):
                    c = weight[s_] * d[s_, j]
                    ks = k[first + s_, hk]
                    for i in range(size):
                        row[i] += c * ks[i]
