"""The op calls of the backend conformance suite (test_conformance.py), written once against the Backend
interface (localllm/backends/base.py): each takes host NumPy inputs, runs ops on a backend and returns
host arrays. The CPU backend runs them in the test process; the CUDA backend under numba's simulator runs
them in a child process (simulator_worker.py imports this module), so every function's arguments and
results are plain picklable values. No reference arithmetic here: the test module computes that.
"""

from __future__ import annotations

import numpy as np

from localllm.backends import Weight
from localllm.backends.base import expert_views


def to_backend(backend, host: np.ndarray):
    """A backend buffer holding a copy of `host`. The interface moves activations only through `alloc`
    (zero-filled) and the ops, so a test fills the buffer itself: NumPy assignment where the backend's
    buffers are host arrays, else the device array's copy_to_device (numba.cuda's arrays)."""
    host = np.ascontiguousarray(host)
    buffer = backend.alloc(host.shape, host.dtype)
    if backend.host_buffers:
        buffer[...] = host
    else:
        buffer.copy_to_device(host)
    return buffer


def _weight(backend, qtype: str, raw: np.ndarray, k: int) -> Weight:
    """raw uint8[N, row_bytes] holding N rows of k values in qtype, uploaded (ggml shape: ne0 = k first)."""
    return backend.upload(Weight("blk.0.conformance.weight", qtype, (k, raw.shape[0]), raw))


def _product(backend, op, w, x, bias, *extra):
    out = backend.alloc((x.shape[0], w.n_out))
    op(w, to_backend(backend, x), out, *extra, bias)  # extra: matmul_segments' bounds
    return backend.to_host(out).copy()


def supports(backend, qtype: str) -> bool:
    return bool(backend.supports(qtype))


def matmul(backend, qtype, raw, k, batches, biases):
    """matmul of each x float32[T, K] in `batches` (with the bias float32[N] or None at the same index)
    through one uploaded weight, in order (a T=1 product twice: the first call may make a per-weight
    plan that the second uses). Returns the outputs and the type the backend holds the weight in."""
    w = _weight(backend, qtype, raw, k)
    outs = [_product(backend, backend.matmul, w, x, bias) for x, bias in zip(batches, biases)]
    return {"outs": outs, "held_as": w.qtype}


def matmul_rows(backend, qtype, raw, k, x, bias):
    """matmul_rows of x float32[T, K], and each of its rows alone as a T=1 matmul."""
    w = _weight(backend, qtype, raw, k)
    together = _product(backend, backend.matmul_rows, w, x, bias)
    alone = [_product(backend, backend.matmul, w, x[t : t + 1], bias)[0] for t in range(x.shape[0])]
    return {"together": together, "alone": np.array(alone), "held_as": w.qtype}


def matmul_segments(backend, qtype, raw, k, x, bounds, bias):
    """matmul_segments of x float32[T, K] cut at `bounds`, and each segment alone as a matmul."""
    w = _weight(backend, qtype, raw, k)
    together = _product(backend, backend.matmul_segments, w, x, bias, np.asarray(bounds))
    alone = [_product(backend, backend.matmul, w, x[a:b], bias) for a, b in zip(bounds[:-1], bounds[1:])]
    return {"together": together, "alone": np.concatenate(alone), "held_as": w.qtype}


def matmul_experts(backend, qtype, raw, k, n_expert, x, groups, bounds, bias=None):
    """matmul_experts of x float32[P, K] (rows grouped by expert: bounds[g]..bounds[g+1] through expert
    groups[g]) over n_expert matrices stored one after another in raw (uint8[n_expert * N, row_bytes]),
    with each expert's bias (float32[n_expert, N] or None), and each row alone as a T=1 matmul of its
    expert with its bias."""
    n_out = raw.shape[0] // n_expert
    stacked = backend.upload(Weight("blk.0.ffn_up_exps.weight", qtype, (k, n_out, n_expert), raw))
    experts = expert_views(stacked)
    out = backend.alloc((x.shape[0], n_out))
    backend.matmul_experts(stacked, to_backend(backend, x), np.asarray(groups, np.int32), np.asarray(bounds, np.int32), out,
                           bias)
    alone = []
    for g, expert in enumerate(groups):
        for row in range(bounds[g], bounds[g + 1]):
            alone.append(_product(backend, backend.matmul, experts[expert], x[row : row + 1],
                                  None if bias is None else bias[expert])[0])
    return {"together": backend.to_host(out).copy(), "alone": np.array(alone), "held_as": stacked.qtype}


def combine_experts(backend, src, slots, weights):
    """combine_experts of src float32[P, E] through slots int32[T, J] and weights float32[T, J]."""
    out = backend.alloc((slots.shape[0], src.shape[1]))
    backend.combine_experts(to_backend(backend, src), slots, weights, out)
    return backend.to_host(out).copy()


def take_rows(backend, x, rows):
    """Rows rows int32[R] of the activation x float32[T, E]: float32[R, E]."""
    out = backend.alloc((rows.shape[0], x.shape[1]))
    backend.take_rows(to_backend(backend, x), rows, out)
    return backend.to_host(out).copy()


def embed(backend, qtype, raw, k, ids):
    """Rows ids int32[T] of the matrix raw (N rows of k values in qtype): float32[T, k]."""
    w = _weight(backend, qtype, raw, k)
    out = backend.alloc((ids.shape[0], k))
    backend.embed(w, ids, out)
    return {"out": backend.to_host(out).copy(), "held_as": w.qtype}


def rms_norm(backend, x, weight, eps, in_place):
    """x float32[..., D] normalised row by row; in place (out is x) as the Q/K norms run, or not."""
    src = to_backend(backend, x)
    out = src if in_place else backend.alloc(x.shape)
    backend.rms_norm(src, weight, eps, out)
    return backend.to_host(out).copy()


def layer_norm(backend, x, weight, bias, eps, in_place):
    """x float32[..., D] layer-normalised row by row (bias None: none); in place, or not."""
    src = to_backend(backend, x)
    out = src if in_place else backend.alloc(x.shape)
    backend.layer_norm(src, weight, bias, eps, out)
    return backend.to_host(out).copy()


def rope(backend, x, positions, n_rot, base, neox, factors, freq_scale, mscale=1.0):
    """x float32[T, H, D] rotated in place."""
    buffer = to_backend(backend, x)
    backend.rope(buffer, positions, n_rot, base, neox, factors, freq_scale, mscale)
    return backend.to_host(buffer).copy()


def attention(backend, q, cache_k, cache_v, start, scale, window, softcap=0.0, sinks=None):
    """q float32[T, Hq, D] over the float16 caches [n_ctx, Hkv, D] (sinks: float32[Hq] or None): float32[T, Hq, D]."""
    out = backend.alloc(q.shape)
    backend.attention(to_backend(backend, q), to_backend(backend, cache_k), to_backend(backend, cache_v),
                      start, scale, window, out, softcap, sinks)
    return backend.to_host(out).copy()


def attention_bidirectional(backend, q, cache_k, cache_v, start, scale, sinks=None):
    """Non-causal attention of q float32[T, Hq, D] over the float16 caches' first start + T rows: float32[T, Hq, D]."""
    out = backend.alloc(q.shape)
    backend.attention_bidirectional(to_backend(backend, q), to_backend(backend, cache_k), to_backend(backend, cache_v),
                                    start, scale, out, sinks)
    return backend.to_host(out).copy()


def kv_store(backend, k, v, n_ctx, start):
    """k, v float32[T, Hkv, D] stored from position `start` into zero-filled float16 caches [n_ctx, Hkv, D]."""
    cache_k, cache_v = backend.alloc((n_ctx, *k.shape[1:]), np.float16), backend.alloc((n_ctx, *k.shape[1:]), np.float16)
    with np.errstate(over="ignore"):  # the tests store values past float16's range on purpose
        backend.kv_store(cache_k, cache_v, to_backend(backend, k), to_backend(backend, v), start)
    return {"k": backend.to_host(cache_k).copy(), "v": backend.to_host(cache_v).copy()}


def paged(backend, q, k, v, cache_k, cache_v, layout, scale, window, contiguous, softcap=0.0, sinks=None):
    """kv_store_paged of k, v float32[T, Hkv, D] into the paged caches float16[NB, BS, Hkv, D] at
    layout.slots, then attention_paged of q float32[T, Hq, D]; and, for each sequence s, `attention` of its
    rows on the contiguous cache contiguous[s] (float16[n, Hkv, D]: its keys in position order)."""
    dev_k, dev_v = to_backend(backend, cache_k), to_backend(backend, cache_v)
    backend.kv_store_paged(dev_k, dev_v, to_backend(backend, k), to_backend(backend, v), layout.slots)
    out = backend.alloc(q.shape)
    backend.attention_paged(to_backend(backend, q), dev_k, dev_v, layout, scale, window, out, softcap, sinks)
    alone = []
    for s, (keys, values) in enumerate(contiguous):
        first, n = int(layout.seq_first[s]), int(layout.seq_rows[s])
        alone.append(attention(backend, q[first : first + n], keys, values, int(layout.seq_start[s]), scale, window,
                               softcap, sinks))
    return {"k": backend.to_host(dev_k).copy(), "v": backend.to_host(dev_v).copy(),
            "out": backend.to_host(out).copy(), "alone": np.concatenate(alone)}


def gated_act(backend, gate, up, kind, in_place):
    """act(gate) * up for gate, up float32[T, F]; in place (out is gate) as the decoder runs it, or not."""
    src = to_backend(backend, gate)
    out = src if in_place else backend.alloc(gate.shape)
    backend.gated_act(src, to_backend(backend, up), out, kind)
    return backend.to_host(out).copy()


def short_conv(backend, x_parts, weight, silu):
    """short_conv over consecutive parts of one sequence (each a float32[T_i, C]), the window carried
    from a zero start; returns each part's output and the window after the last."""
    k, c = weight.shape[1], weight.shape[0]
    window = to_backend(backend, np.zeros((k - 1, c), dtype=np.float32))
    outs = []
    for x in x_parts:
        out = backend.alloc(x.shape)
        backend.short_conv(to_backend(backend, x), weight, window, out, silu)
        outs.append(backend.to_host(out).copy())
    return {"outs": outs, "window": backend.to_host(window).copy()}


def delta_net(backend, parts, state, grouped=False):
    """delta_net over consecutive parts of one sequence, each a dict of q, k, v, g, beta (float32
    [T_i, ...]), the state carried from `state`; returns each part's output and the state after."""
    device_state = to_backend(backend, state)
    outs = []
    for part in parts:
        out = backend.alloc(part["v"].shape)
        backend.delta_net(to_backend(backend, part["q"]), to_backend(backend, part["k"]), to_backend(backend, part["v"]),
                          part["g"], part["beta"], device_state, out, grouped)
        outs.append(backend.to_host(out).copy())
    return {"outs": outs, "state": backend.to_host(device_state).copy()}


def add(backend, a, b, in_place):
    """a + b for float32 arrays of one shape; in place (out is a) as the residual adds run, or not."""
    dev_a = to_backend(backend, a)
    out = dev_a if in_place else backend.alloc(a.shape)
    backend.add(dev_a, to_backend(backend, b), out)
    return backend.to_host(out).copy()


def scale(backend, x, factor):
    out = backend.alloc(x.shape)
    backend.scale(to_backend(backend, x), factor, out)
    return backend.to_host(out).copy()


def softcap(backend, x, cap):
    out = backend.alloc(x.shape)
    backend.softcap(to_backend(backend, x), cap, out)
    return backend.to_host(out).copy()


RUNS = {f.__name__: f for f in (supports, matmul, matmul_rows, matmul_segments, matmul_experts, combine_experts, take_rows,
                                 short_conv, delta_net, embed, rms_norm, layer_norm, rope, attention, attention_bidirectional, kv_store, paged, gated_act, add, scale, softcap)}
