"""The paged KV cache: block pool bookkeeping, and the paged ops against the contiguous-cache ops.

Expected values come from the single-sequence path (kv_store + attention on a contiguous cache,
T=1 matmuls, Decoder.forward), which tests/model/test_gemma_reference.py checks against llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest

from localllm.backends.cpu import CPUBackend
from localllm.model.kv_cache import KVCache
from localllm.model.kv_paged import (
    BlockPool,
    CacheFull,
    LayoutBuilder,
    PagedKVCache,
    SequenceBlocks,
    prefix_keys,
)

from tiny_models import TINY_ARCHS, write_tiny_model

BS = 4


def _attach(pool, tokens, reserve=0):
    seq = SequenceBlocks()
    covered = seq.attach_prefix(pool, tokens, len(tokens))
    pool.reserve(reserve)
    seq.reserved = reserve
    return seq, covered


# -- block pool -----------------------------------------------------------------------------------------------

def test_identical_prefixes_share_blocks_by_reference_count():
    pool = BlockPool(8, BS)
    tokens = list(range(10))  # two full blocks and a partial one
    a, covered = _attach(pool, tokens, reserve=3)
    assert covered == 0
    a.ensure(pool, 10)
    a.publish(pool, tokens, 10)
    assert a.n_registered == 2  # the partial third block is not published
    b, covered = _attach(pool, tokens[:9] + [99])
    assert covered == 8 and b.table == a.table[:2]
    assert [pool.refcount(x) for x in a.table] == [2, 2, 1]
    c, covered = _attach(pool, [0, 1, 2, 3, 7, 7, 7, 7])  # shares the first block only
    assert covered == 4 and c.table == a.table[:1]
    assert pool.stats.hit_blocks == 3


def test_a_block_key_names_the_whole_prefix():
    # the same 4 tokens after different first blocks are different blocks
    k1 = prefix_keys([0, 0, 0, 0, 5, 6, 7, 8], BS, 2)
    k2 = prefix_keys([1, 0, 0, 0, 5, 6, 7, 8], BS, 2)
    assert k1[1] != k2[1]
    assert prefix_keys([0, 0, 0, 0, 5, 6, 7, 8, 9], BS, 2) == k1


def test_released_blocks_stay_cached_and_the_oldest_is_evicted_first():
    pool = BlockPool(3, BS)
    first, second = [1, 2, 3, 4], [5, 6, 7, 8]
    for tokens in (first, second):
        seq, _ = _attach(pool, tokens, reserve=1)
        seq.ensure(pool, 4)
        seq.publish(pool, tokens, 4)
        seq.free(pool)
    assert pool.n_cached == 2 and pool.n_used == 0 and pool.available == 3
    # Needs all three blocks: takes the free one, then evicts `first` (released first), then `second`.
    seq, _ = _attach(pool, [9] * 8, reserve=2)
    seq.ensure(pool, 8)
    assert pool.stats.evictions == 1
    assert not pool.is_cached(prefix_keys(first, BS, 1)[0]) and pool.is_cached(prefix_keys(second, BS, 1)[0])
    # A cached block found again leaves the LRU (it cannot be evicted while referenced).
    again, covered = _attach(pool, second + [0])
    assert covered == 4 and pool.n_cached == 0 and pool.available == 0


def test_a_full_pool_refuses_reservations_until_blocks_come_back():
    pool = BlockPool(4, BS)
    a = SequenceBlocks()
    pool.reserve(3)
    a.reserved = 3
    with pytest.raises(CacheFull):
        pool.reserve(2)
    a.ensure(pool, 12)
    assert pool.available == 1 and pool.n_used == 3
    with pytest.raises(CacheFull):
        a.ensure(pool, 13)  # beyond its own reservation
    a.free(pool)  # never published: back to the free list
    assert pool.available == 4 and pool.n_cached == 0
    pool.reserve(4)


# -- paged ops against contiguous ops ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ops():
    return CPUBackend(threads=2)


class _Seq:
    def __init__(self, table):
        self.table = table
        self.state_slot = -1  # no recurrent layers


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("n_new", [1, 3, 40])  # decode row, short chunk (Numba kernel), >= BLAS_MIN_ROWS (BLAS)
def test_paged_store_and_attention_equal_the_contiguous_ops(ops, window, n_new):
    rng = np.random.default_rng(n_new + window)
    n_heads, n_kv, dim, n_past = 4, 2, 8, 9
    n_total = n_past + n_new
    k = rng.standard_normal((n_total, n_kv, dim)).astype(np.float32)
    v = rng.standard_normal((n_total, n_kv, dim)).astype(np.float32)
    q = rng.standard_normal((n_new, n_heads, dim)).astype(np.float32)
    # contiguous: the past, then the new rows
    ck, cv = np.zeros((64, n_kv, dim), np.float16), np.zeros((64, n_kv, dim), np.float16)
    ops.kv_store(ck, cv, k[:n_past], v[:n_past], 0)
    ops.kv_store(ck, cv, k[n_past:], v[n_past:], n_past)
    expected = np.zeros_like(q)
    ops.attention(q, ck, cv, n_past, 0.3, window, expected)
    # paged: a scrambled block table, and a second sequence in the same step (one decode row)
    pk, pv = np.zeros((16, BS, n_kv, dim), np.float16), np.zeros((16, BS, n_kv, dim), np.float16)
    table = [7, 2, 10, 0, 5, 15, 1, 12, 6, 9, 11, 13, 14][: -(-n_total // BS)]
    other = _Seq([3, 4, 8])
    me = _Seq(table)
    past = LayoutBuilder(BS).build([(me, list(range(n_past)), 0)], n_rowwise=0)
    ops.kv_store_paged(pk, pv, k[:n_past], v[:n_past], past.slots)
    other_q = rng.standard_normal((1, n_heads, dim)).astype(np.float32)
    layout = LayoutBuilder(BS).build([(other, [0], 6), (me, list(range(n_new)), n_past)], n_rowwise=1)
    k_step = np.concatenate([rng.standard_normal((1, n_kv, dim)).astype(np.float32), k[n_past:]])
    v_step = np.concatenate([rng.standard_normal((1, n_kv, dim)).astype(np.float32), v[n_past:]])
    ops.kv_store_paged(pk, pv, k_step, v_step, layout.slots)
    out = np.zeros((1 + n_new, n_heads, dim), np.float32)
    ops.attention_paged(np.concatenate([other_q, q]), pk, pv, layout, 0.3, window, out)
    np.testing.assert_array_equal(out[1:], expected)
    # the stored rows are where the table says
    flat = pk.reshape(-1, n_kv, dim)
    for p in range(n_total):
        np.testing.assert_array_equal(flat[table[p // BS] * BS + p % BS], ck[p])


# -- the real model: row-wise matmul and the batched forward ---------------------------------------------------------

@pytest.fixture(scope="module")
def gemma(gemma_path):
    import localllm

    return localllm.load(gemma_path, n_ctx=256, threads=2)


def test_matmul_rows_equals_one_row_matmuls_for_every_weight_type(gemma):
    ops, rng = gemma.backend, np.random.default_rng(0)
    names = {}
    for suffix in ("attn_q", "attn_v", "attn_output", "ffn_down", "ffn_up"):
        w = gemma.decoder.w[f"blk.0.{suffix}.weight"]
        names.setdefault(w.qtype, w.name)
    assert {"Q4_K", "Q5_0", "Q6_K", "Q8_0"} <= set(names)
    for qtype, name in names.items():
        w = gemma.decoder.w[name]
        x = rng.standard_normal((5, w.n_in)).astype(np.float32)
        expected = np.zeros((5, w.n_out), np.float32)
        for t in range(5):
            ops.matmul(w, x[t : t + 1], expected[t : t + 1])
        out = np.zeros_like(expected)
        ops.matmul_rows(w, x, out)
        np.testing.assert_array_equal(out, expected, err_msg=qtype)


def test_batched_forward_gives_each_sequence_its_single_sequence_logits(gemma):
    dec = gemma.decoder
    # Gemma's weight types all have multi-row integer kernels: no product here goes through BLAS
    # (every type, and chunks past BLAS_MIN_ROWS: tests/model/test_batched_equality.py)
    a = gemma.tokenize("The quick brown fox jumps over the lazy dog and keeps running")
    b = gemma.tokenize("Hello there")
    # single-sequence references: prefill, then one decode step each
    refs = {}
    for name, ids in (("a", a), ("b", b)):
        cache = KVCache(gemma.backend, dec.hp, 64)
        prefill = dec.forward(np.asarray(ids, np.int32), 0, cache).copy()
        step = dec.forward(np.asarray([42], np.int32), len(ids), cache).copy()
        refs[name] = (prefill[-1], step[0])
    paged = PagedKVCache(gemma.backend, dec.hp, 16, BS)
    sa, sb = SequenceBlocks(), SequenceBlocks()
    for seq, ids in ((sa, a), (sb, b)):
        paged.pool.reserve(6)
        seq.reserved = 6
        seq.ensure(paged.pool, len(ids) + 1)
    builder = LayoutBuilder(BS)
    # step 1: b's prompt alone; step 2: b decodes while a prefills; step 3: a decodes
    lay = builder.build([(sb, b, 0)], n_rowwise=0)
    l1 = dec.forward_batch(paged, lay, np.array([len(b) - 1], np.int32)).copy()
    lay = builder.build([(sb, [42], len(b)), (sa, a, 0)], n_rowwise=1)
    l2 = dec.forward_batch(paged, lay, np.array([0, len(a)], np.int32)).copy()
    lay = builder.build([(sa, [42], len(a))], n_rowwise=1)
    l3 = dec.forward_batch(paged, lay, np.array([0], np.int32)).copy()
    np.testing.assert_array_equal(l1[0], refs["b"][0])
    np.testing.assert_array_equal(l2[0], refs["b"][1])
    np.testing.assert_array_equal(l2[1], refs["a"][0])
    np.testing.assert_array_equal(l3[0], refs["a"][1])


def test_matmul_segments_equals_each_segment_alone(gemma):
    """Several prompt chunks in one call give each chunk exactly what matmul gives it alone: chunks of 12,
    3 and 9 rows, all through the integer kernels (Gemma's types have multi-row kernels; chunks through
    BLAS, beside short ones, for every type: tests/model/test_batched_equality.py)."""
    ops, rng = gemma.backend, np.random.default_rng(1)
    bounds = (0, 12, 15, 24)
    for suffix in ("attn_q", "attn_output", "ffn_down", "ffn_up"):
        w = gemma.decoder.w[f"blk.0.{suffix}.weight"]
        x = rng.standard_normal((bounds[-1], w.n_in)).astype(np.float32)
        expected = np.zeros((bounds[-1], w.n_out), np.float32)
        for a, b in zip(bounds[:-1], bounds[1:]):
            ops.matmul(w, x[a:b], expected[a:b])
        out = np.zeros_like(expected)
        ops.matmul_segments(w, x, out, bounds)
        np.testing.assert_array_equal(out, expected, err_msg=w.qtype)


def test_a_step_with_several_prompt_chunks_gives_each_its_single_sequence_logits(gemma):
    dec = gemma.decoder
    prompts = {
        "a": gemma.tokenize("The quick brown fox jumps over the lazy dog and keeps running"),
        "b": gemma.tokenize("Hello there"),
        "c": gemma.tokenize("A longer second prompt, also through BLAS, about rivers and seas"),
        "d": gemma.tokenize("Decode"),
    }
    refs = {}
    for name, ids in prompts.items():
        cache = KVCache(gemma.backend, dec.hp, 64)
        refs[name] = dec.forward(np.asarray(ids, np.int32), 0, cache).copy()[-1]
        refs[name + "+"] = dec.forward(np.asarray([42], np.int32), len(ids), cache).copy()[0]
    paged = PagedKVCache(gemma.backend, dec.hp, 32, BS)
    seqs = {name: SequenceBlocks() for name in prompts}
    for name, seq in seqs.items():
        paged.pool.reserve(6)
        seq.reserved = 6
        seq.ensure(paged.pool, len(prompts[name]) + 1)
    builder = LayoutBuilder(BS)
    d = prompts["d"]
    lay = builder.build([(seqs["d"], d, 0)], n_rowwise=0)
    dec.forward_batch(paged, lay, np.array([len(d) - 1], np.int32))
    # d decodes while a, b and c read their whole prompts in the same step
    entries = [(seqs["d"], [42], len(d))] + [(seqs[n], prompts[n], 0) for n in "abc"]
    lay = builder.build(entries, n_rowwise=1)
    ends = np.cumsum([1] + [len(prompts[n]) for n in "abc"]) - 1
    logits = dec.forward_batch(paged, lay, ends.astype(np.int32)).copy()
    np.testing.assert_array_equal(logits[0], refs["d+"])
    for row, name in zip(logits[1:], "abc"):
        np.testing.assert_array_equal(row, refs[name], err_msg=name)


def test_paged_store_rounds_to_float16_as_numpy_does():
    from localllm.backends.cpu import kernels

    rng = np.random.default_rng(3)
    src = (rng.standard_normal((5, 2, 64)) * np.logspace(-9, 5, 64, dtype=np.float32)).astype(np.float32)
    src[0, 0, :8] = [np.inf, -np.inf, np.nan, 65519.0, 65520.0, 6e-8, 2.9e-8, -0.0]  # overflow, subnormal, ties
    dst = np.zeros((16, 2, 64), np.float16)
    slots = np.array([7, 0, 15, 3, 9], np.int32)
    kernels.store_f16_rows(src, dst.view(np.uint16), slots)
    want = np.zeros_like(dst)
    with np.errstate(over="ignore"):  # 65520 rounds to inf, as intended
        want[slots] = src
    np.testing.assert_array_equal(dst.view(np.uint16)[~np.isnan(want)], want.view(np.uint16)[~np.isnan(want)])
    assert np.isnan(dst[7, 0, 2])


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_every_architecture_batched_step_gives_single_sequence_logits(tmp_path, arch):
    """A step where one sequence decodes at position 13 while another reads a 20-token prompt gives each
    exactly the logits it gets alone, on every architecture (soft-capped attention on the paged cache,
    Mistral 3's temperature over rows of several spans, LongRoPE, windows)."""
    import localllm

    model = localllm.load(write_tiny_model(tmp_path / f"{arch}.gguf", arch, "Q8_0", seed=2), n_ctx=64, threads=2)
    dec = model.decoder
    first, second = [2, *range(300, 312)], [2, *range(320, 339)]  # 13 and 20 tokens
    refs = {}
    for name, ids in (("first", first), ("second", second)):
        cache = KVCache(model.backend, dec.hp, 64, dec.kv_layout())
        refs[name] = dec.forward(np.asarray(ids, np.int32), 0, cache).copy()[-1]
        refs[name + "+"] = dec.forward(np.asarray([42], np.int32), len(ids), cache).copy()[0]
    paged = PagedKVCache(model.backend, dec.hp, 16, BS, dec.kv_layout(), state_slots=2)
    seqs = {"first": SequenceBlocks(), "second": SequenceBlocks()}
    for name, ids in (("first", first), ("second", second)):
        paged.pool.reserve(6)
        seqs[name].reserved = 6
        if paged.states is not None:  # recurrent layers (the hybrid): a state slot per sequence
            seqs[name].state_slot = paged.states.take()
        seqs[name].ensure(paged.pool, len(ids) + 1)
    builder = LayoutBuilder(BS)
    lay = builder.build([(seqs["first"], first, 0)], n_rowwise=0)
    np.testing.assert_array_equal(dec.forward_batch(paged, lay, np.array([len(first) - 1], np.int32))[0], refs["first"])
    lay = builder.build([(seqs["first"], [42], len(first)), (seqs["second"], second, 0)], n_rowwise=1)
    logits = dec.forward_batch(paged, lay, np.array([0, len(second)], np.int32))
    np.testing.assert_array_equal(logits[0], refs["first+"])
    np.testing.assert_array_equal(logits[1], refs["second"])
