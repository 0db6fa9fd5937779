"""Device kernels for the non-matmul ops (contracts: backends/base.py). Shapes in each docstring.

Row kernels (RMS norm, attention) run one block per row and reduce in shared memory over however many
threads the block has (a power of two); elementwise kernels are grid-stride loops. float16 data (the KV
cache) is passed as its uint16 bits and converted with blocks.f16_to_f32 / f32_to_f16.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .blocks import f16_to_f32, f32_to_f16
from .launch import MAX_HEAD_DIM, MAX_THREADS

SQRT_2_OVER_PI = np.float32(0.7978845608028654)


@cuda.jit(device=True)
def _block_sum(red, value):
    """Sum of `value` over the block's threads (blockDim.x a power of two), returned to every thread.
    red: float32[MAX_THREADS] shared scratch, free again when this returns."""
    tid = cuda.threadIdx.x
    red[tid] = value
    cuda.syncthreads()
    half = cuda.blockDim.x // 2
    while half > 0:
        if tid < half:
            red[tid] += red[tid + half]
        cuda.syncthreads()
        half //= 2
    total = red[0]
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def _block_max(red, value):
    tid = cuda.threadIdx.x
    red[tid] = value
    cuda.syncthreads()
    half = cuda.blockDim.x // 2
    while half > 0:
        if tid < half and red[tid + half] > red[tid]:
            red[tid] = red[tid + half]
        cuda.syncthreads()
        half //= 2
    best = red[0]
    cuda.syncthreads()
    return best


@cuda.jit
def fill_zero(flat):
    """flat uint8[n] = 0 (the simulator has no memset)."""
    for i in range(cuda.grid(1), flat.shape[0], cuda.gridsize(1)):
        flat[i] = 0


@cuda.jit
def take_rows(x, rows, out):
    """out float32[R, E] = x float32[T, E] rows rows[R] (int32[R], each in 0..T-1)."""
    n_cols = x.shape[1]
    for job in range(cuda.grid(1), rows.shape[0] * n_cols, cuda.gridsize(1)):
        r = job // n_cols
        c = job % n_cols
        out[r, c] = x[rows[r], c]


@cuda.jit
def combine_experts(src, slots, weights, out):
    """out float32[T, E][t] = sum_j weights[t, j] * src[slots[t, j]] (src float32[P, E], slots int32[T, J],
    weights float32[T, J]), j in order (NVVM may fuse a product with its add: within an ulp of the CPU's)."""
    n_cols = out.shape[1]
    for job in range(cuda.grid(1), out.shape[0] * n_cols, cuda.gridsize(1)):
        t = job // n_cols
        c = job % n_cols
        acc = weights[t, 0] * src[slots[t, 0], c]
        for j in range(1, slots.shape[1]):
            product = weights[t, j] * src[slots[t, j], c]
            acc = acc + product
        out[t, c] = acc


@cuda.jit
def rms_norm(x, weight, eps, out):
    """x float32[R, D], weight float32[D] -> out float32[R, D] (may be x); one block per row. The sum of
    squares in float64, like the CPU backend; out = x * inv * weight in float32, in that order."""
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    d = x.shape[1]
    red = cuda.shared.array(MAX_THREADS, np.float64)
    s = np.float64(0.0)
    for i in range(tid, d, cuda.blockDim.x):
        v = np.float64(x[r, i])
        s += v * v
    total = _block_sum(red, s)
    inv = np.float32(1.0 / math.sqrt(total / d + np.float64(eps)))
    for i in range(tid, d, cuda.blockDim.x):
        out[r, i] = x[r, i] * inv * weight[i]


@cuda.jit
def layer_norm(x, weight, bias, eps, out):
    """x float32[R, D], weight and bias float32[D] -> out float32[R, D] (may be x); one block per row. As
    the CPU backend: mean, then the centred values' mean square, both summed in float64; out =
    (x - mean) * inv * weight + bias in float32."""
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    d = x.shape[1]
    red = cuda.shared.array(MAX_THREADS, np.float64)
    s = np.float64(0.0)
    for i in range(tid, d, cuda.blockDim.x):
        s += np.float64(x[r, i])
    mean = np.float32(_block_sum(red, s) / d)
    s = np.float64(0.0)
    for i in range(tid, d, cuda.blockDim.x):
        v = x[r, i] - mean
        s += np.float64(v * v)
    variance = np.float32(_block_sum(red, s) / d)
    inv = np.float32(1.0) / np.float32(math.sqrt(variance + eps))
    for i in range(tid, d, cuda.blockDim.x):
        out[r, i] = (x[r, i] - mean) * inv * weight[i] + bias[i]


@cuda.jit
def rope(x, positions, inv_freq, neox, mscale):
    """Rotate x float32[T, H, D] in place; positions int32[T]; inv_freq float32[n_rot/2] (the host
    computes it as the CPU backend does); cos and sin times mscale. Angles in float64: positions reach
    1e5 and more."""
    n_tok, n_head, _ = x.shape
    half = inv_freq.shape[0]
    for job in range(cuda.grid(1), n_tok * n_head * half, cuda.gridsize(1)):
        i = job % half
        h = (job // half) % n_head
        t = job // (half * n_head)
        angle = np.float64(positions[t]) * np.float64(inv_freq[i])
        c = np.float32(math.cos(angle)) * mscale
        s = np.float32(math.sin(angle)) * mscale
        if neox:
            ia, ib = i, i + half
        else:
            ia, ib = 2 * i, 2 * i + 1
        a = x[t, h, ia]
        b = x[t, h, ib]
        x[t, h, ia] = a * c - b * s
        x[t, h, ib] = a * s + b * c


@cuda.jit
def kv_store(cache, src, slots):
    """cache uint16[P, Hkv, D] (float16 bits) row slots[t] <- src float32[T, Hkv, D], rounded to nearest
    even. slots int32[T] (the contiguous cache passes start + t)."""
    n_tok, n_head, d = src.shape
    for job in range(cuda.grid(1), n_tok * n_head * d, cuda.gridsize(1)):
        i = job % d
        h = (job // d) % n_head
        t = job // (d * n_head)
        cache[slots[t], h, i] = f32_to_f16(src[t, h, i])


@cuda.jit
def kv_store_range(cache, src, start):
    """cache uint16[n_ctx, Hkv, D] rows start .. start + T <- src float32[T, Hkv, D] (decode's path:
    no slot list to copy to the device)."""
    n_tok, n_head, d = src.shape
    for job in range(cuda.grid(1), n_tok * n_head * d, cuda.gridsize(1)):
        i = job % d
        h = (job // d) % n_head
        t = job // (d * n_head)
        cache[start + t, h, i] = f32_to_f16(src[t, h, i])


@cuda.jit(device=True)
def _attend(q, t, h, keys, values, table, kvh, pos, scale, softcap, sinks, window, out, scores, job):
    """out[t, h] = softmax(cap(q[t, h] . K[j] * scale)) V over keys j in [first, pos], j < pos - window
    excluded when window > 0; cap(s) = softcap * tanh(s / softcap) when softcap > 0, else s; sinks[h]: the
    head's attention sink (a logit in the softmax's sum with no value), -inf for none. keys/values uint16[NB, BS, Hkv, D]: key j lives in block table[j // BS] at
    j % BS. scores float32[*, n_keys] row `job` is scratch. One block per (t, h)."""
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    d = q.shape[2]
    bs = keys.shape[1]
    first = 0
    if window > 0 and pos - window + 1 > 0:
        first = pos - window + 1
    qs = cuda.shared.array(MAX_HEAD_DIM, np.float32)
    red = cuda.shared.array(MAX_THREADS, np.float32)
    for i in range(tid, d, n):
        qs[i] = q[t, h, i]
    cuda.syncthreads()
    best = np.float32(-math.inf)
    for j in range(first + tid, pos + 1, n):
        blk = table[j // bs]
        off = j % bs
        s = np.float32(0.0)
        for i in range(d):
            s += qs[i] * f16_to_f32(keys[blk, off, kvh, i])
        s *= scale
        if softcap > 0:
            s = softcap * np.float32(math.tanh(s * (np.float32(1.0) / softcap)))
        scores[job, j] = s
        best = max(best, s)
    best = _block_max(red, best)
    sink = sinks[h]
    if sink > best:
        best = sink
    part = np.float32(0.0)
    for j in range(first + tid, pos + 1, n):
        e = np.float32(math.exp(scores[job, j] - best))
        scores[job, j] = e
        part += e
    total = _block_sum(red, part)  # its barriers also publish the scores
    if sink > -math.inf:
        total += np.float32(math.exp(sink - best))
    inv = np.float32(1.0) / total
    for i in range(tid, d, n):
        acc = np.float32(0.0)
        for j in range(first, pos + 1):
            acc += scores[job, j] * f16_to_f32(values[table[j // bs], j % bs, kvh, i])
        out[t, h, i] = acc * inv


@cuda.jit
def attention(q, keys, values, table, start, t0, scale, softcap, sinks, window, out, scores):
    """Contiguous cache: q float32[T, Hq, D] rows t0 .. t0 + Tc (Tc = scores.shape[0] / Hq) at positions
    start + t; keys/values uint16[1, n_ctx, Hkv, D]; table int32[1] = {0}; scores float32[Tc*Hq, n_keys]."""
    n_head = q.shape[1]
    job = cuda.blockIdx.x
    t = t0 + job // n_head
    h = job % n_head
    kvh = h // (n_head // keys.shape[2])
    _attend(q, t, h, keys, values, table, kvh, start + t, scale, softcap, sinks, window, out, scores, job)


@cuda.jit
def attention_paged(q, keys, values, tables, row_seq, positions, scale, softcap, sinks, window, out, scores):
    """Paged cache: row t of q float32[T, Hq, D] belongs to sequence row_seq[t] at positions[t]; keys/values
    uint16[NB, BS, Hkv, D]; tables int32[S, max_blocks]; scores float32[T*Hq, n_keys]."""
    n_head = q.shape[1]
    job = cuda.blockIdx.x
    t = job // n_head
    h = job % n_head
    kvh = h // (n_head // keys.shape[2])
    _attend(q, t, h, keys, values, tables[row_seq[t]], kvh, positions[t], scale, softcap, sinks, window, out, scores, job)


@cuda.jit
def gated_act(gate, up, out, gelu):
    """out float32[T, F] = act(gate) * up; gelu: GELU, tanh form (in float32, as llama.cpp's CUDA
    backend computes it; the CPU backend reads a float16 table), else SiLU."""
    n_cols = gate.shape[1]
    for job in range(cuda.grid(1), gate.shape[0] * n_cols, cuda.gridsize(1)):
        r = job // n_cols
        c = job % n_cols
        g = gate[r, c]
        if gelu:
            inner = SQRT_2_OVER_PI * g * (np.float32(1.0) + np.float32(0.044715) * g * g)
            a = np.float32(0.5) * g * (np.float32(1.0) + np.float32(math.tanh(inner)))
        else:
            a = g / (np.float32(1.0) + np.float32(math.exp(-g)))
        out[r, c] = a * up[r, c]


@cuda.jit
def swiglu_oai(gate, up, out, alpha, limit):
    """out float32[T, F] = min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, -limit, limit) + 1)
    (gpt-oss's clamped SwiGLU, ggml_swiglu_oai)."""
    n_cols = gate.shape[1]
    for job in range(cuda.grid(1), gate.shape[0] * n_cols, cuda.gridsize(1)):
        r = job // n_cols
        c = job % n_cols
        g = min(gate[r, c], limit)
        u = min(max(up[r, c], -limit), limit)
        out[r, c] = g / (np.float32(1.0) + np.float32(math.exp(-alpha * g))) * (u + np.float32(1.0))


@cuda.jit
def sigmoid_gate(gate, up, out):
    """out float32[T, F] = sigmoid(gate) * up."""
    n_cols = gate.shape[1]
    for job in range(cuda.grid(1), gate.shape[0] * n_cols, cuda.gridsize(1)):
        r = job // n_cols
        c = job % n_cols
        out[r, c] = up[r, c] / (np.float32(1.0) + np.float32(math.exp(-gate[r, c])))


@cuda.jit
def short_conv(x, weight, window, out, silu):
    """out float32[T, C][t, c] = sum_i weight[c, i] * (window rows, then x rows)[t + i, c], SiLU'd when
    `silu` (Backend.short_conv); a thread per channel, so that it can then slide its channel's window."""
    n_window = window.shape[0]
    for c in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
        for t in range(x.shape[0]):
            acc = np.float32(0.0)
            for i in range(weight.shape[1]):
                s = t + i
                acc += (window[s, c] if s < n_window else x[s - n_window, c]) * weight[c, i]
            if silu:
                acc = acc / (np.float32(1.0) + np.float32(math.exp(-acc)))
            out[t, c] = acc
        for j in range(n_window):  # reads index T + j > j of the old window: never one already written
            s = x.shape[0] + j
            window[j, c] = window[s, c] if s < n_window else x[s - n_window, c]


@cuda.jit
def delta_net(q, k, v, g, beta, state, out, scale, group):
    """The gated delta rule token by token (Backend.delta_net): a thread per (value head, state row j),
    each updating its own row of the head's state (rows are independent). Key head h % Hk, or h // group."""
    size = state.shape[1]
    n_k = q.shape[1]
    for job in range(cuda.grid(1), state.shape[0] * size, cuda.gridsize(1)):
        h = job // size
        j = job % size
        hk = h // group if group else h % n_k
        row = state[h, j]
        for t in range(q.shape[0]):
            decay = np.float32(math.exp(g[t, h]))
            s = np.float32(0.0)
            for i in range(size):
                row[i] *= decay
                s += row[i] * k[t, hk, i]
            d = (v[t, h, j] - s) * beta[t, h]
            o = np.float32(0.0)
            for i in range(size):
                row[i] += d * k[t, hk, i]
                o += row[i] * q[t, hk, i]
            out[t, h, j] = o * scale


DELTA_CHUNK = 64  # tokens per chunk of delta_net_chunks (the CPU backend's too)
DELTA_CUMULATIVE = DELTA_CHUNK + 1  # a named constant: numba-cuda takes only literal shared-array shapes


@cuda.jit
def delta_net_chunks(q, k, v, g, beta, state, out, scale, group, deltas):
    """The gated delta rule over a prompt, DELTA_CHUNK tokens at a time (the CPU backend's chunked form,
    backends/cpu/recurrent.py): a block per value head. The block computes the chunk's k.k and q.k products
    together (shared memory); then each thread updates the state rows it owns (j = thread, thread + block,
    ...): the deltas of the chunk's tokens (a triangular solve along the tokens), the outputs, the state.
    deltas float32[Hv, DELTA_CHUNK, S]: scratch for each row's deltas."""
    h = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    step = cuda.blockDim.x
    size = state.shape[1]
    hk = h // group if group else h % q.shape[1]
    pair = cuda.shared.array((DELTA_CHUNK, DELTA_CHUNK), np.float32)
    cum = cuda.shared.array(DELTA_CUMULATIVE, np.float32)
    m = state[h]
    d = deltas[h]
    for first in range(0, q.shape[0], DELTA_CHUNK):
        n = min(DELTA_CHUNK, q.shape[0] - first)
        if tid == 0:
            cum[0] = 0.0
            for t in range(n):
                cum[t + 1] = cum[t] + g[first + t, h]
        cuda.syncthreads()
        # pair[t, s] = beta[t] exp(G[t] - G[s]) (k[t] . k[s]), s < t
        for job in range(tid, n * n, step):
            t = job // n
            s_ = job % n
            if s_ < t:
                dot = np.float32(0.0)
                for i in range(size):
                    dot += k[first + t, hk, i] * k[first + s_, hk, i]
                pair[t, s_] = beta[first + t, h] * np.float32(math.exp(cum[t + 1] - cum[s_ + 1])) * dot
        cuda.syncthreads()
        for j in range(tid, size, step):
            for t in range(n):
                mk = np.float32(0.0)
                for i in range(size):
                    mk += m[j, i] * k[first + t, hk, i]
                delta = beta[first + t, h] * (v[first + t, h, j] - np.float32(math.exp(cum[t + 1])) * mk)
                for s_ in range(t):
                    delta -= pair[t, s_] * d[s_, j]
                d[t, j] = delta
        cuda.syncthreads()
        # pair[t, s] = exp(G[t] - G[s]) (q[t] . k[s]), s <= t
        for job in range(tid, n * n, step):
            t = job // n
            s_ = job % n
            if s_ <= t:
                dot = np.float32(0.0)
                for i in range(size):
                    dot += q[first + t, hk, i] * k[first + s_, hk, i]
                pair[t, s_] = np.float32(math.exp(cum[t + 1] - cum[s_ + 1])) * dot
        cuda.syncthreads()
        for j in range(tid, size, step):
            for t in range(n):
                mq = np.float32(0.0)
                for i in range(size):
                    mq += m[j, i] * q[first + t, hk, i]
                o = np.float32(math.exp(cum[t + 1])) * mq
                for s_ in range(t + 1):
                    o += pair[t, s_] * d[s_, j]
                out[first + t, h, j] = o * scale
            total = np.float32(math.exp(cum[n]))
            for i in range(size):
                acc = total * m[j, i]
                for s_ in range(n):
                    acc += np.float32(math.exp(cum[n] - cum[s_ + 1])) * d[s_, j] * k[first + s_, hk, i]
                m[j, i] = acc
        cuda.syncthreads()


@cuda.jit
def add(a, b, out):
    """out float32[R, C] = a + b."""
    n_cols = a.shape[1]
    for job in range(cuda.grid(1), a.shape[0] * n_cols, cuda.gridsize(1)):
        r = job // n_cols
        c = job % n_cols
        out[r, c] = a[r, c] + b[r, c]


@cuda.jit
def scale(x, factor, out):
    """out float32[R, C] = x * factor."""
    n_cols = x.shape[1]
    for job in range(cuda.grid(1), x.shape[0] * n_cols, cuda.gridsize(1)):
        r = job // n_cols
        c = job % n_cols
        out[r, c] = x[r, c] * factor


@cuda.jit
def softcap(x, cap, out):
    """out float32[R, C] = cap * tanh(x / cap) (llama.cpp's order: a scale by 1/cap, tanh, a scale by cap)."""
    n_cols = x.shape[1]
    inv = np.float32(1.0) / cap
    for job in range(cuda.grid(1), x.shape[0] * n_cols, cuda.gridsize(1)):
        r = job // n_cols
        c = job % n_cols
        out[r, c] = cap * np.float32(math.tanh(x[r, c] * inv))
