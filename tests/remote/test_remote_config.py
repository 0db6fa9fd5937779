"""The config file's remotes and routes, `remote:` references, routing with its fallbacks, and `list`."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localllm.remote.config import ConfigError, Remote, load_config, parse_reference
from localllm.remote.routing import resolve_target

from remote_engines import free_port

CONFIG = """
[remotes.gpu]
url = "http://gpu-box:8000/v1"
model = "meta-llama/Llama-3.1-8B-Instruct"
api_key_env = "GPU_BOX_KEY"
engine = "vllm"
timeout = 30

[remotes.laptop]
url = "http://127.0.0.1:{port}"

[[routes]]
model = "llama-3.1-8b"
use = "{local}"
fallback = "remote:gpu"

[[routes]]
model = "big-*"
use = "remote:laptop"
fallback = ["{local}"]
"""


def write_config(tmp_path: Path, local: str, port: int = 1) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG.format(local=local, port=port))
    return path


def test_the_config_file_names_remotes_and_ordered_routes(tmp_path, gemma_path, monkeypatch):
    config = load_config(write_config(tmp_path, gemma_path))
    gpu = config.remotes["gpu"]
    assert gpu == Remote("gpu", "http://gpu-box:8000/v1", "meta-llama/Llama-3.1-8B-Instruct", "GPU_BOX_KEY", "vllm", 30.0)
    assert config.remotes["laptop"].url == "http://127.0.0.1:1/v1"  # a bare host gets the API's /v1
    assert gpu.label == "remote:gpu" and gpu.api_key() is None
    monkeypatch.setenv("GPU_BOX_KEY", "k")
    assert gpu.api_key() == "k"
    assert config.route_for("LLAMA-3.1-8B").targets == (gemma_path, "remote:gpu")  # any case
    assert config.route_for("big-one").targets == ("remote:laptop", gemma_path)  # a glob
    assert config.route_for("other") is None
    # references: a config name (its model replaced after #), or a URL with its key from LOCALLLM_REMOTE_API_KEY
    assert parse_reference("remote:gpu#other-model", config).model == "other-model"
    inline = parse_reference("remote:https://host.example/api/v1/#m")
    assert (inline.url, inline.model, inline.api_key_env) == ("https://host.example/api/v1", "m", "LOCALLLM_REMOTE_API_KEY")
    assert inline.label == "remote:https://host.example/api/v1#m"
    assert load_config(tmp_path / "missing.toml").remotes == {}  # no file: nothing configured


@pytest.mark.parametrize("text, message", [
    ('[remotes.a]\nurl = "http://h"\napi_key = "sk-123"', "put the API key in an environment variable"),
    ('[remotes.a]\nurl = "ftp://h"', "is not an http:// or https:// URL"),
    ('[remotes.a]\nurl = "http://h"\nengine = "ollama"', "'engine' must be one of vllm, llama.cpp, tgi, localllm, openai"),
    ('[remotes.a]\nurl = "http://h"\ntimeout = 0', "'timeout' must be a number of seconds > 0"),
    ('[remotes.a]\nurl = "http://h"\nmodels = "x"', "unknown key 'models'"),
    ('[[routes]]\nmodel = "x"\nuse = "remote:nowhere"', "unknown remote 'nowhere'"),
    ('[[routes]]\nmodel = "x"', "'use' (a local model or remote:NAME) is required"),
    ('[remote.a]\nurl = "http://h"', "unknown section 'remote'"),
    ('[remotes.a\n', "not valid TOML"),
])
def test_a_config_file_that_cannot_be_used_is_one_line_naming_it(tmp_path, text, message):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        load_config(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    # the CLI: one line, exit 1, for any name it has to route
    result = subprocess.run([sys.executable, "-m", "localllm.cli.app", "run", "some-model", "hi"], capture_output=True,
                            text=True, env={**os.environ, "LOCALLLM_CONFIG": str(path)}, timeout=60)
    assert result.returncode == 1 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert message.split("'")[0] in result.stderr


def test_a_route_passes_over_a_local_model_that_does_not_fit_and_an_unreachable_remote(tmp_path, gemma_path):
    config = load_config(write_config(tmp_path, gemma_path, port=free_port()))
    notices = []
    # the local file fits: it is used, without a word
    assert resolve_target("llama-3.1-8b", config=config, notify=notices.append) == Path(gemma_path)
    assert notices == []
    # with 100 MB available it does not (241 MiB of weights): the remote after it, and a notice saying why
    target = resolve_target("llama-3.1-8b", config=config, notify=notices.append, available=100 * 2**20)
    assert target == config.remotes["gpu"]
    assert notices == [f"note: {gemma_path} for 'llama-3.1-8b' needs 0.3 GiB of memory and 0.1 GiB is available; "
                       "trying remote:gpu"]
    # a remote nobody listens at (probed for real: connection refused) -> the local model after it
    notices.clear()
    assert resolve_target("big-model", config=config, notify=notices.append) == Path(gemma_path)
    assert notices == [f"note: remote:laptop for 'big-model' is unreachable (connection refused); trying {gemma_path}"]
    # a local name that is not on this machine is passed over for the next target
    config.routes[0] = type(config.routes[0])("llama-3.1-8b", ("no-such-local-model", "remote:gpu"))
    notices.clear()
    assert resolve_target("llama-3.1-8b", config=config, notify=notices.append) == config.remotes["gpu"]
    assert notices == ["note: no-such-local-model for 'llama-3.1-8b' is not on this machine; trying remote:gpu"]
    # names no route matches, and paths, resolve as before
    assert resolve_target(gemma_path, config=config) == Path(gemma_path)
    assert resolve_target("remote:gpu", config=config) == config.remotes["gpu"]


def test_list_shows_remote_models_beside_local_ones(tmp_path, gemma_path):
    env = {**os.environ, "LOCALLLM_CONFIG": str(write_config(tmp_path, gemma_path))}
    listed = subprocess.run([sys.executable, "-m", "localllm.cli.app", "list"], capture_output=True, text=True, env=env,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "QUANT", "ARCH", "MODIFIED"]
    assert any(line.startswith("gemma-3-270m (default)") for line in lines)
    assert [line.split()[:3] for line in lines if "(remote)" in line] == [
        ["remote:gpu", "(remote)", "http://gpu-box:8000/v1"], ["remote:laptop", "(remote)", "http://127.0.0.1:1/v1"],
        ["big-*", "(remote)", "http://127.0.0.1:1/v1"]]
    as_json = subprocess.run([sys.executable, "-m", "localllm.cli.app", "list", "--json"], capture_output=True, text=True,
                             env=env, timeout=60)
    remotes = [m for m in json.loads(as_json.stdout) if m.get("remote")]
    assert remotes[0] == {"name": "remote:gpu", "remote": True, "url": "http://gpu-box:8000/v1",
                          "model": "meta-llama/Llama-3.1-8B-Instruct", "engine": "vllm"}
    assert remotes[2]["route"] == ["remote:laptop", gemma_path]


def test_run_follows_a_route_past_an_unreachable_remote_with_a_one_line_notice(tmp_path, gemma_path):
    port = free_port()
    env = {**os.environ, "LOCALLLM_CONFIG": str(write_config(tmp_path, gemma_path, port=port))}
    routed = subprocess.run([sys.executable, "-m", "localllm.cli.app", "run", "big-model", "The capital of France is",
                             "-n", "6", "--temperature", "0"], capture_output=True, text=True, env=env, timeout=120)
    local = subprocess.run([sys.executable, "-m", "localllm.cli.app", "run", gemma_path, "The capital of France is",
                            "-n", "6", "--temperature", "0"], capture_output=True, text=True, env=env, timeout=120)
    assert routed.returncode == 0 and local.returncode == 0, routed.stderr
    assert routed.stdout == local.stdout and routed.stdout.strip()  # the local model answered
    assert routed.stderr == (f"note: remote:laptop for 'big-model' is unreachable (connection refused); "
                             f"trying {gemma_path}\n")
