"""Throughput measurement shaped like llama.cpp's llama-bench.

pp<n>: the prompt-processing test evaluates n random tokens in one batched pass from an empty cache;
tg<n>: the text-generation test decodes n tokens one at a time from an empty cache (each step feeds the
previous token back; sampling is left out, as llama-bench leaves it out). Each test runs once untimed to
warm up (compile or load kernels, fault in the mapped weights), then `repetitions` times.

With a depth d (llama-bench's -d, "tg128 @ d4096"), d random tokens are evaluated once per model, untimed,
and every run of a test starts at position d with them in the cache, as llama-bench restores its saved
state before each run: the speed of a reply deep into a conversation, where attention reads a long cache.

Speculative tg (localllm/speculative.py): with a draft model (`draft`), or with `replay` k (every step
drafts k tokens that are the model's own greedy continuation, recorded by an untimed plain run: acceptance
100%, no drafting cost: verification at its ceiling), the tg test runs the whole generation loop (greedy
sampler, detokenizer) from a one-token prompt and times its decode part, n_gen tokens.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class BenchResult:
    """One row, with llama-bench's JSON keys for the numbers two engines are compared on."""

    model_filename: str
    model_type: str
    model_size: int
    n_params: int
    backend: str
    n_threads: int
    n_prompt: int
    n_gen: int
    n_depth: int = 0
    samples_ns: list = field(default_factory=list)
    speculation: str = ""  # "", "draft<k>" or "replay<k>" (a speculative tg test)
    draft_acceptance: float = 0.0  # drafts kept / drafted, over the timed runs

    @property
    def test(self) -> str:
        name = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        name += f" +{self.speculation}" if self.speculation and not self.n_prompt else ""
        return f"{name} @ d{self.n_depth}" if self.n_depth else name

    @property
    def samples_ts(self) -> list:
        n = self.n_prompt or self.n_gen
        return [n / (ns / 1e9) for ns in self.samples_ns]

    @property
    def avg_ts(self) -> float:
        return statistics.mean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_ts) > 1 else 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(test=self.test, avg_ts=self.avg_ts, stddev_ts=self.stddev_ts, samples_ts=self.samples_ts,
                   avg_ns=int(statistics.mean(self.samples_ns)))
        return out


def _random_tokens(n: int, n_vocab: int, rng) -> np.ndarray:
    return rng.integers(0, n_vocab, n).astype(np.int32)


def _prefill(model, tokens, start: int, cache) -> None:
    """Evaluate tokens at positions start.. in chunks, as generation does."""
    from .generate import PREFILL_CHUNK

    for first in range(0, len(tokens), PREFILL_CHUNK):
        model.decoder.forward(tokens[first : first + PREFILL_CHUNK], start + first, cache)


def time_prompt(model, n_prompt: int, rng, session=None, depth: int = 0) -> int:
    """Nanoseconds to evaluate n_prompt random tokens from position `depth` (the session's cache holds
    the first `depth` positions; a new session when none is given)."""
    if session is None:
        session = model.new_session()
    tokens = _random_tokens(n_prompt, model.decoder.hp.n_vocab, rng)
    t0 = time.perf_counter_ns()
    _prefill(model, tokens, depth, session.cache)
    return time.perf_counter_ns() - t0


def time_generation(model, n_gen: int, rng, session=None, depth: int = 0) -> int:
    """Nanoseconds to decode n_gen tokens one at a time from position `depth` (as time_prompt)."""
    if session is None:
        session = model.new_session()
    token = _random_tokens(1, model.decoder.hp.n_vocab, rng)
    t0 = time.perf_counter_ns()
    for pos in range(depth, depth + n_gen):
        logits = model.decoder.forward(token, pos, session.cache)
        token[0] = int(np.argmax(logits[0]))
    return time.perf_counter_ns() - t0


class SpeculativeGeneration:
    """The speculative tg test: a draft model, or the replay of the model's own greedy continuation."""

    def __init__(self, draft=None, replay: int = 0, max_draft: int = 8):
        self.draft, self.replay, self.max_draft = draft, replay, max_draft
        self.drafted = self.accepted = 0

    @property
    def label(self) -> str:
        return f"replay{self.replay}" if self.replay else f"draft{self.max_draft}"

    def speculation(self, prompt: list, answer: list):
        from .speculative import Replay, Speculation

        if self.replay:
            return Speculation(lookup=False, drafter=Replay(len(prompt), answer), max_draft=self.replay)
        return Speculation(lookup=False, draft=self.draft, max_draft=self.max_draft)

    def time(self, model, n_gen: int, rng, session, depth: int, prompt_ids) -> int:
        """Nanoseconds of the decode part of a greedy generation of n_gen tokens after `prompt_ids` (the
        session holding the first `depth` of them), scaled to n_gen decode steps."""
        answer = _greedy(model, prompt_ids, n_gen, session, None)[0] if self.replay else []
        tokens, timings = _greedy(model, prompt_ids, n_gen, session, self.speculation(prompt_ids, answer))
        self.drafted += timings.draft_tokens
        self.accepted += timings.draft_accepted
        steps = max(1, timings.generated_tokens - 1)  # the first token comes from the prompt's pass
        return int(timings.generation_seconds * 1e9 * n_gen / steps)


def _greedy(model, prompt_ids, n_gen: int, session, speculation):
    tokens, timings = [], None
    for event in model.generate(prompt_ids, max_tokens=n_gen + 1, temperature=0, session=session, speculation=speculation):
        if event.kind == "token" and event.token is not None:
            tokens.append(event.token)
        elif event.kind == "done":
            timings = event.timings
    return tokens, timings


def _session_at_depth(model, depth: int, rng):
    """A session whose cache holds `depth` random tokens' keys and values (evaluated once, untimed).
    A run writes its own positions after them, so the next run finds the same first `depth` entries."""
    session = model.new_session()
    if depth:
        tokens = _random_tokens(depth, model.decoder.hp.n_vocab, rng)
        _prefill(model, tokens, 0, session.cache)
        session.tokens = [int(t) for t in tokens]  # what a speculative tg test's generate reuses
    return session


def bench(model_path, n_prompt: int = 512, n_gen: int = 128, threads=(None,), repetitions: int = 5, seed: int = 0, progress=None,
          backend: str = "cpu", n_depth: int = 0, speculative: "SpeculativeGeneration | None" = None):
    """Yield a BenchResult per (thread count, test) on `backend`. `progress(msg)` is called before each test.
    Timings are end to end: each forward returns host logits, which waits for a device backend's kernels.
    `speculative`: tg tests through speculative decoding (SpeculativeGeneration)."""
    import localllm

    rng = np.random.default_rng(seed)
    for n_threads in threads:
        model = localllm.load(model_path, n_ctx=n_depth + max(n_prompt, n_gen) + 16, threads=n_threads, backend=backend)
        if progress:
            progress("preparing the kernels")
        model.backend.wait_for_kernels()  # a cold start's background compile (backends/cpu/tiers.py)
        info = _model_info(model)
        tests = [(n_prompt, 0)] * bool(n_prompt) + [(0, n_gen)] * bool(n_gen)
        session = None
        for pp, tg in tests:
            result = BenchResult(**info, n_threads=model.backend.threads, n_prompt=pp, n_gen=tg, n_depth=n_depth)
            if progress:
                progress(f"{result.test} at {result.n_threads} thread(s)")
            if n_depth and session is None:
                session = _session_at_depth(model, n_depth, rng)
            if pp:
                run = lambda: time_prompt(model, pp, rng, session, n_depth)  # noqa: E731
            elif speculative is not None:
                result.speculation = speculative.label
                spec_session = session or model.new_session()
                prompt_ids = list(spec_session.tokens) + [int(_random_tokens(1, model.decoder.hp.n_vocab, rng)[0])]
                run = lambda: speculative.time(model, tg, rng, spec_session, n_depth, prompt_ids)  # noqa: E731
            else:
                run = lambda: time_generation(model, tg, rng, session, n_depth)  # noqa: E731
            run()  # warm-up
            if speculative is not None:
                speculative.drafted = speculative.accepted = 0
            result.samples_ns = [run() for _ in range(repetitions)]
            if speculative is not None and tg and speculative.drafted:
                result.draft_acceptance = speculative.accepted / speculative.drafted
            yield result
        model.close()


def _model_info(model) -> dict:
    from .gguf.constants import FILE_TYPES

    reader = model.reader
    file_type = reader.metadata.get_int("general.file_type", None)
    size_label = reader.metadata.get_str("general.size_label", None) or ""
    return {
        "model_filename": str(model.path),
        "model_type": f"{reader.architecture} {size_label} {FILE_TYPES.get(file_type, '')}".replace("  ", " ").strip(),
        "model_size": sum(t.nbytes for t in reader.tensors.values()),
        "n_params": sum(t.n_elements for t in reader.tensors.values()),
        "backend": model.backend.name,
    }
