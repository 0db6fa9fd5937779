"""Generation: prefill the prompt in batched chunks, then decode one token per step, yielding events.

The caller (CLI, tests) only renders events; nothing here prints. What each sampled token produces
(events, stop strings, limits) is decided by engine/sequence.py, the path the batching engine (the
server's) runs its sequences through too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np

from .engine.sequence import PREFILL_CHUNK, Event, SequenceOutput, Timings
from .errors import ContextOverflow

__all__ = ["PREFILL_CHUNK", "Event", "Session", "Timings", "common_prefix", "generate_tokens", "prefill"]


@dataclass
class Session:
    """A KV cache and the tokens it holds; reused across turns so a new turn prefills only what is new."""

    cache: object
    tokens: list = field(default_factory=list)

    def reset(self) -> None:
        self.tokens = []


def common_prefix(a: list, b: list) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefill(decoder, session: Session, prompt: list[int], n_ctx: int) -> tuple[np.ndarray, int]:
    """Bring the session's cache to `prompt`, reusing the common prefix; returns (last logits, reused)."""
    if len(prompt) == 0:
        raise ValueError("empty prompt: nothing to generate from")
    if len(prompt) >= n_ctx:
        raise ContextOverflow(len(prompt) + 1, n_ctx)
    # Keep at least one token to run so the logits of the last prompt position are computed. A cache with
    # recurrent layers may keep fewer: their state resumes from a checkpoint (model/recurrent.py).
    reused = session.cache.resume_at(min(common_prefix(session.tokens, prompt), len(prompt) - 1))
    session.tokens = list(prompt[:reused])
    # recurrent layers: the state one token before the prompt's end is what a next turn repeating this
    # prompt resumes from, so the prompt runs in two parts with a checkpoint between
    split = session.cache.states is not None and len(prompt) - 1 > reused
    ends = [len(prompt) - 1, len(prompt)] if split else [len(prompt)]
    logits, start = None, reused
    for end in ends:
        for first in range(start, end, PREFILL_CHUNK):
            chunk = np.asarray(prompt[first : min(first + PREFILL_CHUNK, end)], dtype=np.int32)
            logits = decoder.forward(chunk, first, session.cache)
            session.tokens.extend(int(t) for t in chunk)
        if end < len(prompt):
            session.cache.checkpoint()
        start = end
    return logits[-1], reused


def generate_tokens(
    decoder,
    tokenizer,
    session: Session,
    prompt: list[int],
    sampler,
    *,
    max_tokens: int,
    n_ctx: int,
    stop: Optional[list[str]] = None,
    top_logprobs: Optional[int] = None,
    drafters: Optional[list] = None,
    draft_length=None,
) -> Iterator[Event]:
    """Yield a token event per generated token, then one 'done' event with timings (what each token
    produces and when generation ends: engine/sequence.py, shared with the batching engine).

    top_logprobs None: no log-probabilities (they cost a softmax over the vocabulary per step);
    0: the chosen token's; n: also the n most likely tokens'. drafters: speculative decoding's
    (localllm/speculative.py), asked in order for the tokens draft_length (a DraftLength) chooses; the
    tokens are the same (greedy) or identically distributed (sampling) as without them."""
    timings = Timings(prompt_tokens=len(prompt))
    t0 = time.perf_counter()
    logits, timings.cached_tokens = prefill(decoder, session, prompt, n_ctx)
    timings.prompt_seconds = time.perf_counter() - t0
    out = SequenceOutput(tokenizer, list(prompt), max_tokens=max_tokens, n_ctx=n_ctx, timings=timings, stop=stop,
                         top_logprobs=top_logprobs, t0=t0, special=sampler.config.special_tokens)
    if drafters:
        from .speculative import SpeculationStats, speculative_steps

        stats = SpeculationStats()
        try:
            yield from speculative_steps(decoder, session, out, sampler, drafters, logits, draft_length, stats)
        finally:
            timings.draft_tokens, timings.draft_accepted = stats.drafted, stats.accepted
            for drafter in drafters:
                drafter.close()
        yield from out.close()
        return
    step_input = np.zeros(1, dtype=np.int32)  # reused: the decode loop allocates no arrays of its own
    while out.finish is None:
        token = sampler.sample(logits, out.ids)
        event = out.accept(token, logits, len(session.tokens))
        if event is not None:
            yield event
        if out.finish is not None:
            break  # the last token needs no forward pass: its logits would go unused
        step_input[0] = token
        logits = decoder.forward(step_input, len(session.tokens), session.cache)[0]
        session.tokens.append(token)
    yield from out.close()
