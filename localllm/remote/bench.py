"""`localllm bench` on a remote model: llama-bench's pp and tg tests, timed here, over the remote's API.

pp<n>: n random token ids (a different draw every run, so that no prefix cache serves them) sent to
/completions for one generated token: the time to that token (prefill, plus the network's round trip).
tg<n>: one random token, then n tokens generated greedily, streamed; `ignore_eos` (llama.cpp, vLLM,
localllm) keeps the reply from ending early where the engine takes it; the time from the first to the last
token, scaled to n tokens. Token ids are drawn from 1000..9999: ordinary tokens in every vocabulary of
real models (their special tokens sit below or far above).
"""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from ..bench import BenchResult
from ..sampling_config import SamplingConfig
from .client import RemoteError

TOKEN_RANGE = (1000, 10000)
TAKES_IGNORE_EOS = ("localllm", "llama.cpp", "vllm")


def bench_remote(model, n_prompt: int, n_gen: int, repetitions: int, seed: int = 0, progress=None) -> Iterator[BenchResult]:
    """A BenchResult for the pp test, then the tg test (a count of 0 skips it), each after one untimed run."""
    rng = np.random.default_rng(seed)
    info = {"model_filename": model.label, "model_type": model.model_name, "model_size": 0, "n_params": 0,
            "backend": f"remote ({model.engine})", "n_threads": 0}
    for pp, tg in [(n_prompt, 0)] * bool(n_prompt) + [(0, n_gen)] * bool(n_gen):
        result = BenchResult(**info, n_prompt=pp, n_gen=tg)
        if progress:
            progress(f"{result.test} on {model.label}")
        run = (lambda: _time_prompt(model, pp, rng)) if pp else (lambda: _time_generation(model, tg, rng))  # noqa: E731
        run()  # warm-up
        result.samples_ns = [run() for _ in range(repetitions)]
        yield result


def _tokens(rng, n: int) -> list:
    return [int(t) for t in rng.integers(*TOKEN_RANGE, n)]


def _body(model, prompt: list, max_tokens: int) -> dict:
    body = {"model": model.model_name, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, **model.sampling_fields(SamplingConfig(temperature=0.0))}
    if model.engine in TAKES_IGNORE_EOS:
        body["ignore_eos"] = True
    return body


def _time_prompt(model, n_prompt: int, rng) -> int:
    """Nanoseconds from sending n_prompt tokens to the first generated one."""
    t0 = time.perf_counter_ns()
    for chunk in model.client.stream("/completions", _body(model, _tokens(rng, n_prompt), 1)):
        if any(c.get("text") for c in chunk.get("choices") or []):
            return time.perf_counter_ns() - t0
    raise RemoteError(f"{model.label} generated nothing for the prompt test")


def _time_generation(model, n_gen: int, rng) -> int:
    """Nanoseconds from the first generated token to the last, scaled to n_gen - 1 steps over n_gen tokens
    (as the local tg test counts: every step one token)."""
    first = last = None
    generated = pieces = 0
    for chunk in model.client.stream("/completions", _body(model, _tokens(rng, 1), n_gen)):
        if any(c.get("text") for c in chunk.get("choices") or []):
            last = time.perf_counter_ns()
            first = first or last
            pieces += 1
        usage = chunk.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens"):
            generated = int(usage["completion_tokens"])
    generated = generated or pieces
    if first is None or generated < 2:
        raise RemoteError(f"{model.label} generated under 2 tokens for the generation test")
    return int((last - first) * n_gen / (generated - 1))
