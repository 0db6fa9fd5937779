"""`localllm serve --lookup` on the real Gemma 3 270M: concurrent greedy requests whose answers copy their
prompt (code asked back) get drafts from it, keep many, and still answer token for token what
Model.generate gives each alone without speculation."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import localllm
from localllm.server import BackgroundServer, ServeOptions

CODE = [
    "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return 2 * (width + height)\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i, 'even')\n    else:\n        print(i, 'odd')\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        self.items.append(item)\n",
]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def model(gemma_path):
    return localllm.load(gemma_path, n_ctx=512, threads=2)


def metric(server, name: str) -> float:
    for line in httpx.get(server.base_url + "/metrics").text.splitlines():
        if line.startswith(f"localllm_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} metric")


def test_concurrent_copying_requests_with_lookup_equal_generate_alone(model):
    prompts = [model.tokenize(f"{code}\nThe same code again:\n{code[:12]}") for code in CODE]
    expected = []
    for ids in prompts:
        events = list(model.generate(ids, max_tokens=MAX_TOKENS, temperature=0, top_logprobs=0, session=model.new_session()))
        expected.append(("".join(e.text for e in events if e.kind == "token"),
                         [float(e.logprob) for e in events if e.kind == "token" and e.token is not None]))
    options = ServeOptions(port=0, parallel=4, cache_mb=16, lookup=True, draft_max=8)
    with BackgroundServer(model, options) as srv:
        def complete(ids):
            body = {"prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1}
            reply = httpx.post(srv.base_url + "/v1/completions", json=body, timeout=300).json()
            choice = reply["choices"][0]
            return choice["text"], choice["logprobs"]["token_logprobs"]

        with ThreadPoolExecutor(len(prompts)) as pool:
            answers = list(pool.map(complete, prompts))
        drafted, accepted = metric(srv, "draft_tokens_total"), metric(srv, "draft_tokens_accepted_total")
        steps = metric(srv, "steps_total")
    assert answers == expected  # the same text, token by token the same log-probabilities
    assert all(len(logprobs) == MAX_TOKENS for _, logprobs in expected)
    assert drafted >= accepted > MAX_TOKENS  # the answers copy their prompts: many drafts kept
    assert steps < MAX_TOKENS  # fewer steps than tokens per request


def test_a_draft_model_whose_caches_would_not_fit_is_refused_before_serving(model, gemma_path, monkeypatch):
    import localllm.host
    from localllm.errors import LocalLLMError
    from localllm.server.runner import build_app

    # each decoding sequence holds a KV cache of the draft's (4 here); 1 MiB of memory holds none of them
    monkeypatch.setattr(localllm.host, "available_memory", lambda: 2**20)
    with pytest.raises(LocalLLMError, match=r"--draft: 4 sequences' KV caches of the draft model need .* GiB .*"
                                            r"and 0.0 GiB is available: lower --parallel or --ctx"):
        build_app(model, ServeOptions(port=0, parallel=4, draft=gemma_path))
