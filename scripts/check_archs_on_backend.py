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

from test_llamacpp_archs import CLEAR_MARGIN, FLOAT_RTOL, QUANT_RTOL  # noqa: E402  (the CPU test's tolerances)
from tiny_models import ORACLE_PROMPTS, ORACLE_TYPES, file_sha256, oracle_model  # noqa: E402


def main() -> int:
    import localllm
    from localllm.model.archs import ARCHITECTURES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cuda")
    args = parser.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for arch in sorted(ARCHITECTURES):
            recorded = np.load(ROOT / "tests" / "data" / "llamacpp_archs" / f"{arch}.npz")
            for qtype in ORACLE_TYPES:
                path = oracle_model(Path(tmp), arch, qtype)
                if file_sha256(path) != str(recorded[f"sha256_{qtype}"]):
                    print(f"{arch} {qtype}: the tiny model is not the file llama.cpp saw")
                    failures += 1
                    continue
                model = localllm.load(str(path), n_ctx=64, threads=2, backend=args.backend)
                ours = np.concatenate([model.logits(p) for p in ORACLE_PROMPTS])
                ref = recorded[f"logits_{qtype}"].astype(np.float32)
                rel = float(np.abs(ours - ref).max() / np.abs(ref).max())
                top2 = np.sort(ref, axis=-1)[:, -2:]
                clear = top2[:, 1] - top2[:, 0] >= CLEAR_MARGIN
                agree = bool((ours.argmax(-1) == ref.argmax(-1))[clear].all())
                ok = agree and rel <= (FLOAT_RTOL if qtype in ("F32", "F16") else QUANT_RTOL)
                failures += not ok
                print(f"{arch:9s} {qtype:7s} max |diff| / max |logit| {rel:.2e}  argmax {'same' if agree else 'DIFFERS'}"
                      f"  {'ok' if ok else 'FAIL'}", flush=True)
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
