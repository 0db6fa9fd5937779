"""The CUDA backend's checks beyond op conformance (tests/backends/cuda/cuda_checks.py: upload of a type without a device
kernel, embed's range check, whole models against the CPU backend) run in a child pytest process; the ops
themselves are in tests/backends/test_conformance.py, which runs the CUDA backend in a child process too.

Under numba's CUDA simulator by default: NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first
imported and must not leak into this process, whose CPU kernels JIT normally. With LOCALLLM_CUDA_FULL=1
(a machine with an NVIDIA GPU and `pip install 'localllm[cuda]'`) the child runs on the device at full
size. Either way every check must pass: none is skipped or deselected.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def run_under_simulator(checks: str) -> str:
    """Run tests/backends/cuda/<checks> in a child pytest: under numba's CUDA simulator, or on the device
    with LOCALLLM_CUDA_FULL=1. Returns the child's summary line, after asserting it ran clean."""
    env = dict(os.environ)
    if env.get("LOCALLLM_CUDA_FULL") == "1":
        env.pop("NUMBA_ENABLE_CUDASIM", None)
    else:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", str(TESTS / checks)],
        cwd=TESTS, env=env, capture_output=True, text=True, timeout=1800,
    )
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    summary = proc.stdout.strip().splitlines()[-1]
    assert not re.search(r"skipped|deselected|xfail|xpass|failed|error", summary), summary
    return summary


def test_cuda_backend_checks():
    assert re.search(r"\b\d+ passed\b", run_under_simulator("cuda_checks.py"))


def test_take_rows_and_the_batching_engine_under_the_cuda_simulator():
    # cuda_engine_checks.py: the take_rows kernel against np.take, and the batching engine on the CUDA
    # backend giving two batched requests what generate gives each alone, and speculative decoding's
    # verified rows equal to the decode steps
    assert re.search(r"\b3 passed\b", run_under_simulator("cuda_engine_checks.py"))


def test_encoders_under_the_cuda_simulator():
    # cuda_embed_checks.py: BERT and nomic-bert's hidden states and Model.embed on the CUDA backend as on the CPU
    assert re.search(r"\b2 passed\b", run_under_simulator("cuda_embed_checks.py"))


# ----- selecting the backend from the CLI (this process: no simulator) ---------------------------------------


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("cuda-cli") / "tiny.gguf", "llama", "Q8_0", seed=4)


def run_cli(capsys, *args):
    from localllm.cli.app import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_backend_cuda_without_a_device_is_one_line(capsys, tiny_llama, monkeypatch):
    """Without numba-cuda: 'install localllm[cuda]'; with it but no GPU: 'no CUDA device'. Exit 1."""
    import importlib.util

    from localllm.backends.cuda import device_available

    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    code, out, err = run_cli(capsys, "run", tiny_llama, "ab", "-n", "1", "--backend", "cuda")
    if device_available():  # a GPU machine: the same command simply works
        assert code == 0, err
        return
    assert code == 1 and err.count("\n") == 1 and err.startswith("error: "), err
    if importlib.util.find_spec("numba_cuda") is None:
        assert "pip install 'localllm[cuda]'" in err
    else:
        assert "no CUDA device" in err


def test_backend_auto_falls_back_to_cpu(capsys, tiny_llama, monkeypatch):
    from localllm.backends import resolve_backend_name
    from localllm.backends.cuda import device_available

    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    assert resolve_backend_name("auto") == ("cuda" if device_available() else "cpu")
    code, out, err = run_cli(capsys, "run", tiny_llama, "ab", "-n", "2", "--temperature", "0", "--backend", "auto", "--json")
    assert code == 0, err
    assert len(json.loads(out)["tokens"]) == 2


def test_unknown_backend_is_a_usage_error(capsys, tiny_llama):
    code, out, err = run_cli(capsys, "run", tiny_llama, "ab", "--backend", "tpu")
    assert code == 2 and "--backend must be one of auto, cpu, cuda" in err


def test_serve_refuses_the_cuda_backend(capsys):
    code, out, err = run_cli(capsys, "serve", "--backend", "cuda")
    assert code == 1 and "serve does not support --backend cuda" in err and err.count("\n") == 1
