"""`localllm serve`: the HTTP API driven by the official openai client and by raw HTTP, on the real
Gemma 3 270M. Expected generations come from Model.generate (the single-sequence engine path)."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

import localllm
from localllm.errors import LocalLLMError
from localllm.generate import common_prefix
from localllm.server import BackgroundServer, ServeOptions
from localllm.engine.batching import GenerationRequest, QueueFull
from localllm.sampling import SamplingConfig

N_CTX = 512
CONCURRENT_PROMPTS = [
    "Name a fruit.", "Count to five.", "What is the sky's color?", "Say hello in French.",
    "Give me a short poem.", "Why do cats purr?", "Describe rain in one line.", "Who wrote Hamlet?",
]


@pytest.fixture(scope="module")
def model(gemma_path):
    return localllm.load(gemma_path, n_ctx=N_CTX, threads=2)


@pytest.fixture(scope="module")
def server(model):
    with BackgroundServer(model, ServeOptions(port=0, parallel=8, cache_mb=48), model_id="gemma-test") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def alone(model, prompt_ids, max_tokens, cached=0, **sampling):
    """Tokens and text of Model.generate on a fresh session (no batching, no prefix cache), or on one that
    holds the first `cached` prompt tokens already (prefilled apart, as the server's block cache holds them)."""
    session = model.new_session()
    if cached:
        list(model.generate(prompt_ids[:cached], max_tokens=0, session=session))
    events = list(model.generate(prompt_ids, max_tokens=max_tokens, session=session, **sampling))
    tokens = [e.token for e in events if e.kind == "token" and e.token is not None]
    return tokens, "".join(e.text for e in events if e.kind == "token"), events[-1].finish_reason


def alone_chat(model, content, max_tokens, cached=0, **sampling):
    """`alone` for one user message as the chat endpoint prepares it: the model's chat prompt, its stop
    strings, and its default repetition penalty (the shipped Gemma is a base model: the transcript,
    "\nUser:", 1.1)."""
    prompt = model.render_chat([{"role": "user", "content": content}])
    # written out, not asked of the model: the endpoint's defaults are what is under test
    return alone(model, prompt, max_tokens, cached, stop=["\nUser:"], repeat_penalty=1.1, **sampling)


def chat(client, content, **kw):
    return client.chat.completions.create(model="gemma-test", messages=[{"role": "user", "content": content}], **kw)


def metric(server, name) -> float:
    for line in httpx.get(server.base_url + "/metrics").text.splitlines():
        if line.startswith(f"localllm_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


# -- the openai client ----------------------------------------------------------------------------------------

def test_chat_greedy_equals_the_engine_alone_and_streaming_gives_the_same_text(model, client):
    prompt = "Tell me about the moon."
    tokens, text, finish = alone_chat(model, prompt, 12, temperature=0)
    reply = chat(client, prompt, max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == text and reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == finish == "length"
    assert reply.usage.completion_tokens == len(tokens) == 12
    stream = chat(client, prompt, max_tokens=12, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completion_logprobs_describe_the_greedy_tokens(model, client):
    prompt = "The capital of France is"
    tokens, text, _ = alone(model, model.tokenize(prompt), 6, temperature=0, top_k=0, top_p=1.0, min_p=0.0)
    reply = client.completions.create(model="gemma-test", prompt=prompt, max_tokens=6, temperature=0, logprobs=3)
    choice = reply.choices[0]
    assert choice.text == text
    lp = choice.logprobs
    assert "".join(lp.tokens) == text and len(lp.token_logprobs) == 6
    for chosen, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0 and len(top) == 3
        assert max(top, key=top.get) == chosen and top[chosen] == pytest.approx(value)  # greedy: the best token
    # chat logprobs carry bytes and the top alternatives
    reply = chat(client, "Hi", max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 for c in content)
    assert bytes(content[0].bytes).decode() == content[0].token


def test_stop_string_ends_the_answer_and_is_not_returned(model, client):
    prompt = "Write a very long story about a dragon."
    _, full, _ = alone_chat(model, prompt, 30, temperature=0)
    stop = full.strip()[2:5]
    assert len(stop) == 3 and stop in full
    reply = chat(client, prompt, max_tokens=30, temperature=0, stop=[stop])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == full[: full.index(stop)]


def test_same_seed_same_answer_other_seed_differs(client):
    kw = dict(max_tokens=16, temperature=1.0, extra_body={"top_k": 0, "min_p": 0.0}, top_p=1.0)
    a = chat(client, "Invent a word.", seed=7, **kw).choices[0].message.content
    b = chat(client, "Invent a word.", seed=7, **kw).choices[0].message.content
    c = chat(client, "Invent a word.", seed=8, **kw).choices[0].message.content
    assert a == b and a != c


def test_eight_concurrent_greedy_requests_each_equal_the_request_alone(model, client, server):
    # The prompts share the transcript's opening (preamble and examples): after one request, its whole 16-token
    # blocks are in the server's cache and every request prefills only the rest, as `alone` does with `cached`
    # (a prompt prefilled in other chunks can part from the one-chunk prefill at a near-tie).
    prompts = [model.render_chat([{"role": "user", "content": p}]) for p in CONCURRENT_PROMPTS]
    shared = min(common_prefix(prompts[0], q) for q in prompts) // 16 * 16
    chat(client, CONCURRENT_PROMPTS[0], max_tokens=1, temperature=0)
    expected = [alone_chat(model, p, 16, shared, temperature=0)[1] for p in CONCURRENT_PROMPTS]
    steps_before = metric(server, "steps_total")
    with ThreadPoolExecutor(len(CONCURRENT_PROMPTS)) as pool:
        replies = list(pool.map(lambda p: chat(client, p, max_tokens=16, temperature=0), CONCURRENT_PROMPTS))
    assert [r.choices[0].message.content for r in replies] == expected
    steps = metric(server, "steps_total") - steps_before
    assert steps < 8 * 16  # they really shared steps (one step per token each would be 128)


def test_a_shared_prefix_is_prefilled_once(model, client, server):
    system = "You are a careful assistant who answers in one short sentence. " * 6
    messages = lambda q: [{"role": "system", "content": system}, {"role": "user", "content": q}]
    hits = metric(server, "prefix_cache_hits_total")
    first = client.chat.completions.create(model="gemma-test", messages=messages("What is ice?"), max_tokens=4, temperature=0)
    second = client.chat.completions.create(model="gemma-test", messages=messages("What is fire?"), max_tokens=4, temperature=0)
    n_system = len(model.render_chat(messages("")))
    cached = second.usage.prompt_tokens_details.cached_tokens
    # Every chat prompt of the base model opens with the transcript's preamble line (under 32 tokens), which
    # earlier requests have cached; the long system text after it is new to the first request only.
    first_cached = first.usage.prompt_tokens_details.cached_tokens
    assert first_cached < 32 < n_system - 16 <= cached < second.usage.prompt_tokens
    assert metric(server, "prefix_cache_hits_total") - hits == first_cached // 16 + cached // 16


def test_models_health_metrics_tokenize(model, client, server):
    assert [m.id for m in client.models.list().data] == ["gemma-test"]
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    text = "Hello, wörld!"
    ids = httpx.post(server.base_url + "/tokenize", json={"content": text}).json()["tokens"]
    assert ids == model.tokenize(text, add_bos=False, special=True)
    assert httpx.post(server.base_url + "/detokenize", json={"tokens": ids}).json() == {"content": text}
    body = httpx.get(server.base_url + "/metrics").text
    assert "# TYPE localllm_generation_tokens_total counter" in body
    assert metric(server, "requests_total") >= 1 and metric(server, "queue_length") == 0


def test_a_client_that_disconnects_frees_its_slot(server):
    cancelled = metric(server, "requests_cancelled_total")
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 400, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        next(lines)
    deadline = time.monotonic() + 10
    while metric(server, "active_sequences") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(server, "active_sequences") == 0 and metric(server, "kv_blocks_used") == 0
    assert metric(server, "requests_cancelled_total") == cancelled + 1


def test_stream_ends_with_done(server):
    body = {"prompt": "One, two,", "max_tokens": 3, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    usage = json.loads(events[-2][len("data: "):])["usage"]
    assert usage["completion_tokens"] == 3


# -- errors, raw HTTP --------------------------------------------------------------------------------------------

def _post(server, path, content, headers=None):
    return httpx.post(server.base_url + path, content=content, headers={"content-type": "application/json", **(headers or {})})


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}).encode(), 400, "temperature"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1.5}).encode(), 400, "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 2}).encode(), 400, "n"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-9"}).encode(), 404, "model"),
    (json.dumps({"messages": [{"role": "user", "content": "word " * 600}]}).encode(), 413, "messages"),
])
def test_invalid_requests_get_openai_shaped_errors(server, body, status, param):
    response = _post(server, "/v1/chat/completions", body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"] and error["type"] and error["param"] == param


def test_body_over_the_limit_is_refused(model):
    options = ServeOptions(port=0, parallel=1, cache_mb=8, max_body_bytes=1000)
    with BackgroundServer(model, options) as srv:
        response = _post(srv, "/v1/completions", json.dumps({"prompt": "x" * 2000}).encode())
        assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"


def test_api_key_is_required_when_set(model):
    options = ServeOptions(port=0, parallel=1, cache_mb=8, api_key="s3cret")
    with BackgroundServer(model, options) as srv:
        body = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()
        assert _post(srv, "/v1/completions", body).status_code == 401
        assert _post(srv, "/v1/completions", body, {"authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(srv.base_url + "/v1/models").json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(srv.base_url + "/health").status_code == 200
        ok = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="s3cret", max_retries=0)
        assert ok.completions.create(model=srv.model_id, prompt="Hi", max_tokens=1).usage.completion_tokens == 1


def test_a_full_queue_answers_503(model):
    options = ServeOptions(port=0, parallel=1, cache_mb=8, max_queue=1)
    srv = BackgroundServer(model, options)  # engine not started: queued requests stay queued
    loop = asyncio.new_event_loop()
    try:
        request = GenerationRequest(prompt=model.tokenize("Hi"), sampling=SamplingConfig(), max_tokens=1)
        srv.engine.submit(request, loop)
        with pytest.raises(QueueFull):
            srv.engine.submit(request, loop)
        from starlette.testclient import TestClient

        with TestClient(srv.app) as http:
            response = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
        assert response.status_code == 503 and response.json()["error"]["type"] == "server_error"
    finally:
        loop.close()


def test_warm_up_leaves_the_cache_as_it_found_it(model, monkeypatch):
    """serve prepares the batched path's kernels with a scratch step on the engine's thread
    (Engine.warm_up): no block stays taken, reserved or in the prefix cache, and a request after it gets
    what it gets alone."""
    srv = BackgroundServer(model, ServeOptions(port=0, parallel=2, cache_mb=8))
    pool = srv.engine.pool
    free_before = pool.available
    steps = []
    forward_batch = model.decoder.forward_batch
    with monkeypatch.context() as patch:
        patch.setattr(model.decoder, "forward_batch",
                      lambda cache, layout, rows: steps.append(len(layout.tokens)) or forward_batch(cache, layout, rows))
        srv.engine.start(warm_up=True)
        assert srv.engine.ready.wait(60) and srv.engine.warm_up_error is None
        srv.engine.stop()
    assert steps == [33]  # one step: a decode row beside a 32-token chunk
    assert (pool.available, pool.n_cached, pool.n_used) == (free_before, 0, 0)
    with srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0)
        _, text, _ = alone(model, model.tokenize("Name a fruit."), 8, temperature=0)
        answer = client.completions.create(model=srv.model_id, prompt="Name a fruit.", max_tokens=8, temperature=0)
        assert answer.choices[0].text == text


def test_a_failed_warm_up_fails_the_start_with_a_clear_error(model, monkeypatch):
    def broken(cache, layout, rows):
        raise RuntimeError("no kernels here")

    monkeypatch.setattr(model.decoder, "forward_batch", broken)
    srv = BackgroundServer(model, ServeOptions(port=0, parallel=1, cache_mb=8))
    with pytest.raises(LocalLLMError, match="preparing the kernels failed: no kernels here"):
        srv.start()
    assert srv.engine._thread is None  # the engine was stopped
