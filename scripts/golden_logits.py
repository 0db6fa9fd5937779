#!/usr/bin/env python3
"""Write (or check) the bit-exact fingerprint of Gemma 3 270M's logits on the reference prompts.

    python scripts/golden_logits.py --write tests/data/golden/gemma_logits.json   # record today's bits
    python scripts/golden_logits.py --check tests/data/golden/gemma_logits.json   # compare

A restructure of the kernels must not change a single bit of what the model computes. For each of the
three reference prompts (tests/data/reference/gemma-3-270m) this runs, on one model and cache:
- the prompt as one batch (its last position's logits: the prefill path, BLAS attention for p3's 288 rows);
- llama.cpp's first 8 greedy tokens fed back one at a time (the decode path: one-row kernels);
- the same 8 tokens again as one batch of 8 rows, all logits kept (the multi-row kernels);
and records the sha256 of each row's float32 logits (262,144 values), with its top-5 token ids to say
where a changed row went. Rows are grouped under the host's vector instruction set ("avx512_vnni",
"avx2" or "generic") and CPU vendor (record_key): the packed Q4_K layout exists only with AVX-512 VNNI, and
although it is meant to give the same bits, a fingerprint is only ever compared with one taken on the
same kind of target. The AuthenticAMD entries were recorded on Zen 4 and Zen 5 machines (the avx2 one with
NUMBA_CPU_NAME=haswell, as scripts/golden_ops.py's docstring shows), the GenuineIntel ones on 2026-11-26
on an Intel machine with AVX-512 (both targets, the same way). Both AuthenticAMD entries' p3_paragraph rows
were re-recorded on 2026-11-27 on a Zen 4: the prefill softmax's fixed order (commit 7800798, the day the
Intel entries were made) had changed them, and no AMD machine had run this since; the code just before
that commit still gave the old AMD records there, and every other row is unchanged.
Thread counts 1 and 2 are both run and must agree (a row's result does not depend on the split).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "reference" / "gemma-3-270m" / "reference.json"
FORCED = 8


def vector_isa() -> str:
    """The kind of vector target Numba compiles for on this host (its features, as LLVM reports them)."""
    import llvmlite.binding as llvm

    from numba.core import config

    features = config.CPU_FEATURES if config.CPU_FEATURES else llvm.get_host_cpu_features().flatten()
    enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
    if {"avx512vnni", "avx512bw"} <= enabled:
        return "avx512_vnni"
    if "avx2" in enabled:
        return "avx2"
    return "generic"


def cpu_vendor() -> str:
    """The CPU's vendor string ("GenuineIntel", "AuthenticAMD"; "unknown" where /proc/cpuinfo says none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def record_key() -> str:
    """Where this host's fingerprint is recorded: the vector target, then the CPU vendor. The prompt of
    288 tokens (p3, the one whose prefill attention goes through BLAS) came out with other bits on an
    Intel machine than on the AMD ones it was recorded on, with every op of scripts/golden_ops.py equal
    between the two and the difference not in LLVM's tuning (the AMD tuning on the Intel machine gave the
    Intel bits) nor in NumPy's dispatch; so each vendor has its own record."""
    return f"{vector_isa()}/{cpu_vendor()}"


def row_print(row: np.ndarray) -> dict:
    row = np.ascontiguousarray(row, dtype=np.float32)
    return {"sha256": hashlib.sha256(row.tobytes()).hexdigest(), "top5": [int(i) for i in np.argsort(-row, kind="stable")[:5]]}


def fingerprint(threads: int) -> dict:
    """{prompt name: [row prints]} for one model loaded with `threads`."""
    import localllm

    reference = json.loads(REFERENCE.read_text())["prompts"]
    model = localllm.load(n_ctx=1024, threads=threads)
    prints = {}
    for name in sorted(reference):
        case = reference[name]
        prompt = np.array(case["prompt_ids"], dtype=np.int32)
        forced = np.array(case["greedy_ids"][:FORCED], dtype=np.int32)
        decoder = model.decoder
        session = model.new_session()
        rows = [decoder.forward(prompt, 0, session.cache)[-1].copy()]
        pos = len(prompt)
        for token in forced:
            rows.append(decoder.forward(np.array([token], dtype=np.int32), pos, session.cache)[0].copy())
            pos += 1
        batch = model.new_session()
        decoder.forward(prompt, 0, batch.cache)
        rows.extend(decoder.forward(forced, len(prompt), batch.cache, all_logits=True).copy())
        prints[name] = [row_print(r) for r in rows]
    return prints


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path)
    group.add_argument("--check", type=Path)
    args = parser.parse_args()
    one, two = fingerprint(1), fingerprint(2)
    if one != two:
        print("the logits differ between 1 and 2 threads", file=sys.stderr)
        return 1
    isa = record_key()
    if args.write:
        data = json.loads(args.write.read_text()) if args.write.exists() else {}
        data[isa] = two
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote the {isa} fingerprint to {args.write}")
        return 0
    expected = json.loads(args.check.read_text()).get(isa)
    if expected is None:
        print(f"no {isa} fingerprint in {args.check}", file=sys.stderr)
        return 1
    changed = [(name, i) for name in expected for i, (a, b) in enumerate(zip(expected[name], two[name])) if a != b]
    print("identical" if not changed else f"changed rows: {changed}")
    return 0 if not changed else 1


if __name__ == "__main__":
    sys.exit(main())
