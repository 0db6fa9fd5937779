"""One sequence's output path, shared by `generate` and the batching engine.

Each sampled token goes through SequenceOutput.accept, which decides, in this order:
  1. an end-of-generation token ends the sequence (finish 'stop'); it produces no event and no text;
  2. otherwise the token joins the history (the sampler's penalty window), its log-probabilities are
     computed when asked, its text is detokenized (UTF-8 safe across tokens) and cut at the first stop
     string (text that may begin one is held back until later text decides it), and a token event is
     produced;
  3. the sequence ends on a stop string ('stop'), else on its token budget or when the cache has no room
     for the next position ('length').
close() then gives the held-back text, if any, and the 'done' event with the timings. The caller only
samples, runs the forward passes and delivers the events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

# Prompt rows per forward pass: the same for `generate` and the batching engine, so a prompt is cut into
# the same chunks (and gives the same logits) whichever runs it.
PREFILL_CHUNK = 512


@dataclass
class Timings:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    time_to_first_token: float = 0.0
    cached_tokens: int = 0
    draft_tokens: int = 0  # speculative decoding: tokens drafted, and those the model kept
    draft_accepted: int = 0

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
            "draft_tokens": self.draft_tokens,
            "draft_accepted": self.draft_accepted,
        }


@dataclass
class Event:
    """One generated token (kind 'token'), the end of generation (kind 'done'), or, from the batching
    engine, a failed request (kind 'error', the message in text)."""

    kind: str
    text: str = ""
    token: Optional[int] = None
    logprob: Optional[float] = None
    top_logprobs: Optional[list] = None
    finish_reason: Optional[str] = None  # 'stop' (end-of-generation token or stop string), 'length'
    timings: Optional[Timings] = None


class SequenceOutput:
    """The output state of one sequence: history, detokenizer, stop matcher, limits, timings.

    history: the prompt's token ids (this list is extended with every accepted token: pass the list the
    sampler reads). max_tokens: tokens to sample at most (None: until the context is full; 0 or less:
    none, the sequence is finished from the start). n_ctx: positions the sequence's cache can hold.
    top_logprobs: None, no log-probabilities (a softmax over the vocabulary per token); 0, the chosen
    token's; n, also the n most likely tokens'. t0: when the request started (time_to_first_token counts
    from it; default now). special: control tokens' text is written out (SamplingConfig.special_tokens)."""

    def __init__(self, tokenizer, history: list, *, max_tokens: Optional[int], n_ctx: int, timings: Timings,
                 stop: Optional[list] = None, top_logprobs: Optional[int] = None, t0: Optional[float] = None,
                 special: bool = False):
        from ..sampling import StopMatcher, logprobs
        from ..tokenizer import StreamDecoder

        self._logprobs = logprobs
        self.ids = history
        self.max_tokens = max_tokens
        self.n_ctx = n_ctx
        self.top_logprobs = top_logprobs
        self.timings = timings
        self.detok = StreamDecoder(tokenizer, special=special)
        self.stops = StopMatcher(stop or [])
        self.eog = tokenizer.eog_ids
        self.t_decode = time.perf_counter()  # reset at the first token: generation_seconds counts from it
        self.t0 = self.t_decode if t0 is None else t0
        self.finish: Optional[str] = "length" if max_tokens is not None and max_tokens <= 0 else None

    @property
    def generated(self) -> int:
        """Tokens accepted so far (an end-of-generation token included)."""
        return self.timings.generated_tokens

    def accept(self, token: int, logits, n_cached: int) -> Optional[Event]:
        """The event of `token`, sampled from float32[n_vocab] `logits` while the cache holds n_cached of
        this sequence's positions; None for an end-of-generation token. Sets `finish` when the sequence
        ends with this token."""
        timings = self.timings
        if timings.generated_tokens == 0:
            now = time.perf_counter()
            timings.time_to_first_token = now - self.t0
            self.t_decode = now
        timings.generated_tokens += 1
        if token in self.eog:
            self.finish = "stop"
            return None
        lp = top = None
        if self.top_logprobs is not None:
            lp, top = self._logprobs(logits, token, self.top_logprobs)
        self.ids.append(token)
        text, stopped = self.stops.feed(self.detok.feed(token))
        if stopped:
            self.finish = "stop"
        elif self.max_tokens is not None and timings.generated_tokens >= self.max_tokens:
            self.finish = "length"
        elif n_cached + 1 >= self.n_ctx:  # the context is full: this token's position (n_cached) is the last
            self.finish = "length"
        return Event("token", text=text, token=token, logprob=lp, top_logprobs=top)

    def close(self) -> list[Event]:
        """The events that end the sequence: the held-back text (a stop string's start that never
        completed, bytes of an unfinished character), if any, then 'done' with the finish reason and the
        timings ('length' if nothing ended it: a caller that stops early)."""
        finish = self.finish or "length"
        tail, _ = self.stops.feed(self.detok.flush())
        tail += self.stops.flush() if finish != "stop" or not self.stops.stopped else ""
        events = [Event("token", text=tail)] if tail else []
        self.timings.generation_seconds = time.perf_counter() - self.t_decode
        events.append(Event("done", finish_reason=finish, timings=self.timings))
        return events
