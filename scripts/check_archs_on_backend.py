"""Every architecture's tiny oracle models (tests/tiny_models.oracle_model) on a backend against llama.cpp's
recorded logits (tests/data/llamacpp_archs), with tests/model/test_llamacpp_archs.py's tolerances: the
same check the CPU gets in CI, for a backend CI cannot run (CUDA needs a GPU).

A quantized file further from llama.cpp than the tolerance is also measured against the float64 NumPy
reference (tests/reference_forward.py), and passes ("ok by f64") when the backend is no further from it than
llama.cpp is: llama.cpp (and the CPU backend, which follows it) round every activation to 8 bits before a
quantized product, where a device backend multiplies the float32 activation, so on a tiny random model
llama.cpp itself can be the further of the two from the exact result.

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

from test_llamacpp_archs import (FLOAT_RTOL, MAX_UNCLEAR_ROUTES, QUANT_RTOL, compare_logits,  # noqa: E402  (the CPU test's)
                                 routed_rows)
from tiny_models import ORACLE_PROMPTS, TINY_ARCHS, file_sha256, oracle_model, oracle_types  # noqa: E402


def float64_distances(model, path, recorded, arch: str, qtype: str) -> tuple:
    """(the backend's, llama.cpp's) largest |difference| from the float64 reference over its largest |logit|,
    on the rows compare_logits compares."""
    import reference_forward

    from localllm.gguf import GGUFReader

    with GGUFReader(path) as reader:
        exact = np.concatenate([reference_forward.forward(reader, p) for p in ORACLE_PROMPTS])
    rows = routed_rows(model, arch, qtype, len(exact))
    ours = np.concatenate([model.logits(p) for p in ORACLE_PROMPTS])[rows]
    theirs, exact = recorded[f"logits_{qtype}"][rows].astype(np.float64), exact[rows]
    scale = np.abs(exact).max()
    return float(np.abs(ours - exact).max() / scale), float(np.abs(theirs - exact).max() / scale)


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
                floats = qtype in ("F32", "F16")
                ok = agree and compared >= 1.0 - MAX_UNCLEAR_ROUTES and rel <= (FLOAT_RTOL if floats else QUANT_RTOL)
                verdict, exact = "ok" if ok else "FAIL", ""
                if not ok and agree and not floats and compared >= 1.0 - MAX_UNCLEAR_ROUTES:
                    ours_f64, theirs_f64 = float64_distances(model, path, recorded, arch, qtype)
                    ok = ours_f64 <= theirs_f64
                    verdict = "ok by f64" if ok else "FAIL"
                    exact = f"  from float64: ours {ours_f64:.2e}, llama.cpp's {theirs_f64:.2e}"
                failures += not ok
                print(f"{arch:9s} {qtype:9s} max |diff| / max |logit| {rel:.2e}  argmax {'same' if agree else 'DIFFERS'}"
                      f"  rows {compared:.0%}  {verdict}{exact}", flush=True)
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
