"""Compile every CUDA kernel to PTX without a GPU: `python -m localllm.backends.cuda.ptx_check [CC]`.

The simulator runs kernels as Python, so it cannot see what numba-cuda would reject or slow down on a
device (non-constant shared-array shapes, float64 promotion, untyped calls). This compiles each kernel
with the argument types the backend passes, for compute capability CC (default 9.0, an H100), and reports
float64 instructions in the matvec kernels (there should be none). Needs `pip install 'localllm[cuda]'`
(numba-cuda with NVVM from PyPI); no driver or device is needed.
"""

from __future__ import annotations

import re
import sys


def main(argv: list[str]) -> int:
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda
    from numba import types as T

    cc = tuple(int(p) for p in (argv[0] if argv else "9.0").split("."))

    class _Device:  # device functions ask the current device for its compute capability
        compute_capability = cc

    dispatcher.get_current_device = lambda: _Device()
    from . import blocks, kernels, matmul

    def arr(dtype, ndim):
        return T.Array(dtype, ndim, "C")

    f32, u8, u16, i32, i64, flag = T.float32, T.uint8, T.uint16, T.int32, T.int64, T.boolean
    jobs = []
    for qtype, (unit, kind) in blocks.UNIT_DECODERS.items():
        w = arr({"f32": f32, "u16": u16, "u8": u8}[kind], 2)
        jobs += [
            (f"{qtype} matvec", matmul._make_matvec(unit), (w, i64, i64, arr(f32, 2), arr(f32, 2), arr(f32, 1), flag)),
            (f"{qtype} dequant_rows", matmul._make_dequant(unit), (w, i64, i64, i64, arr(f32, 2))),
            (f"{qtype} gather_rows", matmul._make_gather(unit), (w, i64, i64, arr(i32, 1), arr(f32, 2))),
        ]
    jobs += [
        ("gemm_xwt", matmul.gemm_xwt, (arr(f32, 2), arr(f32, 2), arr(f32, 2), i64, arr(f32, 1), flag)),
        ("fill_zero", kernels.fill_zero, (arr(u8, 1),)),
        ("rms_norm", kernels.rms_norm, (arr(f32, 2), arr(f32, 1), f32, arr(f32, 2))),
        ("rope", kernels.rope, (arr(f32, 3), arr(i32, 1), arr(f32, 1), flag)),
        ("kv_store", kernels.kv_store, (arr(u16, 3), arr(f32, 3), arr(i32, 1))),
        ("kv_store_range", kernels.kv_store_range, (arr(u16, 3), arr(f32, 3), i64)),
        ("attention", kernels.attention, (arr(f32, 3), arr(u16, 4), arr(u16, 4), arr(i32, 1), i64, i64, f32, i64, arr(f32, 3), arr(f32, 2))),
        ("attention_paged", kernels.attention_paged, (arr(f32, 3), arr(u16, 4), arr(u16, 4), arr(i32, 2), arr(i32, 1), arr(i32, 1), f32, i64, arr(f32, 3), arr(f32, 2))),
        ("gated_act", kernels.gated_act, (arr(f32, 2), arr(f32, 2), arr(f32, 2), flag)),
        ("add", kernels.add, (arr(f32, 2), arr(f32, 2), arr(f32, 2))),
        ("scale", kernels.scale, (arr(f32, 2), f32, arr(f32, 2))),
    ]
    failed = 0
    for name, kernel, sig in jobs:
        try:
            ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc)
        except Exception as exc:  # report every kernel, not just the first failure
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            continue
        f64 = len(re.findall(r"\.f64\b", ptx))
        note = f", {f64} float64 instructions" if "matvec" in name and f64 else ""
        print(f"ok   {name} ({ptx.count(chr(10))} PTX lines{note})")
    print(f"{len(jobs) - failed}/{len(jobs)} kernels compiled for sm_{cc[0]}{cc[1]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
