"""Speculative decoding in the batching engine (Engine(speculation=...)): each decoding sequence runs its
last token and its drafts as rows computed as one-token steps compute them, so every request still gets,
token for token and logprob for logprob, what Model.generate gives it alone without speculation.

Random tiny models rarely repeat their prompt, so most tests draft with an oracle in PromptLookup's place:
it proposes the request's true continuation (from Model.generate alone), whole on some steps, wrong from
its middle or from its first token on others, so that steps keep whole drafts, keep part of them (a
recurrent model's rollback) and refuse them. The real prompt lookup is checked on a tiny model whose
greedy output falls into a cycle, and on Gemma 3 270M through the HTTP server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import localllm
import localllm.engine.batching as batching
from localllm.engine.batching import Engine, GenerationRequest
from localllm.model.decoder import MAX_VERIFY_ROWS
from localllm.sampling import SamplingConfig
from localllm.speculative import Speculation

from tiny_models import write_tiny_model

MAX_TOKENS = 24


def _prompt(seed: int, n: int) -> list[int]:
    """A prompt of n tokens that repeats a short motif (as text to be edited or code to be copied does)."""
    motif = [int(t) for t in np.random.default_rng(seed).integers(4, 300, 3 + seed % 3)]
    return ([2] + motif * n)[:n]


PROMPTS = [_prompt(1, 9), _prompt(2, 14), _prompt(3, 30), _prompt(4, 40)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    models = {}

    def load(arch: str):
        if arch not in models:
            path = write_tiny_model(tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch, "Q4_K", seed=4)
            models[arch] = localllm.load(path, n_ctx=256, threads=2)
        return models[arch]

    return load


def alone(model, prompt, max_tokens=MAX_TOKENS, **sampling) -> list:
    """(token, logprob, top_logprobs) of each token Model.generate gives the prompt alone, no speculation."""
    sampling = {"temperature": 0.0, **sampling}
    events = model.generate(list(prompt), max_tokens=max_tokens, top_logprobs=2, session=model.new_session(), **sampling)
    return [(e.token, e.logprob, e.top_logprobs) for e in events if e.kind == "token" and e.token is not None]


def engine_events(engine, requests, timeout=120) -> list:
    """Every request queued before the engine starts, then run: each request's events."""
    loop = asyncio.new_event_loop()
    try:
        handles = [engine.submit(request, loop) for request in requests]

        async def collect(handle):
            return [e async for e in handle.events()]

        async def all_events():
            return await asyncio.gather(*(collect(h) for h in handles))

        engine.start()
        try:
            return loop.run_until_complete(asyncio.wait_for(all_events(), timeout))
        finally:
            engine.stop()
    finally:
        loop.close()


def run_engine(model, prompts, speculation, sampling=None, max_tokens=MAX_TOKENS):
    """Every prompt queued before the engine starts (its first step admits them together): the token
    triples and the final Timings of each, and the engine."""
    engine = Engine(model, parallel=len(prompts), cache_mb=4, speculation=speculation)
    sampling = sampling or SamplingConfig(temperature=0.0)
    results = engine_events(engine, [GenerationRequest(list(p), sampling, max_tokens=max_tokens, top_logprobs=2)
                                     for p in prompts])
    assert all(events[-1].kind == "done" for events in results), [events[-1].text for events in results]
    tokens = [[(e.token, e.logprob, e.top_logprobs) for e in events if e.kind == "token" and e.token is not None]
              for events in results]
    return tokens, [events[-1].timings for events in results], engine


class Oracle:
    """PromptLookup's place: proposes each request's true continuation (`expected`: prompt -> tokens),
    changed on two steps out of three: from the middle of the draft (part kept) or from its first token
    (all refused)."""

    def __init__(self, expected: dict):
        self.expected = expected
        self.calls = 0

    def propose(self, history: list, k: int):
        prompt = next(p for p in self.expected if tuple(history[: len(p)]) == p)
        drafts = list(self.expected[prompt][len(history) - len(prompt) :][:k])
        self.calls += 1
        if drafts and self.calls % 3:
            wrong = len(drafts) // 2 if self.calls % 3 == 1 else 0
            drafts[wrong] = (drafts[wrong] + 1) % 384
        return drafts, None


def oracle_lookup(monkeypatch, expected: dict) -> None:
    monkeypatch.setattr(batching, "PromptLookup", lambda n_min, n_max: Oracle(expected))


def recording(monkeypatch, model) -> list:
    """Every step's (layout, logit_rows), copied, as forward_batch receives them."""
    steps, forward_batch = [], model.decoder.forward_batch

    def record(cache, layout, logit_rows):
        steps.append(({name: np.array(getattr(layout, name)) for name in ("seq_first", "seq_rows", "seq_start")}
                      | {"n_rowwise": layout.n_rowwise}, np.array(logit_rows)))
        return forward_batch(cache, layout, logit_rows)

    monkeypatch.setattr(model.decoder, "forward_batch", record)
    return steps


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_drafts_kept_in_part_or_refused_change_nothing(tiny, arch, monkeypatch):
    """Four greedy requests, drafts kept whole, in part and refused: each request's tokens and logprobs
    are Model.generate's alone; on the hybrid, a draft kept in part restores the sequence's recurrent
    slot and its kept rows run again in the next step."""
    model = tiny(arch)
    expected = {tuple(p): [t for t, _, _ in alone(model, p)] for p in PROMPTS}
    oracle_lookup(monkeypatch, expected)
    steps = recording(monkeypatch, model)
    got, timings, engine = run_engine(model, PROMPTS, Speculation(max_draft=6))
    for prompt, tokens in zip(PROMPTS, got):
        assert tokens == alone(model, prompt)
    assert all(t.draft_tokens > t.draft_accepted > 0 for t in timings), [(t.draft_tokens, t.draft_accepted) for t in timings]
    assert engine.stats.draft_tokens == sum(t.draft_tokens for t in timings)
    assert engine.stats.steps < max(len(t) for t in got)  # kept drafts saved steps: fewer than one per token
    if arch == "qwen35":  # some step ran more rows for a sequence than it took logits for: a rollback's rows
        assert any(_rows_without_logits(layout, rows) for layout, rows in steps)
    else:
        assert not any(_rows_without_logits(layout, rows) for layout, rows in steps)


def _rows_without_logits(layout, logit_rows) -> bool:
    """Whether a decoding sequence (in the row-wise rows) ran a row before its first logits row."""
    firsts = layout["seq_first"][layout["seq_first"] < layout["n_rowwise"]]
    return any(f not in logit_rows for f in firsts)


def test_each_decoding_sequence_runs_all_its_rows_row_wise_with_logits_for_its_token_and_drafts(tiny, monkeypatch):
    """The layout of every step: decoding sequences first, their rows (token + drafts) all in the
    row-wise region, none over MAX_VERIFY_ROWS, logits asked for the token's row and every draft's; and
    their attention never goes through the BLAS path (a prompt chunk's)."""
    model = tiny("llama")
    expected = {tuple(p): [t for t, _, _ in alone(model, p)] for p in PROMPTS}
    oracle_lookup(monkeypatch, expected)
    steps = recording(monkeypatch, model)
    blas = []
    paged_blas = model.backend._paged_blas
    monkeypatch.setattr(model.backend, "_paged_blas", lambda q, ck, cv, layout, s, *a: (
        blas.append((layout.n_rowwise, int(layout.seq_first[s]))), paged_blas(q, ck, cv, layout, s, *a))[1])
    run_engine(model, PROMPTS, Speculation(max_draft=6))
    multi = 0
    for layout, logit_rows in steps:
        decoding = layout["seq_first"] < layout["n_rowwise"]
        ends = layout["seq_first"][decoding] + layout["seq_rows"][decoding]
        assert ends.max(initial=0) == layout["n_rowwise"]  # the decode rows are exactly the row-wise ones
        assert layout["seq_rows"][decoding].max(initial=0) <= MAX_VERIFY_ROWS
        wanted = [r for f, n in zip(layout["seq_first"][decoding], layout["seq_rows"][decoding]) for r in range(f, f + n)]
        assert list(logit_rows[: len(wanted)]) == wanted  # no rollback on an attention model: every row
        multi += int((layout["seq_rows"][decoding] > 1).sum())
    assert multi > 10  # many steps verified drafts
    assert all(first >= n_rowwise for n_rowwise, first in blas)  # only prompt chunks took BLAS


def test_prompt_lookup_drafts_from_the_context_and_changes_nothing(tiny):
    """The real prompt lookup on the tiny llama (whose greedy output falls into a cycle that the lookup
    then copies): drafts happen and are kept, and every request gets Model.generate's tokens alone."""
    model = tiny("llama")
    prompts = [_prompt(5, 12), _prompt(6, 20), [2, 17, 99, 250, 3, 8]]
    got, timings, engine = run_engine(model, prompts, Speculation(max_draft=8), max_tokens=40)
    for prompt, tokens in zip(prompts, got):
        assert tokens == alone(model, prompt, max_tokens=40)
    assert engine.stats.draft_accepted > 0 and engine.stats.draft_tokens >= engine.stats.draft_accepted
    assert sum(t.draft_accepted for t in timings) == engine.stats.draft_accepted


def test_without_speculation_nothing_is_drafted(tiny, monkeypatch):
    model = tiny("llama")
    oracle_lookup(monkeypatch, {tuple(p): [] for p in PROMPTS})
    for speculation in (None, Speculation(lookup=False)):
        got, timings, engine = run_engine(model, PROMPTS[:2], speculation)
        assert engine.speculation is None and engine.stats.draft_tokens == 0
        assert all(t.draft_tokens == 0 for t in timings)
        assert got == [alone(model, p) for p in PROMPTS[:2]]


def test_sampling_keeps_the_draft_by_the_acceptance_rule(tiny, monkeypatch):
    """At temperature 1 with top_k 1 the acceptance rule keeps a draft exactly when it is the only
    candidate: the answer is the greedy one, through Sampler.verify's sampling branch."""
    model = tiny("qwen35")
    expected = {tuple(p): [t for t, _, _ in alone(model, p)] for p in PROMPTS}
    oracle_lookup(monkeypatch, expected)
    sampling = SamplingConfig(temperature=1.0, top_k=1, seed=7)
    got, timings, _ = run_engine(model, PROMPTS, Speculation(max_draft=4), sampling=sampling)
    assert [[t for t, _, _ in tokens] for tokens in got] == [expected[tuple(p)] for p in PROMPTS]
    assert all(t.draft_tokens > t.draft_accepted > 0 for t in timings)


def test_a_draft_model_drafts_for_every_sequence_and_changes_nothing(tiny, tmp_path):
    """Four greedy requests, each with its own session of a draft model (another architecture over the
    same vocabulary, drafting whatever it costs): Model.generate's tokens and logprobs alone."""
    model = tiny("llama")
    draft = localllm.load(write_tiny_model(tmp_path / "draft.gguf", "gemma3", "Q4_K", seed=9), n_ctx=256, threads=2)
    spec = Speculation(lookup=False, draft=draft, max_draft=3, token_cost=0.0, draft_p_min=0.0)
    got, timings, _ = run_engine(model, PROMPTS, spec)
    assert got == [alone(model, p) for p in PROMPTS]
    assert all(t.draft_tokens > 0 for t in timings)
    assert sum(t.draft_accepted for t in timings) < sum(t.draft_tokens for t in timings)  # refusals too


def test_a_draft_model_with_another_vocabulary_is_refused_when_the_engine_is_made(tiny, gemma_path):
    from localllm.speculative import IncompatibleDraft

    gemma = localllm.load(gemma_path, n_ctx=64)
    with pytest.raises(IncompatibleDraft, match="cannot draft for this model"):
        Engine(tiny("llama"), speculation=Speculation(lookup=False, draft=gemma))


def test_sampled_requests_keep_the_models_distribution_with_drafts(tmp_path):
    """1,500 sampled requests (three tokens each, top-k 3, temperature 1, a logit bias on every token, one
    seed each) through the engine, eight at a time, drafting with lookup and a sampled draft model (the
    same weights without the bias: q differs from p, so the rule keeps drafts with probability p/q and
    draws refusals from p - q): the frequencies of the 27 possible answers against the model's exact
    joint distribution (tests/distribution.py)."""
    from distribution import P_BOUND, chi_square_p, exact_joint

    path = write_tiny_model(tmp_path / "dist.gguf", "llama", "F32", seed=11)
    model, draft = localllm.load(path, n_ctx=64, threads=2), localllm.load(path, n_ctx=64, threads=2)
    prompt, top_k, steps, runs = [2, 17, 33, 17, 33, 17], 3, 3, 1500
    bias_row = np.random.default_rng(1).normal(0, 0.7, model.decoder.hp.n_vocab).astype(np.float32)
    bias_row[list(model.tokenizer.eog_ids)] = -np.inf  # three tokens every time: no end of generation
    bias = {i: float(b) for i, b in enumerate(bias_row)}
    exact = exact_joint(model, prompt, steps, top_k, bias_row)
    spec = Speculation(lookup=True, draft=draft, max_draft=2, draft_p_min=0.0, token_cost=0.0)
    engine = Engine(model, parallel=8, cache_mb=4, max_queue=runs, speculation=spec)
    requests = [GenerationRequest(list(prompt), SamplingConfig(temperature=1.0, top_k=top_k, top_p=1.0, min_p=0.0,
                                                               seed=seed, logit_bias=bias), max_tokens=steps)
                for seed in range(runs)]
    results = engine_events(engine, requests, timeout=600)
    keys = list(exact)
    counts = np.zeros(len(keys), dtype=np.int64)
    for events in results:
        counts[keys.index(tuple(e.token for e in events if e.kind == "token" and e.token is not None))] += 1
    assert chi_square_p(counts, np.array([exact[k] for k in keys])) > P_BOUND
    drafted = sum(events[-1].timings.draft_tokens for events in results)
    kept = sum(events[-1].timings.draft_accepted for events in results)
    assert 0.2 * drafted < kept < drafted
