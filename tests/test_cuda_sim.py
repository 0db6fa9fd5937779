"""The CUDA backend's conformance checks (tests/cuda_checks.py) run in a child pytest process.

Under numba's CUDA simulator by default: NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first
imported and must not leak into this process, whose CPU kernels JIT normally. With LOCALLLM_CUDA_FULL=1
(a machine with an NVIDIA GPU and `pip install 'localllm[cuda]'`) the child runs on the device at full
size. Either way every check must pass: none is skipped or deselected.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def test_cuda_backend_conformance():
    env = dict(os.environ)
    if env.get("LOCALLLM_CUDA_FULL") == "1":
        env.pop("NUMBA_ENABLE_CUDASIM", None)
    else:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", str(TESTS / "cuda_checks.py")],
        cwd=TESTS, env=env, capture_output=True, text=True, timeout=1800,
    )
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    summary = proc.stdout.strip().splitlines()[-1]
    assert re.search(r"\b\d+ passed\b", summary), report
    assert not re.search(r"skipped|deselected|xfail|xpass|failed|error", summary), summary
