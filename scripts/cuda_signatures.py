"""Record the argument types of every CUDA kernel launch the CUDA tests make, under numba's simulator, for
`python -m localllm.backends.cuda.ptx_check FILE` to compile each for a real GPU (no GPU needed either way).

    python scripts/cuda_signatures.py /tmp/cuda_signatures.jsonl
    python -m localllm.backends.cuda.ptx_check /tmp/cuda_signatures.jsonl     # with numba-cuda installed

The tests run here: the op conformance suite's CUDA half (in its simulator child, which records when
LOCALLLM_CUDA_SIGNATURES names the file) and tests/backends/cuda's checks in this process (every
architecture kind they load, prompts and decode steps, the batching engine, speculative verification,
encoders). A launch's types are what numba-cuda's dispatcher types its arguments as (a Python float is
float64, an int int64), so the PTX compiled from them is what a GPU run compiles.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


CHECKS = """
import sys
from localllm.backends.cuda.ptx_check import record_launches
record_launches(sys.argv[1])
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[2:]]))
"""


def main(argv: list) -> int:
    if len(argv) != 1:
        print("usage: python scripts/cuda_signatures.py OUT.jsonl", file=sys.stderr)
        return 2
    out = Path(argv[0]).resolve()
    out.unlink(missing_ok=True)
    tests = ROOT / "tests" / "backends"
    runs = [
        # the conformance suite starts its simulator child itself (which records when the variable is set)
        ([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests / "test_conformance.py"), "-k", "cuda"],
         {"LOCALLLM_CUDA_SIGNATURES": str(out)}),
        ([sys.executable, "-c", CHECKS, str(out), *(str(tests / "cuda" / f) for f in
                                                      ("cuda_checks.py", "cuda_engine_checks.py", "cuda_embed_checks.py"))],
         {"NUMBA_ENABLE_CUDASIM": "1"}),
    ]
    for command, env in runs:
        if subprocess.run(command, cwd=ROOT, env={**os.environ, **env}).returncode != 0:
            print("a CUDA test failed: the signatures are incomplete", file=sys.stderr)
            return 1
    print(f"launch signatures -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
