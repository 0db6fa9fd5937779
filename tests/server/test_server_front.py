"""`localllm serve`'s front door (issue 26): the port actually bound, a busy port as one line, the
access log, GET /v1/models/{id}, every name of the served model, limits printed as integers. Real
Gemma 3 270M for the HTTP and CLI checks; a tiny model under a registry file name for the names."""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from starlette.testclient import TestClient

import localllm
from localllm.server import BackgroundServer, ServeOptions, build_app
from tiny_models import write_tiny_model

LOG_LINE = re.compile(r"^(GET|POST) (\S+) (\d{3})(?:  in (\d+)  out (\d+))?  (\d+\.\d{3}) s$")


@pytest.fixture(scope="module")
def model(gemma_path):
    return localllm.load(gemma_path, n_ctx=256, threads=2)


@pytest.fixture(scope="module")
def logged(model):
    """A server whose access log goes to a list."""
    lines: list = []
    with BackgroundServer(model, ServeOptions(port=0, parallel=2, cache_mb=8, access_log=lines.append)) as srv:
        yield srv, lines


def _parsed(lines) -> list:
    out = []
    for line in lines:
        match = LOG_LINE.match(line)
        assert match, line
        method, path, status, n_in, n_out, _ = match.groups()
        out.append((method, path, int(status), n_in and int(n_in), n_out and int(n_out)))
    return out


def test_one_access_log_line_per_request_with_its_tokens(logged):
    srv, lines = logged
    lines.clear()
    plain = httpx.post(srv.base_url + "/v1/completions", json={"prompt": "The sky is", "max_tokens": 3}).json()
    body = {"prompt": "One, two,", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", srv.base_url + "/v1/completions", json=body) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: {")]
    streamed = json.loads(events[-1][len("data: "):])["usage"]
    httpx.get(srv.base_url + "/health")
    httpx.get(srv.base_url + "/no/such%1Bpath")
    deadline = time.monotonic() + 5
    while len(lines) < 4 and time.monotonic() < deadline:  # a stream's line is written once it has ended
        time.sleep(0.02)
    assert _parsed(lines) == [
        ("POST", "/v1/completions", 200, plain["usage"]["prompt_tokens"], plain["usage"]["completion_tokens"]),
        ("POST", "/v1/completions", 200, streamed["prompt_tokens"], streamed["completion_tokens"]),
        ("GET", "/health", 200, None, None),
        ("GET", "/no/such%1Bpath", 404, None, None),  # as sent: no escape reaches the terminal
    ]
    assert plain["usage"]["completion_tokens"] == 3 and streamed["completion_tokens"] == 4


def test_models_answer_to_every_name_of_the_served_file(logged, model, gemma_path):
    srv, _ = logged
    stem = os.path.basename(gemma_path)[: -len(".gguf")]
    served = srv.model_id
    assert served == "gemma-3-270m"  # started without a name: the name `localllm list` shows
    for name in ("gemma-3-270m", "GEMMA-3-270M", stem, stem + ".gguf"):
        info = httpx.get(f"{srv.base_url}/v1/models/{name}")
        assert info.status_code == 200 and info.json() == {"id": served, "object": "model", "created": 0,
                                                           "owned_by": "localllm", "max_model_len": srv.engine.seq_ctx}
        reply = httpx.post(srv.base_url + "/v1/completions", json={"model": name, "prompt": "Hi", "max_tokens": 1})
        assert reply.status_code == 200 and reply.json()["model"] == served
    for other in ("gemma-3-1b-it", "hf.co/x/y:Q4_K_M"):
        assert httpx.get(f"{srv.base_url}/v1/models/{other}").json()["error"]["code"] == "model_not_found"
        reply = httpx.post(srv.base_url + "/v1/completions", json={"model": other, "prompt": "Hi", "max_tokens": 1})
        assert reply.status_code == 404


def test_a_registry_file_answers_to_its_registry_names(tmp_path, monkeypatch):
    # A file copied into the models directory under a registry file name (gemma-3-270m-it's Q8_0, its
    # default quant) is that registry model: listed as gemma-3-270m-it-q8_0.
    monkeypatch.setenv("LOCALLLM_MODELS", str(tmp_path))
    path = write_tiny_model(tmp_path / "gemma-3-270m-it-Q8_0.gguf", "llama", "Q8_0", seed=1)
    with localllm.load(path, n_ctx=64, threads=1) as tiny:
        app, _ = build_app(tiny, ServeOptions(port=0, parallel=1, cache_mb=1))
        with TestClient(app) as http:
            assert http.get("/v1/models").json()["data"][0]["id"] == "gemma-3-270m-it-q8_0"
            for name in ("gemma-3-270m-it", "gemma-3-270m-it-q8_0", "gemma-3-270m-it-q8", "gemma-3-270m-it-Q8_0"):
                assert http.get(f"/v1/models/{name}").status_code == 200, name
            # the same model's other quant is another file
            assert http.get("/v1/models/gemma-3-270m-it-q4_k_m").status_code == 404


@pytest.mark.parametrize("field, value, bounds", [
    ("temperature", 1e10, "between 0 and 2147483648"),
    ("presence_penalty", 3, "between -2 and 2"),
    ("top_p", 1.5, "between 0 and 1"),
])
def test_limits_in_messages_are_integers(logged, field, value, bounds):
    srv, _ = logged
    reply = httpx.post(srv.base_url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1, field: value})
    message = reply.json()["error"]["message"]
    assert reply.status_code == 400 and f"'{field}' must be {bounds} (got {value!r})" == message


def test_a_wrong_value_is_quoted_short(logged):
    srv, _ = logged
    reply = httpx.post(srv.base_url + "/v1/completions", json={"prompt": "Hi", "temperature": "x" * 1_000_000})
    message = reply.json()["error"]["message"]
    assert reply.status_code == 400 and message == "'temperature' must be a number (got '" + "x" * 76 + "...)"


def test_a_cache_too_small_is_named_as_typed(model):
    from localllm.errors import LocalLLMError
    from localllm.engine.batching import Engine

    with pytest.raises(LocalLLMError, match=r"^--cache-mb 0 holds fewer than 2 KV blocks of 16 tokens$"):
        Engine(model, cache_mb=0.0)  # typer hands --cache-mb over as a float


# -- the command ------------------------------------------------------------------------------------------------

def _serve(*args) -> subprocess.Popen:
    env = {**os.environ, "COLUMNS": "300", "LOCALLLM_THREADS": "2"}
    return subprocess.Popen([sys.executable, "-m", "localllm.cli.app", "serve", *args], stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def _lines(stream) -> queue.Queue:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in stream], daemon=True).start()
    return lines


def _wait_for(lines: queue.Queue, pattern: str, seconds: float = 180) -> re.Match:
    deadline = time.monotonic() + seconds
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match
    raise AssertionError(f"no line matching {pattern!r} in {seen}")


@pytest.mark.parametrize("quiet", [False, True])
def test_serve_on_port_0_prints_the_port_it_bound_and_logs_requests(quiet):
    proc = _serve("--port", "0", "--ctx", "256", "--cache-mb", "8", *(["--quiet"] if quiet else []))
    try:
        err = _lines(proc.stderr)
        port = int(_wait_for(err, r"serving gemma-3-270m on http://127\.0\.0\.1:(\d+)/v1").group(1))
        assert port != 0
        assert httpx.get(f"http://127.0.0.1:{port}/health").json() == {"status": "ok"}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).json()
        assert reply["usage"]["completion_tokens"] == 2
        if quiet:
            time.sleep(1.0)
            assert err.empty()
        else:
            _wait_for(err, r"^GET /health 200  \d+\.\d{3} s$", 10)
            _wait_for(err, rf"^POST /v1/completions 200  in {reply['usage']['prompt_tokens']}  out 2  \d+\.\d{{3}} s$", 10)
    finally:
        proc.terminate()
        proc.wait(30)


def test_serve_on_a_busy_port_is_one_line_and_exit_1():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _serve("--port", str(port), "--ctx", "256", "--cache-mb", "8")
        out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, err
    assert err == f"error: port {port} on 127.0.0.1 is already in use; choose another with --port (0: any free port)\n"
    assert out == ""


def test_the_socket_listens_when_the_banner_is_printed(tmp_path):
    """serve's on_ready (the CLI's banner with the URL) runs once the socket listens: a client that
    connects the moment it reads the URL is queued, not refused (CI once saw the refusal under load)."""
    from tiny_models import write_tiny_model

    from localllm.server.runner import ServeOptions, serve

    class Stop(Exception):
        pass

    def on_ready(model, engine, model_id, url):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()
        raise Stop

    path = write_tiny_model(tmp_path / "llama-Q8_0.gguf", "llama", "Q8_0")
    with pytest.raises(Stop):
        serve(str(path), ServeOptions(port=0, ctx=64, cache_mb=1, warm_up=False), on_ready=on_ready)
