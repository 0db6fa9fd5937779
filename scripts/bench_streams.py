#!/usr/bin/env python3
"""Decode's matrix-vector product over a model's own matrix: one row a step against the kernel decode
takes (several rows a part of the matrix apart a step, for the types that have it: Q8_0's large matrices),
in one process. The quantized types only: the float types' products go through their matrix kernel.

    python scripts/bench_streams.py MODEL.gguf [--tensor token_embd.weight] [--rounds 6] [-t 2]

Both read the same array (the model's copy, as decode reads it) with the same activation and give the
same bits (checked first). Rounds alternate the two, each the median of several calls, so that this
machine's drifting memory speed falls on both alike; printed: GB/s of weights a round, and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numba
import numpy as np
from numba import prange

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import localllm  # noqa: E402
from localllm import quant  # noqa: E402
from localllm.backends.cpu.matmul import matrix_kernel, matvec_kernel  # noqa: E402
from localllm.backends.cpu.quant_kernels import kernel_record  # noqa: E402
from localllm.quant.activation import QuantizedActivation  # noqa: E402


def one_row_kernel(vec_dot):
    """matvec with one row a step: each thread streams one sequential run of the matrix."""

    @numba.njit(parallel=True, nogil=True)
    def one_row(weights, out, args):
        for r in prange(weights.shape[0]):
            out[r] = vec_dot(weights[r], *args)

    return lambda weights, out, *args: one_row(weights, out, args)


def rate(kernel, weights, out, args, calls: int) -> float:
    """GB/s of weights, the median of `calls` calls."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        kernel(weights, out, *args)
        times.append(time.perf_counter() - start)
    return weights.nbytes / statistics.median(times) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tensor", default="token_embd.weight")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("-t", "--threads", type=int, default=2)
    opts = parser.parse_args()
    with localllm.load(opts.model, threads=opts.threads) as model:
        weight = model.decoder.w[opts.tensor]
        qt = quant.get(weight.qtype)
        weights = weight.data
        if matrix_kernel(qt, weights) is not None:  # the float types: float_panels' decode, STREAMS panels apart
            print(f"{weight.qtype}'s products go through its matrix kernel (KernelRecord.matrix), not the row kernels compared here",
                  file=sys.stderr)
            return 1
        n_in = weight.shape[0]
        args = QuantizedActivation(qt.act, n_in).quantize(np.random.default_rng(0).normal(0, 1, n_in).astype(np.float32))
        numba.set_num_threads(opts.threads)
        kernels = {"one row a step": one_row_kernel(kernel_record(qt).vec_dot), "decode's kernel": matvec_kernel(qt)}
        outs = {}
        for name, kernel in kernels.items():
            outs[name] = np.full(weights.shape[0], np.nan, dtype=np.float32)
            kernel(weights, outs[name], *args)
        first, second = outs.values()
        if not np.array_equal(first.view(np.uint32), second.view(np.uint32)):
            print("the two kernels disagree", file=sys.stderr)
            return 1
        calls = max(3, int(2e9 // weights.nbytes))
        print(f"{opts.tensor} ({weight.qtype}, {weights.nbytes / 1e6:.0f} MB), {opts.threads} thread(s), {calls} calls a round")
        ratios = []
        for round_ in range(opts.rounds):
            figures = {name: rate(kernel, weights, outs[name], args, calls) for name, kernel in kernels.items()}
            ratios.append(figures["decode's kernel"] / figures["one row a step"])
            print(f"round {round_ + 1}: " + ", ".join(f"{name} {gbs:.1f} GB/s" for name, gbs in figures.items())
                  + f", ratio {ratios[-1]:.2f}")
        print(f"ratio: median {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
