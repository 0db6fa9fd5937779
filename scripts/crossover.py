"""Prefill matrix products: dequantized tiles + BLAS against the integer multi-row kernels, per row count.

    python scripts/crossover.py [MODEL] [-t THREADS] [--rows 8,16,32,64,128]

For every distinct per-layer weight (type and shape) of the model, times the BLAS path (tiles
dequantized on one Numba thread, OpenBLAS on THREADS, as a prefill runs it) and the integer multi-row
kernels (`matmul_rows`, on THREADS) at each row count T, median of 4 after a warm-up, then the sum over
all layers. The smallest T at which BLAS wins is where `localllm.backends.cpu.matmul.BLAS_MIN_ROWS`
belongs.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import importlib  # noqa: E402

import localllm  # noqa: E402
from localllm import quant  # noqa: E402

cpu_matmul = importlib.import_module("localllm.backends.cpu.matmul")  # the module (the package exports a function of that name)


def median_ms(fn, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:])) * 1e3


def distinct_weights(decoder) -> dict:
    """(label, type, shape) -> [count, weight] over the per-layer matrices."""
    seen = {}
    for name in decoder.w._entries:
        w = decoder.w.get(name)
        if w is None or not hasattr(w, "qtype") or len(w.shape) < 2 or not name.startswith("blk."):
            continue
        label = re.sub(r"^blk\.\d+\.", "", name).removesuffix(".weight")
        seen.setdefault((label, w.qtype, w.shape), [0, w])[0] += 1
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--rows", default="8,16,32,64,128")
    args = parser.parse_args()
    model = localllm.load(args.model, n_ctx=256, threads=args.threads)
    scratch = model.backend.scratch
    rows = [int(x) for x in args.rows.split(",")]
    rng = np.random.default_rng(0)
    totals = {}
    print(f"{model.path.name}, {args.threads} threads; ms per call, BLAS / integer")
    for (label, qtype, shape), (count, w) in distinct_weights(model.decoder).items():
        qt, cells = quant.get(qtype), []
        for t in rows:
            x = rng.standard_normal((t, w.n_in)).astype(np.float32)
            out = np.empty((t, w.n_out), np.float32)
            numba.set_num_threads(1)
            saved, cpu_matmul.BLAS_MIN_ROWS = cpu_matmul.BLAS_MIN_ROWS, 1
            blas = median_ms(lambda: cpu_matmul.matmul(qt, w.data, x, out, scratch))
            cpu_matmul.BLAS_MIN_ROWS = saved
            numba.set_num_threads(args.threads)
            integer = median_ms(lambda: cpu_matmul.matmul_rows(qt, w.data, x, out, scratch))
            totals[t] = [a + count * b for a, b in zip(totals.get(t, [0.0, 0.0]), (blas, integer))]
            cells.append(f"T={t} {blas:.3f}/{integer:.3f}")
        print(f"{label:14s} {qtype:5s} {str(shape):14s} x{count:<3d} " + "  ".join(cells), flush=True)
    for t in rows:
        blas, integer = totals[t]
        print(f"T={t}: all layers BLAS {blas:.1f} ms, integer {integer:.1f} ms")


if __name__ == "__main__":
    main()
