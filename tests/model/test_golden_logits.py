"""Same bits: Gemma 3 270M's logits on the reference prompts equal, bit for bit, those recorded from `main`
before the restructure of the kernels (issue 27), by `scripts/golden_logits.py --write` (its docstring
says which rows: the prefill's last position, eight decode steps, the same eight tokens as one batch).

A change to any kernel, layout or dispatch that moves one float of one row fails here; a deliberate
numeric change re-records the file with the script (and says why in its commit)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden" / "gemma_logits.json"


def _script():
    spec = importlib.util.spec_from_file_location("golden_logits", ROOT / "scripts" / "golden_logits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gemma_logits_are_the_recorded_bits():
    script = _script()
    recorded = json.loads(GOLDEN.read_text())
    key = script.record_key()  # vector target and CPU vendor (the script says why both)
    assert key in recorded, f"no fingerprint recorded for a {key} target: run scripts/golden_logits.py --write"
    expected = recorded[key]
    now = script.fingerprint(threads=2)
    assert sorted(now) == sorted(expected)
    for name, rows in expected.items():
        changed = [i for i, (want, got) in enumerate(zip(rows, now[name])) if want["sha256"] != got["sha256"]]
        assert len(now[name]) == len(rows)
        assert not changed, f"{name}: rows {changed} changed (top-5 then/now: " + "; ".join(
            f"{rows[i]['top5']}/{now[name][i]['top5']}" for i in changed) + ")"
