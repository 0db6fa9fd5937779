#!/usr/bin/env python3
"""BF16 products on AMX's tile unit (backends/cpu/quant_kernels/amx.py) against float_panels' kernels
(what BF16 takes on CPUs without AMX), kernel by kernel, paired in each round:

    python scripts/bench_amx.py                  # Gemma 3 270M's shapes, 2 threads
    python scripts/bench_amx.py --threads 1 --rounds 20

For each shape (N weight rows x K), decode (T = 1: GB/s of weights streamed; the AMX kernel from the
re-laid copies, as the backend holds a BF16 matrix) and prefill (T = 256: G multiply-adds a second). The
262,144 x 640 matrix (Gemma's tied output, 335 MB) is streamed from memory; the others fit the caches.
Needs a CPU with AMX (and Linux's grant of its tile registers)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numba
import numpy as np

SHAPES = ((262144, 640), (2048, 640), (640, 2048), (1024, 640), (256, 640))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--prompt", type=int, default=256, help="activation rows of the prefill products")
    args = parser.parse_args()

    from localllm import quant
    from localllm.backends.cpu.quant_kernels import amx, float_panels
    from localllm.jit import configure_numba

    configure_numba()
    if not amx.available():
        print("this CPU has no AMX tile unit (or the OS refused it)", file=sys.stderr)
        return 1
    numba.set_num_threads(args.threads)
    bf16 = quant.get("BF16")
    rng = np.random.default_rng(0)
    print(f"{args.threads} thread(s), median of {args.rounds} paired rounds")
    print("| N x K | decode AMX | decode panels | prefill AMX | prefill panels |")
    print("|---|---|---|---|---|")
    for n, k in SHAPES:
        raw = bf16.quantize(rng.normal(0, 1, (n, k)).astype(np.float32)).reshape(n, -1)
        packed = amx.pack(raw)
        panels = float_panels.pack(raw, float_panels.BF16)
        x1 = rng.normal(0, 1, (1, k)).astype(np.float32)
        xp = rng.normal(0, 1, (args.prompt if n * k <= 1 << 24 else 0, k)).astype(np.float32)
        out1 = np.zeros((1, n), np.float32)
        outp = np.zeros((xp.shape[0], n), np.float32)
        runs = {
            "decode_amx": lambda: amx.matmul(raw, x1, out1, args.threads, packed),
            "decode_panels": lambda: float_panels.panels_matmul(raw, panels, x1, out1, float_panels.BF16),
        }
        if xp.shape[0]:
            runs["prefill_amx"] = lambda: amx.matmul(raw, xp, outp, args.threads, packed)
            runs["prefill_panels"] = lambda: float_panels.panels_matmul(raw, panels, xp, outp, float_panels.BF16)
        times = {name: [] for name in runs}
        for run in runs.values():
            run()  # compile
        for _ in range(args.rounds):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        median = {name: statistics.median(t) for name, t in times.items()}
        cells = [f"{raw.nbytes / median[name] / 1e9:.1f} GB/s" for name in ("decode_amx", "decode_panels")]
        for name in ("prefill_amx", "prefill_panels"):
            cells.append(f"{n * k * xp.shape[0] / median[name] / 1e9:.0f} GMAC/s" if name in median else "-")
        print(f"| {n} x {k} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
