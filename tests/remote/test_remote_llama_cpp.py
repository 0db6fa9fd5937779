"""A second, independent engine: llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`) on
the Gemma file, driven through `remote:`. It runs where llama-cpp-python and its server extras are installed
(in this Python, or the one LLAMA_CPP_SERVER_PYTHON names): PyPI carries it only as an sdist, a 15-minute
build that the CI machine does not make (docs/remote.md says how to run this file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

import localllm
import localllm.remote.model
from localllm.remote.model import RemoteModel

from remote_engines import llama_cpp_python, start_llama_cpp

PROMPT = "The three primary colors are"
KEY = "llama-cpp-test-key-71d0"


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory, gemma_path):
    python = llama_cpp_python()
    if not python:
        pytest.skip("llama-cpp-python's server is not installed (pip install 'llama-cpp-python[server]', or set "
                    "LLAMA_CPP_SERVER_PYTHON to a Python that has it)")
    engine = start_llama_cpp(tmp_path_factory.mktemp("llama_cpp"), python, gemma_path, KEY)
    yield engine
    engine.stop()


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv("LOCALLLM_REMOTE_API_KEY", KEY)


def own(engine, path: str, body: dict) -> dict:
    answer = httpx.post(engine.url + path, json=body, timeout=120, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_greedy_run_through_llama_cpp_equals_its_own_answer(llama_server):
    expected = own(llama_server, "/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0})
    result = subprocess.run([sys.executable, "-m", "localllm.cli.app", "run", f"remote:{llama_server.url}", PROMPT, "-n",
                             "24", "--temperature", "0", "--json"], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, LOCALLLM_REMOTE_API_KEY=KEY))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["text"] == expected["choices"][0]["text"] and len(data["text"]) > 20
    assert data["finish_reason"] == "length"
    # its stream carries no usage: the tokens are counted as they come (one a chunk)
    assert data["timings"]["generated_tokens"] == expected["usage"]["completion_tokens"] == 24


def test_llama_cpp_streams_stops_and_chats_as_it_answers_itself(llama_server, keyed):
    model = localllm.load(f"remote:{llama_server.url}")
    assert isinstance(model, RemoteModel) and model.model_name == "gemma" and model.engine == "openai"
    expected = own(llama_server, "/completions", {"prompt": PROMPT, "max_tokens": 48, "temperature": 0, "stop": ["."]})
    events = list(model.generate(PROMPT, max_tokens=48, temperature=0, stop=["."]))
    assert len([e for e in events if e.kind == "token"]) > 3
    assert "".join(e.text for e in events if e.kind == "token") == expected["choices"][0]["text"]
    assert events[-1].finish_reason == expected["choices"][0]["finish_reason"] == "stop"

    messages = [{"role": "user", "content": "Name a fruit."}]
    expected = own(llama_server, "/chat/completions", {"messages": messages, "max_tokens": 16, "temperature": 0})
    events = list(model.generate(messages, max_tokens=16, temperature=0))
    assert "".join(e.text for e in events if e.kind == "token") == expected["choices"][0]["message"]["content"]
    # plain OpenAI fields only to an engine not known to take more: a changed top_k is refused, not dropped
    with pytest.raises(localllm.remote.model.RemoteUnsupported, match="takes no top_k"):
        model.generate(PROMPT, top_k=5)


def test_llama_cpp_refusing_the_key_is_one_line(llama_server):
    result = subprocess.run([sys.executable, "-m", "localllm.cli.app", "run", f"remote:{llama_server.url}", PROMPT],
                            capture_output=True, text=True, timeout=120, env=dict(os.environ, LOCALLLM_REMOTE_API_KEY="no"))
    assert result.returncode == 1 and result.stdout == "" and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: remote:{llama_server.url} refused the request (401, API key)")
