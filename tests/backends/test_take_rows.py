"""Backend.take_rows (the row gather of the batched forward): the host default is np.take, which the CPU
backend inherits; the CUDA backend's kernel, and the batching engine on the CUDA backend, are checked in
a child process under numba's CUDA simulator (tests/backends/cuda/cuda_engine_checks.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from localllm.backends import create_backend
from localllm.backends.base import Backend

CUDA_TESTS = Path(__file__).parent / "cuda"


def test_the_cpu_backend_takes_rows_as_np_take():
    cpu = create_backend("cpu", 1)
    assert type(cpu).take_rows is Backend.take_rows  # the host default, inherited unchanged
    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, (9, 5)).astype(np.float32)
    rows = np.array([8, 0, 4, 4], dtype=np.int32)
    out = cpu.alloc((6, 5))
    cpu.take_rows(x, rows, out[:4])
    np.testing.assert_array_equal(out[:4], np.take(x, rows, axis=0))
    assert not out[4:].any()  # only the caller's rows are written


def test_take_rows_and_the_batching_engine_under_the_cuda_simulator():
    env = dict(os.environ)
    if env.get("LOCALLLM_CUDA_FULL") == "1":
        env.pop("NUMBA_ENABLE_CUDASIM", None)
    else:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", str(CUDA_TESTS / "cuda_engine_checks.py")],
        cwd=CUDA_TESTS, env=env, capture_output=True, text=True, timeout=1800,
    )
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    summary = proc.stdout.strip().splitlines()[-1]
    assert re.search(r"\b2 passed\b", summary), report
    assert not re.search(r"skipped|deselected|xfail|xpass|failed|error", summary), summary
