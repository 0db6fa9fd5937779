"""Same bits, op by op: every CPU backend op on every quant type (matmul at 1-33 rows in both tiers,
matmul_rows, embed, rms_norm, rope, gated_act, attention, kv_store) equals, bit for bit, what the code
before the restructure of the kernels (issue 27, commit 02d0705) computed, as recorded by
`scripts/golden_ops.py --write` (its docstring lists the entries and the recording commands).

test_golden_logits.py covers one model (Gemma, Q4_K_M); this covers the types and paths it does not
reach (on a cold Numba cache as on a warm one: the Q8_K products once differed between the two, see
the script's docstring). A deliberate numeric change re-records the file with the script (and says why
in its commit)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden" / "ops.json"


def _script():
    spec = importlib.util.spec_from_file_location("golden_ops", ROOT / "scripts" / "golden_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_op_on_every_quant_type_gives_the_recorded_bits():
    script = _script()
    recorded = json.loads(GOLDEN.read_text())
    isa = script.vector_isa()
    assert isa in recorded, f"no fingerprint recorded for a {isa} target: run scripts/golden_ops.py --write"
    expected = recorded[isa]
    now = script.fingerprint()
    differences = script.compare(expected, now)
    assert not differences, f"{len(differences)} of {len(expected)} entries differ: " + "; ".join(differences)
    assert len(now) == len(expected) > 300  # every type's products were recorded and run
