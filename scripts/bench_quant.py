#!/usr/bin/env python3
"""Single-thread throughput of every quant type's kernels, in GB/s of weight bytes read.

    python scripts/bench_quant.py                    # every type that imports
    python scripts/bench_quant.py Q4_0 Q8_0 --mb 32  # a few types, a smaller matrix
    python scripts/bench_quant.py --json             # machine-readable, one object per type

For each type a weight matrix of about `--mb` MB (K = `--cols` inputs per row) is built, far larger than
the caches so that the figures include reading the weights from memory, as decode does:
- dequantize: the Numba `dequantize_row` over every row, through the same tile driver prefill uses
  (localllm.backends.cpu.matmul.dequant_rows_kernel), into a reused float32 tile;
- vec_dot: one matrix-vector product through matvec_kernel (what decode runs per token), with the
  activation quantized to the type's pairing format beforehand (quantizing it is not timed: it is done
  once per matmul and costs K elements, not N*K).
- rows (with --rows T > 1): the batched matvec (matvec_rows, the server's batched decode) with T activation
  rows, reported as weight GB/s and as its time over the one-row vec_dot's ("xT": 1.0 would mean the T
  rows cost no more than one);
Both run with numba.set_num_threads(--threads) (1 by default: per-core speed, free of scheduling noise).
Each figure is the median of `--repeat` runs, after one untimed run that compiles (or loads) the kernel
and touches every page of the output buffers.
A type whose module fails to import is reported as such and skipped, so the script works mid-development.
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

from localllm import quant
from localllm.backends.cpu.drivers import row_drivers
from localllm.backends.cpu.matmul import TILE_ROWS, BatchActivation, dequant_rows_kernel, matvec_kernel
from localllm.quant.activation import QuantizedActivation

# Seed rows are quantized once and tiled to the full matrix: the reference quantizers of the K types are
# slow NumPy code, and repeated content does not change the memory traffic of a matrix this large.
SEED_ROWS = 64

# Types with no quantizer get random bytes; their float16 scale fields (byte offset, width) are set to a
# finite value so no NaN/inf enters the arithmetic.
SCALE_FIELDS_WITHOUT_QUANTIZER = {"IQ4_NL": [(0, 2)], "IQ4_XS": [(0, 2)]}


def weight_matrix(qt, n_cols: int, target_bytes: int, rng) -> np.ndarray:
    """uint8[N, row_bytes] holding about target_bytes of valid random weights of type qt."""
    row_bytes = qt.row_bytes(n_cols)
    if qt.quantize is not None:
        seed = qt.quantize(rng.normal(0.0, 0.05, (SEED_ROWS, n_cols)).astype(np.float32))
    else:
        n_blocks = SEED_ROWS * n_cols // qt.block_size
        blocks = rng.integers(0, 256, (n_blocks, qt.type_size), dtype=np.uint8)
        for offset, width in SCALE_FIELDS_WITHOUT_QUANTIZER.get(qt.name, []):
            blocks[:, offset : offset + width] = np.array([0.01], dtype=np.float16).view(np.uint8)[None, :width]
        seed = blocks.reshape(SEED_ROWS, row_bytes)
    n_rows = max(SEED_ROWS, target_bytes // row_bytes // SEED_ROWS * SEED_ROWS)
    return np.ascontiguousarray(np.tile(seed, (n_rows // SEED_ROWS, 1)))


def median_seconds(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_dequantize(qt, weights: np.ndarray, n_cols: int, repeat: int) -> float:
    """Seconds to dequantize every row of `weights`, tile by tile (median)."""
    kernel = dequant_rows_kernel(qt)
    tile = np.empty((TILE_ROWS, n_cols), dtype=np.float32)

    def run():
        for start in range(0, weights.shape[0], TILE_ROWS):
            rows = min(TILE_ROWS, weights.shape[0] - start)
            kernel(weights, start, tile[:rows])

    run()  # untimed: compiles (or loads) the kernel and faults in the tile's fresh pages
    return median_seconds(run, repeat)


def bench_vec_dot(qt, weights: np.ndarray, n_cols: int, repeat: int, rng) -> float:
    """Seconds for one matvec over every row of `weights` (median)."""
    kernel = matvec_kernel(qt)
    act = QuantizedActivation(qt.act, n_cols).quantize(rng.standard_normal(n_cols).astype(np.float32))
    out = np.empty(weights.shape[0], dtype=np.float32)
    kernel(weights, out, *act)  # untimed: compiles (or loads) the kernel, faults in fresh pages
    return median_seconds(lambda: kernel(weights, out, *act), repeat)


def bench_rows(qt, weights: np.ndarray, n_cols: int, n_rows: int, repeat: int, rng) -> float:
    """Seconds for one batched matvec (matvec_rows) of n_rows activation rows over every row of `weights`."""
    kernel = row_drivers(qt).matvec_rows
    batch = BatchActivation(qt.act, n_rows, n_cols).quantize(rng.standard_normal((n_rows, n_cols)).astype(np.float32))
    out = np.empty((n_rows, weights.shape[0]), dtype=np.float32)
    kernel(weights, out, *batch)  # untimed: compiles (or loads) the kernel, faults in fresh pages
    return median_seconds(lambda: kernel(weights, out, *batch), repeat)


def bench_type(name: str, args, rng) -> dict:
    try:
        qt = quant.get(name)
    except Exception as exc:  # noqa: BLE001 -- a module mid-edit may fail in any way: report it, go on
        return {"type": name, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    weights = weight_matrix(qt, args.cols, int(args.mb * 2**20), rng)
    dequant_s = bench_dequantize(qt, weights, args.cols, args.repeat)
    dot_s = bench_vec_dot(qt, weights, args.cols, args.repeat, rng)
    n_elements = weights.shape[0] * args.cols
    rows = {}
    if args.rows > 1:
        rows_s = bench_rows(qt, weights, args.cols, args.rows, args.repeat, rng)
        rows = {"act_rows": args.rows, "rows_gbps": weights.nbytes / rows_s / 1e9, "rows_over_one": rows_s / dot_s}
    return {
        **rows,
        "type": name,
        "act": qt.act,
        "rows": weights.shape[0],
        "cols": args.cols,
        "weight_bytes": weights.nbytes,
        "bits_per_weight": 8 * weights.nbytes / n_elements,
        "dequantize_gbps": weights.nbytes / dequant_s / 1e9,
        "dequantize_gelem_s": n_elements / dequant_s / 1e9,
        "vec_dot_gbps": weights.nbytes / dot_s / 1e9,
        "vec_dot_gelem_s": n_elements / dot_s / 1e9,
    }


def print_table(results: list[dict], threads: int) -> None:
    print(f"threads={threads}; GB/s of weight bytes read (1e9 B/s), Gelem/s of weights processed; median")
    header = f"{'type':<8}{'act':<6}{'bpw':>6}{'MB':>7}  {'deq GB/s':>9}{'deq Gel/s':>10}  {'dot GB/s':>9}{'dot Gel/s':>10}"
    batched = next((r["act_rows"] for r in results if "act_rows" in r), None)
    if batched:
        header += f"  {f'x{batched} GB/s':>10}{f'x{batched}/x1':>8}"
    print(header)
    print("-" * len(header))
    for r in results:
        if "error" in r:
            print(f"{r['type']:<8}not available: {r['error']}")
            continue
        print(
            f"{r['type']:<8}{r['act']:<6}{r['bits_per_weight']:>6.2f}{r['weight_bytes'] / 2**20:>7.1f}  "
            f"{r['dequantize_gbps']:>9.2f}{r['dequantize_gelem_s']:>10.2f}  "
            f"{r['vec_dot_gbps']:>9.2f}{r['vec_dot_gelem_s']:>10.2f}"
            + (f"  {r['rows_gbps']:>10.4g}{r['rows_over_one']:>8.2f}" if "act_rows" in r else "")
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", help="ggml type names (default: every supported type)")
    parser.add_argument("--mb", type=float, default=64, help="weight matrix size in MiB (default 64)")
    parser.add_argument("--cols", type=int, default=4096, help="inputs per row, a multiple of 256 (default 4096)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per figure (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="Numba threads (default 1)")
    parser.add_argument("--rows", type=int, default=1, help="also time the batched matvec with this many activation rows")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    args = parser.parse_args(argv)
    if args.cols % 256:
        parser.error(f"--cols {args.cols} is not a multiple of 256")
    names = [t.upper() for t in args.types] or quant.supported_names()
    unknown = [t for t in names if t not in quant.supported_names()]
    if unknown:
        parser.error(f"unknown type(s) {', '.join(unknown)} (supported: {', '.join(quant.supported_names())})")
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    results = []
    for name in names:
        results.append(bench_type(name, args, rng))
        if not args.json:
            print(f"  measured {name}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
