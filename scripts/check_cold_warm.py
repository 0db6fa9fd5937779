"""Do freshly compiled kernels compute what the same kernels loaded from Numba's cache compute?

    python scripts/check_cold_warm.py [MODEL] [-t THREADS] [--steps N]

Runs the same greedy decode (a fixed prompt, then N steps) in three child processes sharing one pair of
empty cache folders (LOCALLLM_KERNEL_DIR, NUMBA_CACHE_DIR): the first compiles every kernel ("cold"),
the next two load them ("warm"). Prints, for cold vs warm and warm vs warm, the first step whose logits
differ and the largest difference. Exit status 1 when they differ.

History (2026-11-23): on Gemma 3 270M cold and warm runs differed (from step 3 at 2 threads, max 2.54
in a logit); a per-op check traced it to the decode attention kernel alone, then compiled with
fast-math (LLVM free to reassociate sums and fuse multiply-adds, and choosing differently in a process
that compiled the kernel than in the cached code). The kernel now computes in a fixed order without
fast-math (now backends/cpu/attention_decode.py, backends/cpu/quant_kernels/lanes.dot_f32_f16_lanes), and cold and warm are identical
(1 thread, 60 steps; 2 threads, 40 steps).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

CHILD = r"""
import sys, numpy as np, localllm
m = localllm.load(sys.argv[2] or None, n_ctx=256, threads=int(sys.argv[3]))
s = m.new_session()
ids = m.tokenize("The history of the Roman empire is long and")
logits = m.decoder.forward(np.array(ids, np.int32), 0, s.cache)
rows = [logits[0].copy()]
token = np.array([int(np.argmax(logits[0]))], np.int32)
for pos in range(len(ids), len(ids) + int(sys.argv[4])):
    logits = m.decoder.forward(token, pos, s.cache)
    rows.append(logits[0].copy())
    token[0] = int(np.argmax(logits[0]))
np.save(sys.argv[1], np.array(rows))
"""


def compare(a: np.ndarray, b: np.ndarray) -> tuple:
    diff = np.abs(a - b).max(axis=1)
    return (int(np.argmax(diff > 0)) if (diff > 0).any() else None), float(diff.max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="")
    parser.add_argument("-t", "--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, LOCALLLM_KERNEL_DIR=os.path.join(tmp, "kernels"), NUMBA_CACHE_DIR=os.path.join(tmp, "numba"))
        runs = []
        for label in ("cold", "warm", "warm2"):
            out = os.path.join(tmp, f"{label}.npy")
            subprocess.run([sys.executable, "-c", CHILD, out, args.model, str(args.threads), str(args.steps)], env=env, check=True)
            runs.append(np.load(out))
    differs = False
    for name, (a, b) in (("cold vs warm", (runs[0], runs[1])), ("warm vs warm", (runs[1], runs[2]))):
        first, biggest = compare(a, b)
        differs |= first is not None
        print(f"{name}: " + ("identical" if first is None else f"first differing step {first}, max difference {biggest:.4g}"))
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
