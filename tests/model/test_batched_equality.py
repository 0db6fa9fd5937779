"""The server's guarantee, for every weight type: a sequence's logits in a batched step (decode rows of
other sequences beside it, several prompt chunks in one matrix product) equal, bit for bit, what the
single-sequence path (Decoder.forward on its own contiguous cache, chunk by chunk) gives it.

The weight type decides the path a product takes (backends/cpu/matmul.py): the multi-row integer kernels
(Q4_0/Q5_0/Q8_0 pairs, Q4_K/Q5_K/Q6_K rows, Q4_K/Q6_K tiles from TILE_MIN_ROWS rows, Q4_K re-laid 16 rows
at a time) at every length, or, for the others (floats, Q4_1, Q5_1, Q2_K, Q3_K, IQ4...), dequantized
tiles through BLAS from BLAS_MIN_ROWS rows of one chunk and the row kernels below. So the steps below mix
prompt chunks shorter than BLAS_MIN_ROWS whose sum is not (each must still take the row kernels, as it
would alone), chunks of BLAS_MIN_ROWS rows or more beside short ones, a prompt split in two chunks
(the second attending to the cached first), and decode rows. The Gemma tests (test_paged.py,
test_server.py) cover only Q4_K/Q5_0/Q6_K/Q8_0, which never take BLAS.

The same steps are checked at three levels: matmul_segments against matmul per segment, forward_batch
against Decoder.forward per sequence (steps written out below), and the server's Engine (its own step
composition and prompt chunking) against Model.generate alone, tokens and logprobs.

Tiny random llama models (tests/tiny_models.py), all matrices in the type under test.
"""

from __future__ import annotations

import numpy as np
import pytest

import localllm
from localllm import quant
from localllm.backends.cpu.matmul import BLAS_MIN_ROWS, TILE_MIN_ROWS, has_multirow_kernels
from localllm.model.kv_cache import KVCache
from localllm.model.kv_paged import DEFAULT_BLOCK_SIZE, LayoutBuilder, PagedKVCache, SequenceBlocks

from tiny_models import write_tiny_model

BS = DEFAULT_BLOCK_SIZE
CHUNK = 40  # the prompt chunk of these steps (the server's PREFILL_CHUNK, scaled to a tiny context)


def _prompt(seed: int, n: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [2] + [int(t) for t in rng.integers(4, 384, n - 1)]


PROMPTS = {"a": _prompt(1, 20), "b": _prompt(2, 18), "c": _prompt(3, 70), "d": _prompt(4, 6), "e": _prompt(5, 35)}

# Each step: (sequence, first position, number of rows) in row order, decode rows first (one row each,
# the sequence's next token). Positions past a prompt are decode tokens (DECODE_TOKENS).
STEPS = [
    [("d", 0, 6)],  # one short prompt alone
    [("d", 6, 1), ("a", 0, 20), ("b", 0, 18)],  # two short chunks, 38 rows together: each by the row kernels
    [("d", 7, 1), ("a", 20, 1), ("b", 18, 1), ("c", 0, CHUNK)],  # one BLAS-length chunk beside decode rows
    [("d", 8, 1), ("a", 21, 1), ("b", 19, 1), ("c", CHUNK, 30), ("e", 0, 35)],  # a prompt's second chunk + a long one
    [("a", 22, 1), ("b", 20, 1), ("c", 70, 1), ("d", 9, 1), ("e", 35, 1)],  # decode rows only
]
DECODE_TOKENS = [42, 7, 300, 199, 5]


def test_the_steps_cross_the_thresholds_they_are_meant_to():
    chunks = [[n for _, start, n in step if n > 1] for step in STEPS]
    assert all(n < BLAS_MIN_ROWS for n in chunks[1]) and sum(chunks[1]) >= BLAS_MIN_ROWS
    assert chunks[2] == [CHUNK] and CHUNK >= BLAS_MIN_ROWS
    assert min(chunks[3]) < BLAS_MIN_ROWS <= max(chunks[3])
    assert sum(chunks[1]) >= TILE_MIN_ROWS  # the tile kernels' batches
    assert len(PROMPTS["c"]) > CHUNK


def _tokens(name: str, start: int, n: int) -> list[int]:
    """The tokens of `name` at positions start..start+n-1: its prompt, then DECODE_TOKENS."""
    ids = PROMPTS[name] + DECODE_TOKENS
    return ids[start : start + n]


def _single_sequence_logits(dec, backend) -> dict:
    """(name, step) -> logits of the last row of that sequence's rows in that step, computed alone."""
    caches = {name: KVCache(backend, dec.hp, 128) for name in PROMPTS}
    out = {}
    for i, step in enumerate(STEPS):
        for name, start, n in step:
            ids = np.asarray(_tokens(name, start, n), np.int32)
            out[name, i] = dec.forward(ids, start, caches[name])[-1].copy()
    return out


def _batched_logits(dec, backend) -> dict:
    paged = PagedKVCache(backend, dec.hp, 64, BS)
    seqs = {}
    for name, prompt in PROMPTS.items():
        seq = seqs[name] = SequenceBlocks()
        need = -(-(len(prompt) + len(DECODE_TOKENS)) // BS)
        paged.pool.reserve(need)
        seq.reserved = need
    builder, out = LayoutBuilder(BS), {}
    for i, step in enumerate(STEPS):
        entries = []
        for name, start, n in step:
            seqs[name].ensure(paged.pool, start + n)
            entries.append((seqs[name], _tokens(name, start, n), start))
        n_rowwise = sum(1 for name, start, n in step if start >= len(PROMPTS[name]))
        layout = builder.build(entries, n_rowwise=n_rowwise)
        logit_rows = (layout.seq_first + layout.seq_rows - 1).astype(np.int32)
        logits = dec.forward_batch(paged, layout, logit_rows)
        for row, (name, _, _) in enumerate(step):
            out[name, i] = logits[row].copy()
    return out


# Q4_K twice: re-laid 16 rows at a time (PackedWeights) and in the file's layout (row and tile kernels).
CASES = [(name, True) for name in quant.supported_names()] + [("Q4_K", False)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(qtype, repack) -> a loaded tiny llama model with its matrices in qtype, made once per module."""
    root, models = tmp_path_factory.mktemp("batched"), {}

    def make(qtype, repack):
        if (qtype, repack) not in models:
            path = root / f"llama-{qtype}.gguf"
            if not path.exists():
                write_tiny_model(path, "llama", qtype, seed=3)
            model = localllm.load(path, n_ctx=128, threads=2)
            model.backend.repack = repack  # read at each weight's first product
            models[qtype, repack] = model
        return models[qtype, repack]

    return make


IDS = [f"{q}{'' if r else '-file-layout'}" for q, r in CASES]


@pytest.mark.parametrize("qtype,repack", CASES, ids=IDS)
def test_batched_steps_give_each_sequence_its_single_sequence_logits(tiny, qtype, repack):
    model = tiny(qtype, repack)
    expected = _single_sequence_logits(model.decoder, model.backend)
    got = _batched_logits(model.decoder, model.backend)
    assert got.keys() == expected.keys()
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=f"{qtype}: sequence {key[0]}, step {key[1]}")


@pytest.mark.parametrize("qtype,repack", CASES, ids=IDS)
def test_matmul_segments_gives_each_segment_what_matmul_gives_it_alone(tiny, qtype, repack):
    """Segments of 12, 6, 35 and 10 rows in one call: the BLAS-length one through the dequantized tiles
    (types without multi-row kernels), the short ones around it through the row kernels (the first two
    together: a batch for the tile kernels)."""
    model, rng = tiny(qtype, repack), np.random.default_rng(7)
    bounds = (0, 12, 18, 53, 63)
    assert bounds[1] < TILE_MIN_ROWS <= bounds[2] and bounds[3] - bounds[2] >= BLAS_MIN_ROWS > bounds[4] - bounds[3]
    for suffix in ("attn_q", "attn_k", "ffn_up", "ffn_down"):
        w = model.decoder.w[f"blk.0.{suffix}.weight"]
        x = rng.standard_normal((bounds[-1], w.n_in)).astype(np.float32)
        expected = np.zeros((bounds[-1], w.n_out), np.float32)
        for a, b in zip(bounds[:-1], bounds[1:]):
            model.backend.matmul(w, x[a:b], expected[a:b])
        out = np.zeros_like(expected)
        model.backend.matmul_segments(w, x, out, bounds)
        np.testing.assert_array_equal(out, expected, err_msg=f"{qtype} {suffix}")


def test_the_cases_cover_both_paths_and_the_re_laid_layout():
    multirow = {name for name, _ in CASES if has_multirow_kernels(quant.get(name))}
    assert {"Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "Q4_K", "Q6_K"} <= multirow
    assert {"F16", "BF16", "F32", "Q5_1", "Q4_1", "Q2_K", "Q3_K", "IQ4_XS"} <= {name for name, _ in CASES} - multirow
    assert ("Q4_K", True) in CASES and ("Q4_K", False) in CASES


@pytest.mark.parametrize("qtype,repack", CASES, ids=IDS)
def test_matmul_rows_gives_each_row_what_a_one_row_matmul_gives_it(tiny, qtype, repack):
    """Decode rows (matmul_rows): 5 rows (row kernels) and 20 (tile kernels, from TILE_MIN_ROWS)."""
    model, rng = tiny(qtype, repack), np.random.default_rng(8)
    assert 5 < TILE_MIN_ROWS <= 20 < BLAS_MIN_ROWS
    for n_rows in (5, 20):
        for name in ("blk.1.attn_v.weight", "blk.1.ffn_down.weight", "output.weight"):
            w = model.decoder.w[name]
            x = rng.standard_normal((n_rows, w.n_in)).astype(np.float32)
            expected = np.zeros((n_rows, w.n_out), np.float32)
            for t in range(n_rows):
                model.backend.matmul(w, x[t : t + 1], expected[t : t + 1])
            out = np.zeros_like(expected)
            model.backend.matmul_rows(w, x, out)
            np.testing.assert_array_equal(out, expected, err_msg=f"{qtype} {name} {n_rows} rows")


# -- the engine: its own step composition and prompt chunking ---------------------------------------------------

ENGINE_PROMPTS = [PROMPTS["a"], PROMPTS["b"], PROMPTS["c"], PROMPTS["e"]]


def _engine_events(model, prompts, max_tokens: int) -> list[list]:
    """Each prompt's token events from one Engine running them all (queued before it starts, so the
    first step admits them together), greedy, with the three best logprobs of every token."""
    import asyncio

    from localllm.sampling import SamplingConfig
    from localllm.engine.batching import Engine, GenerationRequest

    engine = Engine(model, parallel=len(prompts), cache_mb=4, prefill_chunk=CHUNK)
    loop = asyncio.new_event_loop()
    try:
        handles = [engine.submit(GenerationRequest(list(p), SamplingConfig(temperature=0.0), max_tokens=max_tokens,
                                                   top_logprobs=3), loop) for p in prompts]

        async def collect(handle):
            return [e async for e in handle.events() if e.kind == "token"]

        async def all_events():
            return await asyncio.gather(*(collect(h) for h in handles))

        engine.start()
        try:
            return loop.run_until_complete(asyncio.wait_for(all_events(), 120))
        finally:
            engine.stop()
    finally:
        loop.close()


@pytest.mark.parametrize("qtype,repack", CASES, ids=IDS)
def test_the_engine_gives_each_request_what_generate_gives_it_alone(tiny, qtype, repack, monkeypatch):
    """Four prompts queued together: the engine's first step runs two short prompts (20 + 18 rows, each
    under BLAS_MIN_ROWS, together over it), then the 70-token prompt in chunks of CHUNK beside decode
    rows, then the 35-token one. Each request's tokens and logprobs equal Model.generate's alone, with the
    same prompt chunking (PREFILL_CHUNK = CHUNK)."""
    import localllm.generate

    model = tiny(qtype, repack)
    monkeypatch.setattr(localllm.generate, "PREFILL_CHUNK", CHUNK)
    steps, forward_batch = [], model.decoder.forward_batch

    def recording(cache, layout, logit_rows):  # the prompt rows of each sequence in each step
        steps.append([int(n) for n in layout.seq_rows[layout.n_rowwise :]])
        return forward_batch(cache, layout, logit_rows)

    monkeypatch.setattr(model.decoder, "forward_batch", recording)
    got = _engine_events(model, ENGINE_PROMPTS, max_tokens=4)
    assert steps[:4] == [[20, 18], [CHUNK], [30], [35]]  # the steps the docstring describes
    for prompt, events in zip(ENGINE_PROMPTS, got):
        alone = [e for e in model.generate(list(prompt), max_tokens=4, temperature=0.0, top_logprobs=3,
                                           session=model.new_session()) if e.kind == "token"]
        assert [(e.token, e.logprob, e.top_logprobs) for e in events] == [
            (e.token, e.logprob, e.top_logprobs) for e in alone], qtype
        assert len(events) >= 1
