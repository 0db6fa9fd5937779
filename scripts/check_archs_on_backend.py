"""Every architecture's tiny oracle models (tests/tiny_models.oracle_model) on a backend against llama.cpp's
recorded logits (tests/data/llamacpp_archs), with tests/model/test_llamacpp_archs.py's tolerances: the
same check the CPU gets in CI, for a backend CI cannot run (CUDA needs a GPU).

    python scripts/check_archs_on_backend.py --backend cuda
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "model")]

from test_llamacpp_archs import FLOAT_RTOL, MAX_UNCLEAR_ROUTES, QUANT_RTOL, compare_logits  # noqa: E402  (the CPU test's)
from tiny_models import TINY_ARCHS, file_sha256, oracle_model, oracle_types  # noqa: E402


def main() -> int:
    import localllm

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cuda")
    args = parser.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for arch in sorted(TINY_ARCHS):
            recorded = np.load(ROOT / "tests" / "data" / "llamacpp_archs" / f"{arch}.npz")
            for qtype in oracle_types(arch):
                path = oracle_model(Path(tmp), arch, qtype)
                if file_sha256(path) != str(recorded[f"sha256_{qtype}"]):
                    print(f"{arch} {qtype}: the tiny model is not the file llama.cpp saw")
                    failures += 1
                    continue
                model = localllm.load(str(path), n_ctx=64, threads=2, backend=args.backend)
                rel, agree, compared = compare_logits(model, recorded, arch, qtype)
                ok = agree and compared >= 1.0 - MAX_UNCLEAR_ROUTES and rel <= (FLOAT_RTOL if qtype in ("F32", "F16") else QUANT_RTOL)
                failures += not ok
                print(f"{arch:9s} {qtype:9s} max |diff| / max |logit| {rel:.2e}  argmax {'same' if agree else 'DIFFERS'}"
                      f"  rows {compared:.0%}  {'ok' if ok else 'FAIL'}", flush=True)
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
