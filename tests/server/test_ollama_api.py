"""Ollama's API on `localllm serve` (localllm/server/ollama.py), driven by the `ollama` Python package from
PyPI, on the real Gemma 3 270M. Expected generations come from Model.generate alone (the single-sequence
engine path), as in test_server.py."""

from __future__ import annotations

import json
import os

import httpx
import ollama
import pytest

import localllm
from localllm.server import BackgroundServer, ServeOptions

from fake_hub import fake_hub  # noqa: F401  (the fixture)

N_CTX = 512


@pytest.fixture(scope="module")
def model(gemma_path):
    return localllm.load(gemma_path, n_ctx=N_CTX, threads=2)


@pytest.fixture(scope="module")
def server(model):
    with BackgroundServer(model, ServeOptions(port=0, parallel=4, cache_mb=48), model_id="gemma-test") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.base_url)


@pytest.fixture
def fresh_client(model):
    """A server of its own: no prompt blocks cached by other tests' requests, whose reuse would split the
    prefill differently from Model.generate's (other rounding, and at temperature 0 maybe another token)."""
    with BackgroundServer(model, ServeOptions(port=0, parallel=4, cache_mb=48), model_id="gemma-test") as srv:
        yield ollama.Client(host=srv.base_url)


def alone(model, prompt, max_tokens, **sampling) -> str:
    """Model.generate on a fresh session (the default one would reuse an earlier prompt's prefix)."""
    events = list(model.generate(prompt, max_tokens=max_tokens, session=model.new_session(), **sampling))
    return "".join(e.text for e in events if e.kind == "token")


def chat_alone(model, content, max_tokens) -> str:
    """What /api/chat must give for one user message at temperature 0: the chat prompt, its stop strings
    and its repetition penalty (a base model's transcript: "\\nUser:", 1.1), written out."""
    prompt = model.render_chat([{"role": "user", "content": content}])
    return alone(model, prompt, max_tokens, temperature=0, stop=["\nUser:"], repeat_penalty=1.1)


def test_list_show_and_version_describe_the_served_model(client, server, model):
    listed = client.list()
    assert [m.model for m in listed.models] == ["gemma-test"]
    entry = listed.models[0]
    assert entry.size == os.path.getsize(model.path)
    assert entry.details.format == "gguf" and entry.details.family == "gemma3"
    assert entry.details.quantization_level == "Q4_K_M"
    shown = client.show("gemma-test")
    assert shown.details.family == "gemma3" and shown.modelinfo["general.architecture"] == "gemma3"
    assert httpx.get(server.base_url + "/api/version").json()["version"] == localllm.__version__
    assert [m.model for m in client.ps().models] == ["gemma-test"]


def test_chat_greedy_equals_the_engine_alone_streamed_or_not(client, model):
    want = chat_alone(model, "Tell me about the moon.", 12)
    messages = [{"role": "user", "content": "Tell me about the moon."}]
    options = {"temperature": 0, "num_predict": 12}
    whole = client.chat(model="gemma-test", messages=messages, options=options, stream=False)
    assert whole.message.role == "assistant" and whole.message.content == want and want
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.eval_count == 12 or whole.done_reason == "stop"
    assert whole.prompt_eval_count > 0 and whole.total_duration > 0
    parts = list(client.chat(model="gemma-test:latest", messages=messages, options=options, stream=True))
    assert "".join(p.message.content for p in parts) == want
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done


def test_generate_applies_the_template_unless_raw(fresh_client, model):
    client, options = fresh_client, {"temperature": 0, "num_predict": 10}
    templated = client.generate(model="gemma-test", prompt="Name a fruit.", options=options, stream=False)
    prompt = model.render_chat([{"role": "user", "content": "Name a fruit."}])
    # a chat turn's defaults, as /api/chat takes them (the base model's transcript: "\nUser:", 1.1)
    assert templated.response == alone(model, prompt, 10, temperature=0, stop=["\nUser:"], repeat_penalty=1.1)
    raw = "".join(p.response for p in client.generate(model="gemma-test", prompt="The capital of France is", raw=True,
                                                       options=options, stream=True))
    assert raw == alone(model, "The capital of France is", 10, temperature=0) and raw


def test_an_empty_prompt_loads_the_model(client):
    loaded = client.generate(model="gemma-test", prompt="")
    assert loaded.done and loaded.done_reason == "load"


def test_the_stream_is_ndjson_by_default(server):
    """Without "stream" (Ollama's default is true; the Python client sends false unless asked)."""
    body = {"model": "gemma-test", "prompt": "Hi", "raw": True, "options": {"num_predict": 3, "temperature": 0}}
    with httpx.stream("POST", server.base_url + "/api/generate", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert all(not line["done"] for line in lines[:-1]) and lines[-1]["done"]


@pytest.mark.parametrize("field,value", [("format", "yaml"), ("images", ["aGk="]), ("tools", [{"type": "function"}]),
                                         ("suffix", "end"), ("template", "{{ .Prompt }}")])
def test_what_would_change_the_output_and_is_not_supported_is_refused(server, field, value):
    body = {"model": "gemma-test", "prompt": "Hi", "stream": False, field: value}
    response = httpx.post(server.base_url + "/api/generate", json=body, timeout=60)
    assert response.status_code == 400 and field in response.json()["error"]
    with pytest.raises(ollama.ResponseError) as caught:  # the client's view of the same answer
        ollama.Client(host=server.base_url).generate(model="gemma-test", prompt="Hi", stream=False, suffix="end")
    assert caught.value.status_code == 400 and "suffix" in caught.value.error


def test_another_model_is_a_404_as_ollama_answers(client):
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="llama3.2", messages=[{"role": "user", "content": "Hi"}], stream=False)
    assert caught.value.status_code == 404


def test_pull_downloads_into_the_store_with_ollama_statuses(server, fake_hub, tmp_path, monkeypatch):
    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setenv("LOCALLLM_MODELS", str(models))
    repo, wanted = "bartowski/Llama-3.2-1B-Instruct-GGUF", "Llama-3.2-1B-Instruct-Q8_0.gguf"
    data = bytes(range(256)) * 1200
    fake_hub.add_file(repo, wanted, data)
    client = ollama.Client(host=server.base_url)
    statuses = list(client.pull("llama3.2:1b-instruct-q8_0", stream=True))
    assert statuses[0].status == "pulling manifest" and statuses[-1].status == "success"
    download = [s for s in statuses if s.status.startswith("pulling ") and s.total]
    assert download and download[-1].completed == download[-1].total == len(data)
    assert [s.completed for s in download] == sorted(s.completed for s in download)
    assert "verifying sha256 digest" in [s.status for s in statuses]
    assert (models / wanted).read_bytes() == data
    assert client.pull("llama3.2:1b-instruct-q8_0", stream=False).status == "success"  # already there
    with pytest.raises(ollama.ResponseError) as caught:
        client.pull("lama3.2:1b", stream=False)
    assert caught.value.status_code == 404 and "did you mean" in caught.value.error
    with httpx.stream("POST", server.base_url + "/api/pull", json={"model": "lama3.2:1b"}, timeout=60) as response:
        streamed = list(response.iter_lines())  # streamed: the error is the last line
    assert json.loads(streamed[-1])["error"].startswith("unknown model")
