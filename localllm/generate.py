"""Generation: prefill the prompt in batched chunks, then decode one token per step, yielding events.

The caller (CLI, server, tests) only renders events; nothing here prints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np

from .errors import ContextOverflow

PREFILL_CHUNK = 512


@dataclass
class Timings:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    time_to_first_token: float = 0.0
    cached_tokens: int = 0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        # the first generated token comes from the prefill; the decode steps produce the rest
        steps = self.generated_tokens - 1
        return steps / self.generation_seconds if steps > 0 and self.generation_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prompt_seconds": round(self.prompt_seconds, 4),
            "prompt_tokens_per_second": round(self.prompt_tps, 2),
            "generated_tokens": self.generated_tokens,
            "generation_seconds": round(self.generation_seconds, 4),
            "generation_tokens_per_second": round(self.generation_tps, 2),
            "time_to_first_token": round(self.time_to_first_token, 4),
        }


@dataclass
class Event:
    """One generated token (kind 'token') or the end of generation (kind 'done')."""

    kind: str
    text: str = ""
    token: Optional[int] = None
    logprob: Optional[float] = None
    top_logprobs: Optional[list] = None
    finish_reason: Optional[str] = None  # 'stop' (end-of-generation token or stop string), 'length'
    timings: Optional[Timings] = None


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
    # Keep at least one token to run so the logits of the last prompt position are computed.
    reused = min(common_prefix(session.tokens, prompt), len(prompt) - 1)
    session.tokens = list(prompt[:reused])
    logits = None
    for start in range(reused, len(prompt), PREFILL_CHUNK):
        chunk = np.asarray(prompt[start : start + PREFILL_CHUNK], dtype=np.int32)
        logits = decoder.forward(chunk, start, session.cache)
        session.tokens.extend(int(t) for t in chunk)
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
) -> Iterator[Event]:
    """Yield a token event per generated token, then one 'done' event with timings.

    top_logprobs None: no log-probabilities (they cost a softmax over the vocabulary per step);
    0: the chosen token's; n: also the n most likely tokens'."""
    from .sampling import StopMatcher, logprobs as compute_logprobs
    from .tokenizer import StreamDecoder

    timings = Timings(prompt_tokens=len(prompt))
    t0 = time.perf_counter()
    logits, timings.cached_tokens = prefill(decoder, session, prompt, n_ctx)
    timings.prompt_seconds = time.perf_counter() - t0
    detok = StreamDecoder(tokenizer)
    stops = StopMatcher(stop or [])
    eog = tokenizer.eog_ids
    history = list(prompt)
    finish = "length"
    t_decode = time.perf_counter()
    step_input = np.zeros(1, dtype=np.int32)  # reused: the decode loop allocates no arrays of its own
    for step in range(max_tokens):
        token = sampler.sample(logits, history)
        if step == 0:
            timings.time_to_first_token = time.perf_counter() - t0
            t_decode = time.perf_counter()
        timings.generated_tokens += 1
        if token in eog:
            finish = "stop"
            break
        lp = top = None
        if top_logprobs is not None:
            lp, top = compute_logprobs(logits, token, top_logprobs)
        history.append(token)
        text, stopped = stops.feed(detok.feed(token))
        yield Event("token", text=text, token=token, logprob=lp, top_logprobs=top)
        if stopped:
            finish = "stop"
            break
        if step == max_tokens - 1:
            break  # the last token needs no forward pass: its logits would go unused
        if len(session.tokens) + 1 >= n_ctx:
            finish = "length"
            break
        step_input[0] = token
        logits = decoder.forward(step_input, len(session.tokens), session.cache)[0]
        session.tokens.append(token)
    else:
        finish = "length"
    tail, _ = stops.feed(detok.flush())
    tail += stops.flush() if finish != "stop" or not stops.stopped else ""
    if tail:
        yield Event("token", text=tail)
    timings.generation_seconds = time.perf_counter() - t_decode
    yield Event("done", finish_reason=finish, timings=timings)
