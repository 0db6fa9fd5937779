#!/usr/bin/env python3
"""Q4_K products in the float order of llama.cpp's repacked kernels, and what that does to the KL bar.

    python scripts/q4k_repacked_order.py [--ggml-lib DIR] [--spread [kl_spread.py options]]

On x86 with AVX2, llama.cpp repacks Q4_K matrices at load (rows a multiple of 8) and multiplies them with
`ggml_gemv_q4_K_8x8_q8_K` / `ggml_gemm_q4_K_8x8_q8_K`; that is the path that made the Gemma reference
logits. Per output element both keep two float sums over the super-blocks,
S = fma(float(sum_k scale_k <q_k, a_k>), d * d_a, S) and M = fma(float(sum_k min_k bsum_k), dmin * d_a, M),
and return S - M. localllm's kernels fold each block into one sum instead
(fma(d_a, fma(d, scaled, -(dmin * mins)), acc): backends/cpu/quant_kernels/q4_k.accumulate).

This script swaps every Q4_K matrix product of the engine (decode and prefill) for a plain Numba kernel
in the repacked order, then:
- with --ggml-lib (the folder of llama.cpp's libggml-cpu.so, built as scripts/bench_vs_llamacpp.py
  says): checks that kernel against `ggml_gemv_q4_K_8x8_q8_K` itself, bit for bit, on random rows
  (and counts how often localllm's own order gives the same bits);
- prints KL(llama.cpp || ours) at the last position of the three reference prompts
  (../shared/reference/gemma-3-270m, the bar of tests/model/test_gemma_reference.py), both orders;
- with --spread, runs scripts/kl_spread.py (its options follow) with the swapped kernel: the
  "localllm" rows are then the repacked order.
A measurement for the accuracy bar (docs/accuracy.md), not engine code: it is slow (one row at a time).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import localllm  # noqa: E402
import localllm.backends.cpu  # noqa: E402
from localllm.quant import q4_k  # noqa: E402
from localllm.quant.activation import QuantizedActivation  # noqa: E402
from localllm.backends.cpu.quant_kernels import q4_k as q4_k_kernels  # noqa: E402
from localllm.jit import read_f16  # noqa: E402

REFERENCE = ROOT.parent / "shared" / "reference" / "gemma-3-270m"


@intrinsic
def _fma(typingctx, a, b, c):
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32")
        return builder.call(fn, list(args))

    return sig, codegen


@numba.njit(parallel=True)
def repacked_order_rows(weights, out, qs, d, s):
    """out[t, r] = <weight row r, activation row t> in the repacked kernels' order (see the docstring)."""
    n_blocks = qs.shape[1] // q4_k.BLOCK
    for r in prange(weights.shape[0]):
        w = weights[r]
        for t in range(qs.shape[0]):
            scaled_sum = np.float32(0.0)
            mins_sum = np.float32(0.0)
            for b in range(n_blocks):
                base = b * q4_k.BLOCK_BYTES
                scaled, mins = q4_k_kernels.block_sums(w, base, qs[t], b * q4_k.BLOCK, s[t], b * (q4_k.BLOCK // 16))
                scaled_sum = _fma(np.float32(scaled), read_f16(w, base) * d[t, b], scaled_sum)
                mins_sum = _fma(np.float32(mins), read_f16(w, base + 2) * d[t, b], mins_sum)
            out[t, r] = scaled_sum - mins_sum


def install() -> None:
    """Route every Q4_K matrix product of the CPU backend through repacked_order_rows."""
    matmul_module = sys.modules["localllm.backends.cpu.matmul"]
    backend_module = sys.modules["localllm.backends.cpu.backend"]
    general_rows, general_matmul_rows = matmul_module._integer_rows, matmul_module.matmul_rows

    def integer_rows(qt, weights, x, out, scratch):
        if qt.name != "Q4_K":
            return general_rows(qt, weights, x, out, scratch)
        act = scratch.batch_activation(qt.act, x.shape[0], x.shape[1])
        repacked_order_rows(weights, out, *act.quantize(x))

    def matmul_rows(qt, weights, x, out, scratch):
        if qt.name != "Q4_K":
            return general_matmul_rows(qt, weights, x, out, scratch)
        integer_rows(qt, weights, x, out, scratch)

    matmul_module._integer_rows = integer_rows
    matmul_module.matmul_rows = backend_module.matmul_rows = matmul_rows
    backend_module.CPUBackend._matvec = lambda self, w, x, out: (
        integer_rows(q4_k.QUANT, w.data, x, out, self.scratch) if w.qtype == "Q4_K" else _general_matvec(self, w, x, out)
    )


_general_matvec = sys.modules["localllm.backends.cpu.backend"].CPUBackend._matvec


def _repack8(rows: np.ndarray) -> np.ndarray:
    """Eight Q4_K rows -> llama.cpp's block_q4_Kx8 stream (d[8], dmin[8], scales[96], qs[1024] per block):
    quants interleaved 8 bytes per row, each sub-block's 8 scales and 8 mins re-packed into 12 bytes."""
    out = []
    for x in range(rows.shape[1] // q4_k.BLOCK_BYTES):
        blk = rows[:, x * 144 : (x + 1) * 144]
        sc, qs = blk[:, 4:16].astype(np.int32), blk[:, 16:]
        scales = np.zeros(96, np.int32)
        for i in range(4):
            for j, (s, m) in enumerate(
                (
                    (sc[:, i] & 63, sc[:, i + 4] & 63),
                    (((sc[:, i] & 192) >> 2) | (sc[:, i + 8] & 15), ((sc[:, i + 4] & 192) >> 2) | ((sc[:, i + 8] & 240) >> 4)),
                )
            ):
                o = i * 12 + 48 * j
                scales[o : o + 4] = (s[:4] & 63) + ((s[4:] & 48) << 2)
                scales[o + 4 : o + 8] = (m[:4] & 63) + ((m[4:] & 48) << 2)
                scales[o + 8 : o + 12] = (s[4:] & 15) + ((m[4:] & 15) << 4)
        interleaved = qs.reshape(8, 16, 8).transpose(1, 0, 2).reshape(-1)
        out.append(np.concatenate([blk[:, 0:2].reshape(-1), blk[:, 2:4].reshape(-1), scales.astype(np.uint8), interleaved]))
    return np.concatenate(out)


def check_against_ggml(lib_dir: str, trials: int = 20, n_rows: int = 64, k: int = 2048) -> None:
    lib = ctypes.CDLL(str(Path(lib_dir) / "libggml-cpu.so"))
    p = ctypes.c_void_p
    lib.ggml_gemv_q4_K_8x8_q8_K.argtypes = [ctypes.c_int, p, ctypes.c_size_t, p, p, ctypes.c_int, ctypes.c_int]
    lib.quantize_row_q8_K.argtypes = [p, p, ctypes.c_int64]
    rng = np.random.default_rng(0)
    repacked_same = main_same = 0
    for _ in range(trials):
        weights = q4_k.quantize((rng.standard_normal((n_rows, k)) * rng.uniform(0.01, 0.2, (n_rows, 1))).astype(np.float32))
        weights = weights.reshape(n_rows, -1)
        x = (rng.standard_normal(k) * rng.uniform(0.1, 5)).astype(np.float32)
        theirs_act = np.empty(k // 256 * 292, np.uint8)
        lib.quantize_row_q8_K(x.ctypes.data, theirs_act.ctypes.data, k)
        theirs = np.empty(n_rows, np.float32)
        for g in range(0, n_rows, 8):
            packed = _repack8(weights[g : g + 8])
            lib.ggml_gemv_q4_K_8x8_q8_K(k, theirs[g:].ctypes.data, n_rows, packed.ctypes.data, theirs_act.ctypes.data, 1, 8)
        qs, d, s = QuantizedActivation("q8_k", k).quantize(x)
        assert np.array_equal(theirs_act.reshape(-1, 292)[:, 4:260].view(np.int8).reshape(-1), qs), "q8_K activations differ"
        ours = np.empty((1, n_rows), np.float32)
        repacked_order_rows(weights, ours, qs[None], d[None], s[None])
        main = np.array([q4_k_kernels.vec_dot(weights[r], qs, d, s) for r in range(n_rows)], np.float32)
        repacked_same += int((ours[0].view(np.int32) == theirs.view(np.int32)).sum())
        main_same += int((main.view(np.int32) == theirs.view(np.int32)).sum())
    total = trials * n_rows
    print(f"against ggml_gemv_q4_K_8x8_q8_K, {total} dot products of {k}: repacked order equal in {repacked_same}, "
          f"localllm's order in {main_same}")


def reference_kl() -> None:
    ref = json.loads((REFERENCE / "reference.json").read_text())
    model = localllm.load(n_ctx=1024)
    for name, case in sorted(ref["prompts"].items()):
        theirs = np.load(REFERENCE / case["last_logits_file"]).astype(np.float64)
        ours = model.logits(case["prompt_ids"])[-1].astype(np.float64)
        p, q = theirs - theirs.max(), ours - ours.max()
        p, q = p - np.log(np.exp(p).sum()), q - np.log(np.exp(q).sum())
        print(f"  {name}: KL {float(np.sum(np.exp(p) * (p - q))):.5f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ggml-lib", help="folder of llama.cpp's libggml-cpu.so, for the bit-for-bit check")
    parser.add_argument("--spread", nargs=argparse.REMAINDER, help="run scripts/kl_spread.py with these options")
    args = parser.parse_args()
    if args.ggml_lib:
        check_against_ggml(args.ggml_lib)
    print("KL(llama.cpp || localllm) at the last prompt position, localllm's Q4_K order:")
    reference_kl()
    install()
    print("the same, Q4_K in the repacked kernels' order:")
    reference_kl()
    if args.spread is not None:
        import kl_spread

        sys.argv = ["kl_spread.py", *args.spread]
        return kl_spread.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
