"""The server prepares prompts off its event loop and refuses what cannot fit before tokenizing it
(issue 25: a 4 MB chat prompt took 55-74 s to be refused with 413, and /health waited as long), and
malformed bodies are 400s, never 500s. Real Gemma 3 270M; the bound's arithmetic on a hand-made
vocabulary."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

import localllm
from localllm.server import BackgroundServer, ServeOptions
from localllm.server.prepare import PromptPreparer, longest_token_bytes
from localllm.server.protocol import APIError
from localllm.tokenizer import Tokenizer

N_CTX = 512
BIG_CHAT = json.dumps({"messages": [{"role": "user", "content": "<start_of_turn>" * 266_000}], "max_tokens": 1}).encode()
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def model(gemma_path):
    return localllm.load(gemma_path, n_ctx=N_CTX, threads=2)


@pytest.fixture(scope="module")
def server(model):
    with BackgroundServer(model, ServeOptions(port=0, parallel=2, cache_mb=16)) as srv:
        yield srv


def _timed(function, *args, **kwargs):
    t0 = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - t0


# -- the bound ---------------------------------------------------------------------------------------------------

def _hand_made_tokenizer() -> Tokenizer:
    # types: 1 normal, 2 unknown, 3 control, 6 byte
    tokens = ["<unk>", "<s>", "</s>", "<0x41>", "\u2581hello", "\u2581" * 8, "<start_of_turn>", "h\u00e9"]
    types = [2, 3, 3, 6, 1, 1, 3, 1]
    return Tokenizer("llama", tokens, types, scores=[0.0] * len(tokens), bos_id=1, eos_id=2, unk_id=0)


def test_the_longest_token_is_counted_in_bytes_of_text():
    # Pieces, worked out by hand: "<0x41>" 1 byte, "▁hello" " hello" 6, eight "▁" eight spaces 8 (24 bytes as
    # stored), "<start_of_turn>" 15 (a control token is matched by its text), "hé" 3.
    assert longest_token_bytes(_hand_made_tokenizer()) == 15


def test_text_over_n_ctx_minus_1_longest_tokens_is_refused_by_its_bytes():
    prep = PromptPreparer(_hand_made_tokenizer(), n_ctx=10)  # 9 tokens of 15 bytes at most: 135 bytes
    prep.check("a" * 135, "prompt")  # could be 9 tokens: left to the tokenizer
    for text in ("a" * 136, "\u00e9" * 68):  # 136 bytes (68 characters): at least 10 tokens
        with pytest.raises(APIError) as info:
            prep.check(text, "prompt")
        assert info.value.status == 413 and info.value.code == "context_length_exceeded"
        assert "136 bytes, so at least 10 tokens" in str(info.value) and "holds 10" in str(info.value)


# -- refusing early, and staying responsive -------------------------------------------------------------------

def test_a_4mb_chat_prompt_is_refused_with_413_without_being_tokenized(server, model, monkeypatch):
    encoded = []
    encode = model.tokenizer.encode
    monkeypatch.setattr(model.tokenizer, "encode", lambda text, **kw: encoded.append(len(text)) or encode(text, **kw))
    response, seconds = _timed(httpx.post, server.base_url + "/v1/chat/completions", content=BIG_CHAT, headers=JSON,
                               timeout=300)
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "holds 512" in error["message"]
    assert encoded == []  # refused from its size alone
    assert seconds < 5  # before: 55 s at a 4096 context (tokenizing 266k special tokens)


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "x" * 3_000_000, "max_tokens": 1}),
    ("/tokenize", {"content": "<start_of_turn>" * 200_000}),
])
def test_oversized_text_prompts_are_refused_with_413_at_once(server, path, body):
    response, seconds = _timed(httpx.post, server.base_url + path, json=body, timeout=300)
    assert response.status_code == 413 and response.json()["error"]["code"] == "context_length_exceeded"
    assert seconds < 5


def test_health_answers_within_1s_while_a_4mb_prompt_is_refused(server):
    done = {}

    def big():
        t0 = time.monotonic()
        done["status"] = httpx.post(server.base_url + "/v1/chat/completions", content=BIG_CHAT, headers=JSON,
                                    timeout=300).status_code
        done["span"] = (t0, time.monotonic())

    thread = threading.Thread(target=big)
    probes = []  # (start, end) of each /health call
    with httpx.Client(timeout=300) as probe:
        thread.start()
        while thread.is_alive():
            t0 = time.monotonic()
            assert probe.get(server.base_url + "/health").status_code == 200
            probes.append((t0, time.monotonic()))
    thread.join()
    start, end = done["span"]
    during = [(a, b) for a, b in probes if start <= a and b <= end]
    assert done["status"] == 413 and during, (done, len(probes))
    assert max(b - a for a, b in during) < 1.0


def test_a_slow_preparation_leaves_health_and_other_streams_flowing(server, model, monkeypatch):
    """Tokenization held for 2 s (a stand-in for a long prompt): /health still answers at once, and a
    stream already running keeps delivering tokens (on the event loop, both stalled for the 2 s)."""
    encode = model.tokenizer.encode

    def slow_for_the_marker(text, **kw):
        if "SLOW-PREPARATION" in text:
            time.sleep(2.0)
        return encode(text, **kw)

    monkeypatch.setattr(model.tokenizer, "encode", slow_for_the_marker)
    arrivals, enough = [], threading.Event()
    no_end = {str(t): -100 for t in model.tokenizer.eog_ids}  # the stream outlasts the slow request
    body = {"prompt": "Once upon a time", "max_tokens": 1000, "stream": True, "temperature": 0, "logit_bias": no_end}

    def stream():
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=300) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    arrivals.append(time.monotonic())
                if enough.is_set():
                    return  # closing the stream cancels the request

    streamer = threading.Thread(target=stream)
    streamer.start()
    while len(arrivals) < 3:  # the stream is running
        time.sleep(0.01)
    slow = threading.Thread(target=httpx.post, args=(server.base_url + "/v1/completions",),
                            kwargs={"json": {"prompt": "SLOW-PREPARATION", "max_tokens": 1}, "timeout": 300})
    t_slow = time.monotonic()
    slow.start()
    time.sleep(0.2)
    health, seconds = _timed(httpx.get, server.base_url + "/health")
    slow.join()
    t_done = time.monotonic()
    enough.set()
    streamer.join()
    assert health.status_code == 200 and seconds < 1.0
    assert t_done - t_slow >= 2.0  # the slow preparation really ran while we watched
    window = [t for t in arrivals if t_slow <= t <= t_done]
    gaps = [b - a for a, b in zip([t_slow, *window], [*window, t_done])]
    assert len(window) >= 3 and max(gaps) < 1.0, gaps


# -- malformed bodies ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"prompt": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001,
])
def test_deeply_nested_json_is_a_400(server, body):
    response = httpx.post(server.base_url + "/v1/completions", content=body, headers=JSON, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "the request body nests arrays or objects too deeply"


@pytest.mark.parametrize("path, field", [("/v1/completions", "prompt"), ("/tokenize", "content")])
def test_a_lone_surrogate_in_text_is_a_400(server, path, field):
    body = b'{"%s": "x \\ud800", "max_tokens": 1}' % field.encode()
    response = httpx.post(server.base_url + path, content=body, headers=JSON, timeout=60)
    assert response.status_code == 400 and "not valid Unicode" in response.json()["error"]["message"]
