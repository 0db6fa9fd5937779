"""A check shared by the tests of model families on the batching server: concurrent greedy requests each
give the tokens the request gets alone (Model.generate), and the requests shared steps."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

import localllm
from localllm.server import BackgroundServer, ServeOptions


def concurrent_equals_alone(path: str, prompts: list, rounds: int = 1, max_tokens: int = 10) -> None:
    """Serve the model at `path` (4 sequences a step) and send every prompt at once, `rounds` times: each
    answer must equal Model.generate's alone, and the server must have taken fewer steps than one per token
    and request."""
    with localllm.load(path, n_ctx=128, threads=2) as model:
        expected = []
        for ids in prompts:
            events = list(model.generate(ids, max_tokens=max_tokens, temperature=0))
            expected.append("".join(e.text for e in events if e.kind == "token"))
        with BackgroundServer(model, ServeOptions(port=0, parallel=4, cache_mb=4)) as srv:
            def complete(ids):
                body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0}
                return httpx.post(srv.base_url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]

            answers = []
            for _ in range(rounds):
                with ThreadPoolExecutor(len(prompts)) as pool:
                    answers.append(list(pool.map(complete, prompts)))
            steps = steps_total(srv)
    assert all(expected) and all(got == expected for got in answers)
    assert steps < rounds * len(prompts) * max_tokens  # the requests shared steps


def steps_total(server) -> float:
    for line in httpx.get(server.base_url + "/metrics").text.splitlines():
        if line.startswith("localllm_steps_total "):
            return float(line.split()[1])
    raise AssertionError("no steps_total metric")
