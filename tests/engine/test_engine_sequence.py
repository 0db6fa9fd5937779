"""The per-sequence output path (localllm/engine/sequence.py) that `generate` and the batching engine
share: hand-worked cases on a five-piece vocabulary, then both callers on a tiny model giving the same
events for the same request."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

import localllm
from localllm.engine.sequence import SequenceOutput, Timings

from tiny_models import write_tiny_model

HEL, LO, NL, US, ER, E_HIGH, E_LOW, EOG = range(8)
PIECES = {HEL: b"Hel", LO: b"lo", NL: b"\n", US: b"Us", ER: b"er:", E_HIGH: b"\xc3", E_LOW: b"\xa9"}


class Pieces:
    """What SequenceOutput asks of a tokenizer: pieces as bytes, and the end-of-generation ids."""

    eog_ids = frozenset({EOG})

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return PIECES[token]


def output(prompt=(HEL,), **options) -> SequenceOutput:
    options = {"max_tokens": 100, "n_ctx": 1000, **options}
    return SequenceOutput(Pieces(), list(prompt), timings=Timings(prompt_tokens=len(prompt)), **options)


def feed(out: SequenceOutput, tokens, n_cached: int = 1, logits=None) -> list:
    """Accept tokens one by one (positions after n_cached prompt positions) until one ends the sequence;
    the events, then close()'s."""
    logits = np.zeros(8, np.float32) if logits is None else logits
    events = []
    for i, token in enumerate(tokens):
        assert out.finish is None
        event = out.accept(token, logits, n_cached + i)
        events += [event] if event is not None else []
        if out.finish is not None:
            break
    return events + out.close()


def texts(events) -> list:
    return [(e.kind, e.text) if e.kind == "token" else (e.kind, e.finish_reason) for e in events]


def test_a_stop_string_over_two_tokens_is_held_back_then_cut():
    out = output(stop=["\nUser:"])
    events = feed(out, [LO, NL, US, ER, HEL])
    # "\n" and "\nUs" might begin the stop string: held back; "er:" completes it: nothing of it is emitted
    assert texts(events) == [("token", "lo"), ("token", ""), ("token", ""), ("token", ""), ("done", "stop")]
    assert [e.token for e in events[:4]] == [LO, NL, US, ER]
    assert out.ids == [HEL, LO, NL, US, ER] and out.generated == 4


def test_held_back_text_that_does_not_become_a_stop_string_is_released():
    events = feed(output(stop=["\nUser:"]), [NL, US, LO], logits=None)
    assert texts(events)[:3] == [("token", ""), ("token", ""), ("token", "\nUslo")]
    events = feed(output(stop=["\nUser:"], max_tokens=2), [NL, US])  # the limit comes first: flushed at close
    assert texts(events) == [("token", ""), ("token", ""), ("token", "\nUs"), ("done", "length")]


def test_an_end_of_generation_token_stops_without_an_event_or_history():
    out = output(stop=["\nUser:"])
    events = feed(out, [LO, NL, EOG])
    # the "\n" held back for the stop string comes out at close: no stop string ended the text
    assert texts(events) == [("token", "lo"), ("token", ""), ("token", "\n"), ("done", "stop")]
    assert out.ids == [HEL, LO, NL] and out.generated == 3 and events[-1].timings.generated_tokens == 3


def test_the_token_budget_and_the_context_end_with_length():
    assert texts(feed(output(max_tokens=2), [LO, LO, LO])) == [("token", "lo"), ("token", "lo"), ("done", "length")]
    # n_ctx 4, prompt of 1: tokens at cached positions 1, 2; at 3 the context is full (3 + 1 >= 4)
    assert texts(feed(output(n_ctx=4), [LO, LO, LO, LO])) == [("token", "lo")] * 3 + [("done", "length")]
    out = output(max_tokens=0)
    assert out.finish == "length" and texts(out.close()) == [("done", "length")]
    assert texts(feed(output(max_tokens=None, n_ctx=3), [LO, LO, LO])) == [("token", "lo")] * 2 + [("done", "length")]


def test_a_character_split_over_two_tokens_comes_out_whole():
    assert texts(feed(output(max_tokens=2), [E_HIGH, E_LOW])) == [("token", ""), ("token", "é"), ("done", "length")]


def test_logprobs_of_the_chosen_token_and_the_best_ones():
    # probabilities HEL 0.1, LO 0.2, NL 0.3, US 0.4, the others 0 (logits log p)
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4, 0, 0, 0, 0], np.float64) + 1e-30).astype(np.float32)
    none, = feed(output(max_tokens=1), [NL], logits=logits)[:1]
    assert none.logprob is None and none.top_logprobs is None
    chosen, = feed(output(max_tokens=1, top_logprobs=0), [NL], logits=logits)[:1]
    assert chosen.logprob == pytest.approx(math.log(0.3), abs=1e-6) and chosen.top_logprobs == []
    best, = feed(output(max_tokens=1, top_logprobs=2), [NL], logits=logits)[:1]
    assert [t for t, _ in best.top_logprobs] == [US, NL]
    assert [lp for _, lp in best.top_logprobs] == pytest.approx([math.log(0.4), math.log(0.3)], abs=1e-6)


def test_timings_count_from_the_start_and_from_the_first_token():
    out = output(t0=0.0)  # a start long ago: the first token came late
    events = feed(out, [LO, EOG])
    timings = events[-1].timings
    assert timings.time_to_first_token > 1.0 and 0 <= timings.generation_seconds < 60 and timings.generated_tokens == 2


# -- both callers on a tiny model ---------------------------------------------------------------------------------

N_CTX = 96


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("engine") / "tiny.gguf", "qwen3", "Q8_0", seed=7)
    return localllm.load(path, n_ctx=N_CTX, threads=1)


def engine_events(model, request) -> list:
    """Every event the batching engine sends for `request` (alone in the engine)."""
    from localllm.engine.batching import Engine

    engine = Engine(model, parallel=2, cache_mb=4)
    loop = asyncio.new_event_loop()
    try:
        handle = engine.submit(request, loop)

        async def collect():
            return [e async for e in handle.events()]

        engine.start()
        try:
            return loop.run_until_complete(asyncio.wait_for(collect(), 120))
        finally:
            engine.stop()
    finally:
        loop.close()


def generate_events(model, request) -> list:
    return list(model.generate(list(request.prompt), max_tokens=request.max_tokens, sampling=request.sampling,
                               stop=request.stop, top_logprobs=request.top_logprobs, session=model.new_session()))


def comparable(events) -> list:
    return [(e.kind, e.text, e.token, e.logprob, e.top_logprobs, e.finish_reason) for e in events]


def test_generate_and_the_batching_engine_give_the_same_events(model):
    """Four requests, each through Model.generate and through the Engine: seeded sampling with logprobs
    up to the budget, a stop string across a token boundary of that text, an end-of-generation token
    (made certain by logit_bias), and a prompt that fills the context."""
    from localllm.engine.batching import GenerationRequest
    from localllm.sampling import SamplingConfig

    prompt = model.tokenize("▁ab▁cd▁ef")
    seeded = SamplingConfig(temperature=100.0, top_k=0, top_p=1.0, min_p=0.0, seed=5)  # varied text
    sampled = GenerationRequest(prompt, seeded, max_tokens=8, top_logprobs=2)
    first = generate_events(model, sampled)
    pieces = [e.text for e in first if e.kind == "token"]
    assert first[-1].finish_reason == "length" and len(pieces) == 8
    # the stop string: the last 2 characters of one token's text and the first 2 of the next one's
    i = next(i for i in range(1, 8) if len(pieces[i - 1]) >= 2 and len(pieces[i]) >= 2)
    stop = pieces[i - 1][-2:] + pieces[i][:2]
    assert "".join(pieces).find(stop) == len("".join(pieces[:i])) - 2
    eog = next(iter(model.tokenizer.eog_ids))
    requests = [
        sampled,
        GenerationRequest(prompt, seeded, max_tokens=8, stop=[stop]),
        GenerationRequest(prompt, SamplingConfig(temperature=0.0, logit_bias={eog: 100.0}), max_tokens=8),
        GenerationRequest(model.tokenize("▁ab" * 90)[: N_CTX - 3], seeded, max_tokens=20, top_logprobs=0),
    ]
    finishes = []
    for request in requests:
        alone = generate_events(model, request)
        assert comparable(engine_events(model, request)) == comparable(alone)
        finishes.append((alone[-1].finish_reason, sum(e.token is not None for e in alone)))
    # the stop string ends with token i; the last prompt (93 tokens) leaves room for 96 - 93 tokens
    assert finishes == [("length", 8), ("stop", i + 1), ("stop", 0), ("length", N_CTX - len(requests[3].prompt))]
