"""Decode attention on the CPU: one query row (or a few) against the float16 KV cache, contiguous or
paged, in a fixed order (prefill-sized batches go through attention_blas.py)."""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from ...jit import cached_kernel, f16_to_f32
from .quant_kernels.lanes import DOT_LANES, axpy4_f16_lanes, axpy_f16_lanes, dot4_f32_f16_lanes, dot_f32_f16_lanes, prefetch_lines


# The decode attention kernels compute in a fixed order, without fast-math: with it, LLVM chose how to
# reassociate the dot products' sums and whether to fuse multiply-adds per compilation, and a process
# that compiled these kernels got last-bit different results from one that loaded them from Numba's
# cache (scripts/check_cold_warm.py: greedy decodes parting from step 3). The q.k products go through
# an intrinsic written as vector IR (dot_f32_f16_lanes): its order is fixed by the IR and it still runs
# packed, 6x faster than plain Numba loops without fast-math (a 256-wide head over 640 keys: 33 -> 5 us).
# fastmath=False is stated: an unstated option is inherited from a fast-math caller.
_ordered = cached_kernel(nogil=True, fastmath=False, error_model="numpy")


@_ordered
def _dot_f16(a, bits):
    """a float32[D] . b, b given as float16 bits uint16[D]: DOT_LANES-wide sums, then the tail in order."""
    n = a.shape[0]
    full = n - n % DOT_LANES
    total = dot_f32_f16_lanes(a, bits, full)
    for i in range(full, n):
        total += a[i] * f16_to_f32(bits[i])
    return total


@_ordered
def _axpy_f16(alpha, bits, y):
    """y float32[D] += alpha * x, x given as float16 bits uint16[D] (a product, then a sum: no fusing):
    DOT_LANES at a time, then the tail, each element as the scalar loop computes it."""
    n = y.shape[0]
    full = n - n % DOT_LANES
    axpy_f16_lanes(alpha, bits, full, y)
    for i in range(full, n):
        y[i] += alpha * f16_to_f32(bits[i])


# exp(x) rounds to 0 in float32 for every x below this (the smallest subnormal is 2^-149, e^-103.28);
# libm's expf takes a slow path to underflow (~2x the time per call), and a random-weights model's
# attention is one-hot: nearly every score underflows.
EXP_UNDERFLOWS_BELOW = np.float32(-104.0)


@_ordered
def _softmax_in_place(row, first, pos, best, sink):
    """row[first..pos] = exp(row - m), returning 1 / (their sum + exp(sink - m)), m = max(best, sink):
    the softmax with an attention sink (gpt-oss: a per-head logit that takes a share of the weights and
    gives no value, added after the sum as llama.cpp adds it); sink -inf for none (the same bits)."""
    if sink > best:
        best = sink
    total = np.float32(0.0)
    for j in range(first, pos + 1):
        x = row[j] - best
        e = np.float32(0.0) if x < EXP_UNDERFLOWS_BELOW else np.float32(math.exp(x))  # NaN goes to exp
        row[j] = e
        total += e
    if sink > -np.inf:
        total += np.float32(math.exp(sink - best))
    return np.float32(1.0) / total


@_ordered
def _capped(s, softcap):
    """softcap * tanh(s / softcap) when softcap > 0 (as llama.cpp: a scale, tanh, a scale), else s."""
    if softcap > 0:
        return softcap * np.float32(math.tanh(s * (np.float32(1.0) / softcap)))
    return s


@_ordered
def _block_span(b, block_size, first, pos):
    """The slots of cache block b (positions b*BS..) that positions first..pos cover: (first slot, end)."""
    return max(first - b * block_size, 0), min(pos - b * block_size + 1, block_size)


# The work of one (query row, head) is one function that both decode kernels call, the contiguous cache
# seen as a single block of a paged one, so the paged kernel equals the contiguous one by construction
# (the server's guarantee that a batched sequence gets the logits it gets alone; tests/model/test_paged.py).
# Heads that share a key head go four at a time through _attend4, which does per head exactly what
# _attend does (the same operations in the same order) while reading and widening each cached key and
# value once for the four: which heads are grouped never changes a result. Both walk the cache block by
# block (no division per position). _attend4 takes head sizes that are multiples of DOT_LANES only and
# has no tail loops (empty ones inside its loop over positions made it 2x slower); other sizes go
# through _attend.
@_ordered
def _attend(qv, cache_k, cache_v, table, kvh, first, pos, scale, softcap, sink, row, dst):
    """dst = softmax(cap(scale * K[first..pos] . qv)) @ V[first..pos] for one head, position j of the cache
    in block table[j // BS], slot j % BS (cache float16 bits [NB, BS, Hkv, D]); row: scores scratch.
    cap(s) = softcap * tanh(s / softcap) when softcap > 0 (Gemma 2's soft-capping), else s; sink: the
    head's attention sink (see _softmax_in_place), -inf for none."""
    block_size = cache_k.shape[1]
    best = -np.inf
    for b in range(first // block_size, pos // block_size + 1):
        keys, base = cache_k[table[b]], b * block_size
        lo, hi = _block_span(b, block_size, first, pos)
        for slot in range(lo, hi):
            s = _capped(_dot_f16(qv, keys[slot, kvh]) * scale, softcap)
            row[base + slot] = s
            if s > best:
                best = s
    inv = _softmax_in_place(row, first, pos, best, sink)
    dst[:] = 0.0
    for b in range(first // block_size, pos // block_size + 1):
        values, base = cache_v[table[b]], b * block_size
        lo, hi = _block_span(b, block_size, first, pos)
        for slot in range(lo, hi):
            _axpy_f16(row[base + slot] * inv, values[slot, kvh], dst)


# How many cached rows ahead _attend4 asks for: a job reads one key head's row (256 bytes for a 128-wide
# head) of every position, 2 KiB apart on Llama-3-8B's eight key heads, a stride the hardware prefetch did
# not follow: from memory the 8B-shaped file's attention at 1024 cached positions took twice its time
# with the cache warm.
PREFETCH_ROWS = 8


@_ordered
def _attend4(q, scores, out, h, cache_k, cache_v, table, kvh, first, pos, scale, softcap, sinks):
    """_attend for heads h..h+3 of one query row (q, out [Hq, D]; scores [Hq, n_keys]), which share key
    head kvh; the head size a multiple of DOT_LANES."""
    block_size = cache_k.shape[1]
    q0, q1, q2, q3 = q[h], q[h + 1], q[h + 2], q[h + 3]
    r0, r1, r2, r3 = scores[h], scores[h + 1], scores[h + 2], scores[h + 3]
    n = q.shape[1]
    row_bytes = 2 * n
    b0 = b1 = b2 = b3 = -np.inf
    for b in range(first // block_size, pos // block_size + 1):
        keys, base = cache_k[table[b]], b * block_size
        lo, hi = _block_span(b, block_size, first, pos)
        for slot in range(lo, hi):
            if slot + PREFETCH_ROWS < hi:
                prefetch_lines(keys[slot + PREFETCH_ROWS, kvh], row_bytes)
            s0, s1, s2, s3 = dot4_f32_f16_lanes(q0, q1, q2, q3, keys[slot, kvh], n)
            s0, s1, s2, s3 = s0 * scale, s1 * scale, s2 * scale, s3 * scale
            if softcap > 0:
                s0, s1, s2, s3 = _capped(s0, softcap), _capped(s1, softcap), _capped(s2, softcap), _capped(s3, softcap)
            j = base + slot
            r0[j], r1[j], r2[j], r3[j] = s0, s1, s2, s3
            if s0 > b0:
                b0 = s0
            if s1 > b1:
                b1 = s1
            if s2 > b2:
                b2 = s2
            if s3 > b3:
                b3 = s3
    i0 = _softmax_in_place(r0, first, pos, b0, sinks[h])
    i1 = _softmax_in_place(r1, first, pos, b1, sinks[h + 1])
    i2 = _softmax_in_place(r2, first, pos, b2, sinks[h + 2])
    i3 = _softmax_in_place(r3, first, pos, b3, sinks[h + 3])
    d0, d1, d2, d3 = out[h], out[h + 1], out[h + 2], out[h + 3]
    d0[:] = 0.0
    d1[:] = 0.0
    d2[:] = 0.0
    d3[:] = 0.0
    for b in range(first // block_size, pos // block_size + 1):
        values, base = cache_v[table[b]], b * block_size
        lo, hi = _block_span(b, block_size, first, pos)
        for slot in range(lo, hi):
            if slot + PREFETCH_ROWS < hi:
                prefetch_lines(values[slot + PREFETCH_ROWS, kvh], row_bytes)
            j = base + slot
            axpy4_f16_lanes(r0[j] * i0, r1[j] * i1, r2[j] * i2, r3[j] * i3, values[slot, kvh], n, d0, d1, d2, d3)


@_ordered
def _attend_heads(q, scores, out, h, n, cache_k, cache_v, table, kvh, first, pos, scale, softcap, sinks):
    """_attend for heads h..h+n-1 of one query row (sharing key head kvh): four at a time, then singly
    (all singly when the head size is not a multiple of DOT_LANES). sinks float32[Hq]: each head's
    attention sink, -inf for none."""
    end = h + n
    while h + 4 <= end and q.shape[1] % DOT_LANES == 0:
        _attend4(q, scores, out, h, cache_k, cache_v, table, kvh, first, pos, scale, softcap, sinks)
        h += 4
    while h < end:
        _attend(q[h], cache_k, cache_v, table, kvh, first, pos, scale, softcap, sinks[h], scores[h], out[h])
        h += 1


@cached_kernel(nogil=True)
def _first_key(pos, window):
    """The first position a query at `pos` sees (window 0: the whole context)."""
    if window > 0 and pos - window + 1 > 0:
        return pos - window + 1
    return 0


@cached_kernel(nogil=True)
def attention_jobs(n_rows, n_head, n_head_kv, heads_per_job):
    """How many jobs the decode attention kernels split into: per query row, per key head, runs of up to
    heads_per_job of its query heads (4 lets _attend4 share each cached row; 1 gives more, smaller jobs
    to spread over threads when there are few key heads)."""
    group = n_head // n_head_kv
    return n_rows * n_head_kv * ((group + heads_per_job - 1) // heads_per_job)


@cached_kernel(nogil=True, fastmath=False, error_model="numpy")
def _job_heads(job, n_head, n_head_kv, heads_per_job):
    """(row index, key head, first query head, number of heads) of attention job `job`."""
    group = n_head // n_head_kv
    runs = (group + heads_per_job - 1) // heads_per_job
    per_row = n_head_kv * runs
    t = job // per_row
    kvh = (job % per_row) // runs
    first_in_group = (job % runs) * heads_per_job
    return t, kvh, kvh * group + first_in_group, min(heads_per_job, group - first_in_group)


@cached_kernel(nogil=True, fastmath=False, error_model="numpy")
def _attention_job(q, blocks_k, blocks_v, one_block, start, scale, softcap, sinks, window, out, scores, heads_per_job, job):
    """Job `job` of `attention` (see _job_heads), over the contiguous cache seen as block 0 of a paged one."""
    n_head = q.shape[1]
    t, kvh, h, n = _job_heads(job, n_head, blocks_k.shape[2], heads_per_job)
    pos = start + t
    _attend_heads(q[t], scores[t * n_head : (t + 1) * n_head], out[t], h, n, blocks_k, blocks_v, one_block, kvh,
                  _first_key(pos, window), pos, scale, softcap, sinks)


@cached_kernel(nogil=True, parallel=True, fastmath=False, error_model="numpy")
def attention(q, cache_k, cache_v, start, scale, softcap, sinks, window, out, scores, heads_per_job):
    """q float32[T, Hq, D]; cache float16 bits uint16[n_ctx, Hkv, D]; out float32[T, Hq, D]; softcap:
    0, or the scores' soft cap (see _attend); sinks float32[Hq]: attention sinks, -inf for none;
    scores float32[T*Hq, n_keys] scratch with n_keys >= start+T; heads_per_job: see attention_jobs
    (the results do not depend on it)."""
    one_block = np.zeros(1, dtype=np.int32)  # the whole cache as block 0 of a paged one
    blocks_k = cache_k.reshape((1,) + cache_k.shape)
    blocks_v = cache_v.reshape((1,) + cache_v.shape)
    for job in prange(attention_jobs(q.shape[0], q.shape[1], cache_k.shape[1], heads_per_job)):
        _attention_job(q, blocks_k, blocks_v, one_block, start, scale, softcap, sinks, window, out, scores, heads_per_job, job)


@cached_kernel(nogil=True, fastmath=False, error_model="numpy")
def attention_serial(q, cache_k, cache_v, start, scale, softcap, sinks, window, out, scores, heads_per_job):
    """`attention` on the calling thread (see rms_norm_serial)."""
    one_block = np.zeros(1, dtype=np.int32)
    blocks_k = cache_k.reshape((1,) + cache_k.shape)
    blocks_v = cache_v.reshape((1,) + cache_v.shape)
    for job in range(attention_jobs(q.shape[0], q.shape[1], cache_k.shape[1], heads_per_job)):
        _attention_job(q, blocks_k, blocks_v, one_block, start, scale, softcap, sinks, window, out, scores, heads_per_job, job)


@_ordered
def attention_by_head(q, cache_k, cache_v, start, scale, softcap, sinks, window, out, scores):
    """`attention` on the calling thread, every query head through _attend alone: the same bits per
    head, and a third of the compile time of attention_serial (the cold start's basic tier, tiers.py)."""
    one_block = np.zeros(1, dtype=np.int32)
    blocks_k = cache_k.reshape((1,) + cache_k.shape)
    blocks_v = cache_v.reshape((1,) + cache_v.shape)
    n_head = q.shape[1]
    group = n_head // cache_k.shape[1]
    for t in range(q.shape[0]):
        pos = start + t
        first = _first_key(pos, window)
        for h in range(n_head):
            _attend(q[t, h], blocks_k, blocks_v, one_block, h // group, first, pos, scale, softcap, sinks[h],
                    scores[t * n_head + h], out[t, h])


@cached_kernel(nogil=True, parallel=True, fastmath=False, error_model="numpy")
def attention_paged(q, cache_k, cache_v, tables, row_seq, positions, rows, scale, softcap, sinks, window, out, scores,
                    heads_per_job):
    """The `attention` kernel over a paged cache, for the rows listed in `rows` only.

    q float32[T, Hq, D]; cache float16 bits uint16[NB, BS, Hkv, D]; tables int32[S, max_blocks];
    row_seq, positions int32[T]; rows int32[R] (indices into T); out float32[T, Hq, D];
    scores float32[R*Hq, n_keys] scratch, n_keys > max(positions). Per head it runs the contiguous
    kernel's functions (_attend_heads), so results are identical to it."""
    n_head = q.shape[1]
    for job in prange(attention_jobs(rows.shape[0], n_head, cache_k.shape[2], heads_per_job)):
        r, kvh, h, n = _job_heads(job, n_head, cache_k.shape[2], heads_per_job)
        t = rows[r]
        pos = positions[t]
        _attend_heads(q[t], scores[r * n_head : (r + 1) * n_head], out[t], h, n, cache_k, cache_v, tables[row_seq[t]],
                      kvh, _first_key(pos, window), pos, scale, softcap, sinks)
