"""`run`, `chat`, `bench`, `localllm.load` and `serve --route` against a real remote: `localllm serve` in
another process (an engine with its own API key, one sequence at a time and a queue of one, so that a third
request is refused busy). Each answer through the remote is compared with the engine's own answer to the
same request, asked directly."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pexpect
import pytest

import localllm
import localllm.sampling
from localllm.remote.client import Client, RemoteError, RemoteStreamCut, RemoteUnreachable
from localllm.remote.config import parse_reference
from localllm.remote.model import RemoteModel, RemoteUnsupported

from remote_engines import free_port, start_localllm

KEY = "remote-test-key-4c1e"
GATEWAY_KEY = "gateway-test-key-9a2b"
PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    engine = start_localllm(tmp_path_factory.mktemp("remote"), "--api-key", KEY, "--parallel", "1", "--max-queue", "1")
    yield engine
    engine.stop()


@pytest.fixture
def keyed(monkeypatch):
    """The remote's key where an inline `remote:URL` reference reads it."""
    monkeypatch.setenv("LOCALLLM_REMOTE_API_KEY", KEY)


def own(engine, path: str, body: dict, key: str = KEY) -> dict:
    """The engine's own answer, asked directly."""
    answer = httpx.post(engine.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def cli(*args, env=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "localllm.cli.app", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "LOCALLLM_REMOTE_API_KEY": KEY, **(env or {})})


# -- run, load, generate ----------------------------------------------------------------------------------------

def test_greedy_run_through_the_remote_equals_the_engines_own_answer(remote):
    expected = own(remote, "/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0})
    result = cli("run", f"remote:{remote.url}", PROMPT, "-n", "24", "--temperature", "0", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["text"] == expected["choices"][0]["text"] and len(data["text"]) > 20
    assert data["finish_reason"] == expected["choices"][0]["finish_reason"] == "length"
    assert data["timings"]["prompt_tokens"] == expected["usage"]["prompt_tokens"]
    assert data["timings"]["generated_tokens"] == expected["usage"]["completion_tokens"] == 24

    messages = [{"role": "user", "content": "Name a fruit."}]
    expected = own(remote, "/chat/completions", {"messages": messages, "max_tokens": 16, "temperature": 0})
    result = cli("run", f"remote:{remote.url}", "Name a fruit.", "--chat", "-n", "16", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected["choices"][0]["message"]["content"] + "\n"


def test_load_gives_a_remote_model_whose_events_stream_as_a_local_models_do(remote, keyed):
    model = localllm.load(f"remote:{remote.url}")
    assert isinstance(model, RemoteModel) and model.engine == "localllm" and model.model_name == "gemma-3-270m"
    assert model.n_ctx == 1024  # what the engine reports (max_model_len, vLLM's key)
    events = list(model.generate(PROMPT, max_tokens=16, temperature=0))
    tokens, done = [e for e in events if e.kind == "token"], events[-1]
    assert len(tokens) >= 8 and all(e.token is None for e in tokens)  # streamed in pieces; the ids stay remote
    assert done.kind == "done" and done.finish_reason == "length"
    assert done.timings.generated_tokens == 16 and done.timings.prompt_tokens > 3
    assert done.timings.time_to_first_token > 0 and done.timings.generation_tps > 0

    # stop strings end the reply where the engine's own answer ends, with finish 'stop'
    expected = own(remote, "/completions", {"prompt": PROMPT, "max_tokens": 48, "temperature": 0, "stop": [","]})
    events = list(model.generate(PROMPT, max_tokens=48, temperature=0, stop=[","]))
    assert "".join(e.text for e in events if e.kind == "token") == expected["choices"][0]["text"]
    assert events[-1].finish_reason == expected["choices"][0]["finish_reason"] == "stop"

    # a chat, and a JSON schema sent as response_format
    schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}
    events = list(model.generate([{"role": "user", "content": "A color?"}], max_tokens=40, temperature=0,
                                 json_schema=schema))
    text = "".join(e.text for e in events if e.kind == "token")
    assert isinstance(json.loads(text)["color"], str)
    model.close()


def test_embeddings_through_the_remote_are_the_engines_own(remote, keyed):
    texts = ["A red apple.", "The sea at night."]
    expected = own(remote, "/embeddings", {"input": texts})
    model = localllm.load(f"remote:{remote.url}")
    result = model.embeddings(texts)
    assert result.vectors.shape == (2, 640) and result.token_counts == [None, None]
    assert result.vectors.tolist() == [row["embedding"] for row in expected["data"]]
    with pytest.raises(RemoteUnsupported, match="a pooling cannot be asked"):
        model.embeddings(texts, pooling="mean")
    printed = cli("embed", f"remote:{remote.url}", texts[0], "--json")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["embeddings"] == [expected["data"][0]["embedding"]]


def test_what_only_a_local_model_can_do_is_refused_not_faked(remote, keyed):
    model = localllm.load(f"remote:{remote.url}")
    for options in ({"top_logprobs": 2}, {"session": object()}, {"context_shift": True}, {"typical_p": 0.5}):
        with pytest.raises(RemoteUnsupported):
            model.generate(PROMPT, max_tokens=4, **options)
    with pytest.raises(RemoteUnsupported, match="tokenize needs a local model"):
        model.tokenize("x")
    # a GBNF grammar goes to an engine that takes one (localllm, llama.cpp), and is followed
    events = list(model.generate(PROMPT, max_tokens=8, temperature=0, grammar='root ::= "red" | "blue"'))
    assert "".join(e.text for e in events if e.kind == "token") in ("red", "blue")
    # an engine without GBNF grammars or typical_p (here said to be vLLM) is refused them before anything is sent
    vllm = RemoteModel(dataclasses.replace(parse_reference(f"remote:{remote.url}"), engine="vllm"))
    with pytest.raises(RemoteUnsupported, match=r"\(vllm\) takes no GBNF grammar"):
        vllm.generate(PROMPT, grammar='root ::= "x"')
    assert vllm.sampling_fields(localllm.sampling.SamplingConfig(top_k=5, repeat_penalty=1.2)) == {
        "temperature": 0.8, "top_p": 0.95, "top_k": 5, "repetition_penalty": 1.2}  # vLLM's names
    result = cli("run", f"remote:{remote.url}", PROMPT, "--ctx", "512")
    assert result.returncode == 2 and "--ctx applies to a local model" in result.stderr


def test_bench_measures_the_remote(remote):
    result = cli("bench", f"remote:{remote.url}", "-p", "32", "-n", "16", "-r", "2", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["test"] for r in rows] == ["pp32", "tg16"]
    assert all(r["avg_ts"] > 0 and len(r["samples_ns"]) == 2 and r["backend"] == "remote (localllm)" for r in rows)


# -- errors -------------------------------------------------------------------------------------------------------

def test_a_refused_key_a_missing_model_and_a_closed_port_are_one_line_each(remote, monkeypatch):
    result = cli("run", f"remote:{remote.url}", PROMPT, env={"LOCALLLM_REMOTE_API_KEY": "wrong"})
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(f"error: remote:{remote.url} refused the request (401, API key)")
    assert "LOCALLLM_REMOTE_API_KEY" in result.stderr and result.stderr.count("\n") == 1

    result = cli("run", f"remote:{remote.url}#no-such-model", PROMPT)
    assert result.returncode == 1
    assert "serves no model 'no-such-model' (it serves: gemma-3-270m)" in result.stderr
    # without the check of the model list first, the engine's own 404 comes through as it is
    monkeypatch.setenv("LOCALLLM_REMOTE_API_KEY", KEY)
    with pytest.raises(RemoteError) as caught:
        list(RemoteModel(parse_reference(f"remote:{remote.url}#no-such-model")).generate(PROMPT, max_tokens=4))
    assert caught.value.status == 404 and "no-such-model" in str(caught.value)

    port = free_port()
    t0 = time.monotonic()
    result = cli("run", f"remote:http://127.0.0.1:{port}/v1", PROMPT)
    assert result.returncode == 1 and time.monotonic() - t0 < 60
    assert result.stderr == f"error: cannot reach remote:http://127.0.0.1:{port}/v1 at http://127.0.0.1:{port}/v1: connection refused\n"
    with pytest.raises(RemoteUnreachable):
        list(localllm.load(f"remote:http://127.0.0.1:{port}").generate(PROMPT, max_tokens=4))


def _occupy(engine, n: int) -> list:
    """n long streamed requests holding the engine's one slot and its one queue place; close() frees them."""
    streams = []
    client = httpx.Client(headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    for _ in range(n):
        request = client.build_request("POST", engine.url + "/completions", json={
            "prompt": "Write a long story.", "max_tokens": 3000, "temperature": 0, "stream": True, "ignore_eos": True})
        streams.append(client.send(request, stream=True))
    return streams


def test_a_busy_remote_is_retried_after_its_retry_after_then_reported(remote, keyed):
    streams = _occupy(remote, 2)
    try:
        deadline = time.monotonic() + 60
        while not (remote.metric("active_sequences", KEY) == 1 and remote.metric("queue_length", KEY) == 1):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        waits = []
        model = RemoteModel(parse_reference(f"remote:{remote.url}"), Client(parse_reference(f"remote:{remote.url}"),
                                                                              sleep=waits.append))
        with pytest.raises(RemoteError) as caught:
            list(model.generate(PROMPT, max_tokens=4))
        assert caught.value.status == 503 and caught.value.retry_after == 1.0
        assert "is busy (503)" in str(caught.value) and str(caught.value).endswith("retry after 1 s")
        assert waits == [1.0, 1.0]  # its Retry-After, twice, then the error
    finally:
        for stream in streams:
            stream.close()
    # the closed connections cancelled both requests: the engine serves again
    events = list(localllm.load(f"remote:{remote.url}").generate(PROMPT, max_tokens=4, temperature=0))
    assert events[-1].finish_reason == "length"


def test_a_stream_cut_mid_reply_fails_at_once_not_hangs(tmp_path, keyed):
    engine = start_localllm(tmp_path, "--api-key", KEY, name="cut")
    try:
        model = localllm.load(f"remote:{engine.url}")
        stream = model.generate("Write a long story.", max_tokens=3000, temperature=0)
        for _ in range(5):
            assert next(stream).kind == "token"
        os.killpg(engine.process.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RemoteStreamCut, match="closed the connection in the middle of the reply"):
            for _ in stream:
                pass
        assert time.monotonic() - t0 < 30
    finally:
        engine.stop()


# -- chat in a terminal -------------------------------------------------------------------------------------------

def test_chat_through_a_remote_streams_and_ctrl_c_cancels_the_remote_request(remote, tmp_path):
    env = dict(os.environ, LOCALLLM_HISTORY=str(tmp_path / "history"), TERM="dumb", NO_COLOR="1", COLUMNS="200",
               LOCALLLM_REMOTE_API_KEY=KEY)
    child = pexpect.spawn(sys.executable, ["-m", "localllm.cli.app", "chat", f"remote:{remote.url}", "--temperature", "0",
                                           "-n", "3000"], env=env, encoding="utf-8", timeout=120, cwd=str(tmp_path))
    try:
        child.expect_exact("gemma-3-270m on " + remote.url + " (localllm)")
        child.expect_exact(">>> ")
        cancelled = remote.metric("requests_cancelled_total", KEY)
        child.sendline("Write a very long story about a dragon.")
        child.expect_exact("dragon.\r\n")
        child.expect(r"\w+\s+\w+\s+\w+")  # the reply streams
        assert remote.metric("active_sequences", KEY) == 1
        child.sendintr()
        child.expect_exact("(stopped)")
        child.expect_exact(">>> ")
        deadline = time.monotonic() + 15  # the closed connection cancelled the request on the remote
        while remote.metric("active_sequences", KEY) != 0 or remote.metric("requests_cancelled_total", KEY) != cancelled + 1:
            assert time.monotonic() < deadline, "the remote request was not cancelled"
            time.sleep(0.1)
        child.sendline("/set max_tokens 8")
        child.expect_exact(">>> ")
        child.sendline("And then?")
        child.expect_exact("then?\r\n")
        child.expect_exact(">>> ")
        reply = child.before.strip()
        assert reply and "error" not in reply
        child.sendline("/regen")  # greedy: the same reply again (the remote's cache reuses the prefix)
        child.expect_exact("/regen\r\n")
        child.expect_exact(">>> ")
        assert child.before.strip() == reply
        child.sendline("/stats")
        child.expect(r"reply \d+ tokens at [\d.]+ tok/s · context (\d+)/1024")  # the remote's context, reported
        assert int(child.match.group(1)) > 8
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


# -- serve --route: a gateway ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gateway(remote, tmp_path_factory):
    gone = free_port()
    engine = start_localllm(tmp_path_factory.mktemp("gateway"), "--api-key", GATEWAY_KEY, "--route",
                            f"big=remote:{remote.url}", "--route", f"gone=remote:http://127.0.0.1:{gone}/v1",
                            env={"LOCALLLM_REMOTE_API_KEY": KEY}, name="gateway")
    yield engine
    engine.stop()


def test_the_gateway_answers_for_remote_and_local_models_and_never_logs_a_key(gateway, remote):
    import ollama
    import openai

    client = openai.OpenAI(base_url=gateway.url, api_key=GATEWAY_KEY)
    assert [m.id for m in client.models.list().data] == ["gemma-3-270m", "big", "gone"]
    messages = [{"role": "user", "content": "Name a planet."}]
    expected = own(remote, "/chat/completions", {"messages": messages, "max_tokens": 16, "temperature": 0})
    expected_text = expected["choices"][0]["message"]["content"]

    # OpenAI's API, streamed: the remote's events passed through
    chunks = list(client.chat.completions.create(model="big", messages=messages, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected_text
    assert chunks[-1].usage.completion_tokens == expected["usage"]["completion_tokens"]
    answer = client.completions.create(model="big", prompt=PROMPT, max_tokens=12, temperature=0)
    assert answer.choices[0].text == own(remote, "/completions", {"prompt": PROMPT, "max_tokens": 12,
                                                                  "temperature": 0})["choices"][0]["text"]

    # embeddings, passed through
    vectors = client.embeddings.create(model="big", input=["A red apple."]).data[0].embedding
    assert vectors == own(remote, "/embeddings", {"input": ["A red apple."]})["data"][0]["embedding"]

    # Ollama's API, translated
    ollama_client = ollama.Client(host=gateway.url.removesuffix("/v1"), headers={"Authorization": f"Bearer {GATEWAY_KEY}"})
    parts = list(ollama_client.chat(model="big", messages=messages, options={"num_predict": 16, "temperature": 0},
                                    stream=True))
    assert "".join(p.message.content for p in parts) == expected_text
    assert parts[-1].done and parts[-1].eval_count == expected["usage"]["completion_tokens"]
    assert {m.model for m in ollama_client.list().models} == {"gemma-3-270m", "big", "gone"}

    # the local model, as before
    local = client.chat.completions.create(model="gemma-3-270m", messages=messages, max_tokens=4, temperature=0)
    assert local.choices[0].message.content

    # a client that goes away mid-stream: the gateway closes its request to the remote, which cancels it
    cancelled = remote.metric("requests_cancelled_total", KEY)
    stream = client.chat.completions.create(model="big", messages=[{"role": "user", "content": "A long story."}],
                                            max_tokens=3000, extra_body={"ignore_eos": True}, stream=True)
    for _, _ in zip(range(5), stream):
        pass
    stream.close()
    deadline = time.monotonic() + 15
    while remote.metric("requests_cancelled_total", KEY) != cancelled + 1 or remote.metric("active_sequences", KEY):
        assert time.monotonic() < deadline, "the remote request was not cancelled"
        time.sleep(0.1)

    # a route whose remote is down: 502 in one line, and a notice in the log
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="gone", messages=messages, max_tokens=4)
    assert caught.value.status_code == 502 and "connection refused" in caught.value.message
    # an unknown model: 404, as before
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nothing", messages=messages, max_tokens=4)

    log = gateway.log_text()
    assert "note: remote:http://127.0.0.1:" in log and "unreachable (connection refused)" in log
    assert "POST /v1/chat/completions 200" in log
    assert KEY not in log and GATEWAY_KEY not in log
