#!/usr/bin/env python3
"""This machine's sustainable memory read bandwidth, and the decode speed bound it sets for a model.

Decode reads every weight once per token (the embedding table only one row, unless it doubles as the
output matrix; a mixture of experts only its active experts), so bytes-per-token / bandwidth is a floor
on the time per token: no engine decodes faster.

    python scripts/membw.py                      # bandwidth at 1 thread and at every core count
    python scripts/membw.py MODEL.gguf [...]     # plus each model's bytes per token and tok/s bound
    python scripts/membw.py --json

Bandwidth is measured with a Numba reduction (a fast-math float32 sum, which LLVM vectorises with several
accumulators, so the loop is bound by loads, not adds; a 64-bit integer sum measured only half the rate)
over a buffer far larger than the caches, `--repeat` times, median. Each thread reads one sequential run of
the buffer, and one run a core stops short of what the memory gives several runs read side by side (on a
Zen 4: ~38 GB/s on two threads against 55-65 for four runs a thread, docs/performance.md, twenty-ninth
session), so the bound printed is the one-run speed, not a ceiling on decode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numba
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


@numba.njit(cache=True, nogil=True, fastmath=True)
def _sum_range(values, start, stop):
    # Sliced first: indexing values[i] for i from a runtime `start` keeps Numba's negative-index
    # wraparound check in the loop, which blocks vectorisation (8.8 GB/s against 23, measured).
    part = values[start:stop]
    acc = np.float32(0.0)
    for i in range(part.shape[0]):
        acc += part[i]
    return acc


def _parallel_sum(values, n_chunks, pool):
    """Sum contiguous ranges of values on n_chunks threads (the kernel releases the GIL). Plain threads
    rather than a prange, so the measured loop is exactly the one above."""
    step = (values.shape[0] + n_chunks - 1) // n_chunks
    parts = [pool.submit(_sum_range, values, c * step, min((c + 1) * step, values.shape[0])) for c in range(n_chunks)]
    return sum(p.result() for p in parts)


def read_bandwidth(threads: int, size_bytes: int, repeat: int) -> list[float]:
    """GB/s (1e9 bytes/s) reading `size_bytes` with `threads` threads, one figure per repetition."""
    from concurrent.futures import ThreadPoolExecutor

    words = np.ones(size_bytes // 4, dtype=np.float32)
    figures = []
    with ThreadPoolExecutor(threads) as pool:
        _parallel_sum(words[:1024], threads, pool)  # compile outside the timing
        for _ in range(repeat):
            t0 = time.perf_counter()
            _parallel_sum(words, threads, pool)
            figures.append(size_bytes / (time.perf_counter() - t0) / 1e9)
    return figures


def bytes_per_token(path: str) -> dict:
    """Weight bytes one decode step reads (model/info.bytes_per_token: every tensor, the embedding table
    one row unless tied, a mixture of experts its used experts' share)."""
    from localllm.gguf import GGUFReader
    from localllm.model.info import bytes_per_token as read_per_token

    with GGUFReader(path) as r:
        return {"model": os.path.basename(path), "bytes_per_token": read_per_token(r)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="GGUF files (use 'default' for the built-in Gemma 3 270M)")
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1 and all cores)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    cores = numba.config.NUMBA_NUM_THREADS
    counts = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, cores})
    bandwidth = {}
    for t in counts:
        figures = read_bandwidth(t, args.size_mb * 2**20, args.repeat)
        bandwidth[t] = {"median_gbs": statistics.median(figures), "max_gbs": max(figures)}

    models = []
    for m in args.models:
        if m == "default":
            from localllm.hub.default_model import default_model_path

            m = str(default_model_path())
        entry = bytes_per_token(m)
        entry["bound_tok_s"] = {t: bw["median_gbs"] * 1e9 / entry["bytes_per_token"] for t, bw in bandwidth.items()}
        models.append(entry)

    if args.json:
        print(json.dumps({"bandwidth": bandwidth, "models": models}, indent=2))
        return
    for t, bw in bandwidth.items():
        print(f"read bandwidth, {t} thread(s): {bw['median_gbs']:.1f} GB/s median (max {bw['max_gbs']:.1f})")
    for entry in models:
        bounds = ", ".join(f"{t} thr {v:.0f} tok/s" for t, v in entry["bound_tok_s"].items())
        print(f"{entry['model']}: {entry['bytes_per_token'] / 1e6:.1f} MB per token -> decode bound {bounds}")


if __name__ == "__main__":
    main()
