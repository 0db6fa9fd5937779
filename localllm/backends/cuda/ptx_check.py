"""Compile the CUDA kernels to PTX without a GPU: `python -m localllm.backends.cuda.ptx_check [SIGNATURES] [--cc 9.0]`.

The simulator runs kernels as Python, so it cannot see what numba-cuda would reject or slow down on a
device (non-constant shared-array shapes, float64 promotion, untyped calls). This compiles, for compute
capability CC (default 9.0, an H100/H200):
  - the matmul kernels of every quant type (made per type by factories), with the types the backend passes;
  - every other kernel with each argument-type signature recorded from real launches under the simulator
    (SIGNATURES, a JSON file written by `scripts/cuda_signatures.py`; `record_launches` is the recorder),
    so that no hand-kept list goes stale as kernels gain arguments. A kernel of kernels.py or matmul.py that
    no recorded launch reached is reported.
It reports float64 instructions in the matvec kernels (there should be none). Needs `pip install
'localllm[cuda]'` (numba-cuda with NVVM from PyPI); no driver or device is needed.
"""

from __future__ import annotations

import atexit
import json
import re
import sys


def describe(value) -> list:
    """A launch argument's numba type as JSON: ["array", dtype, ndim, layout] or [scalar type name]."""
    import numba
    import numpy as np

    array = getattr(value, "_ary", value)  # the simulator's device arrays wrap a NumPy array
    if isinstance(array, np.ndarray):
        kind = numba.typeof(array)
        return ["array", str(kind.dtype), kind.ndim, kind.layout]
    return [str(numba.typeof(value))]


def record_launches(path: str) -> None:
    """Under numba's CUDA simulator: note the argument types of every kernel launch of a module-level
    kernel from now on, and append them to the JSON-lines file `path` when the process exits."""
    from numba.cuda.simulator import kernel

    seen: set = set()
    launch = kernel.FakeCUDAKernel.__call__

    def recording(self, *args):
        if not self._device:
            seen.add(json.dumps({"module": self.fn.__module__, "kernel": self.fn.__name__,
                                 "args": [describe(a) for a in args]}))
        return launch(self, *args)

    def save() -> None:
        with open(path, "a") as out:
            out.writelines(line + "\n" for line in sorted(seen))

    kernel.FakeCUDAKernel.__call__ = recording
    atexit.register(save)


def _numba_type(described: list):
    from numba.core import types as T

    if described[0] == "array":
        return T.Array(getattr(T, described[1]), described[2], described[3])
    return T.boolean if described[0] == "bool" else getattr(T, described[0])


def recorded_jobs(path: str) -> tuple:
    """(jobs, kernels never launched): a job per distinct recorded signature of a module-level kernel."""
    import importlib

    from . import kernels, matmul

    jobs, launched = {}, set()
    with open(path) as lines:
        for line in lines:
            record = json.loads(line)
            kernel = getattr(importlib.import_module(record["module"]), record["kernel"], None)
            if kernel is None or not hasattr(kernel, "py_func"):  # made by a factory: compiled per type below
                continue
            launched.add(record["kernel"])
            signature = tuple(_numba_type(a) for a in record["args"])
            jobs[(record["kernel"], signature)] = (record["kernel"], kernel, signature)
    defined = {name for module in (kernels, matmul) for name, value in vars(module).items()
               if hasattr(value, "py_func") and not getattr(value, "targetoptions", {}).get("device")}
    return list(jobs.values()), sorted(defined - launched)


def main(argv: list[str]) -> int:
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda
    from numba import types as T

    cc_text = argv[argv.index("--cc") + 1] if "--cc" in argv else "9.0"
    paths = [a for i, a in enumerate(argv) if a != "--cc" and (i == 0 or argv[i - 1] != "--cc")]
    cc = tuple(int(p) for p in cc_text.split("."))

    class _Device:  # device functions ask the current device for its compute capability
        compute_capability = cc

    dispatcher.get_current_device = lambda: _Device()
    from . import blocks, matmul

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
    never = []
    if paths:
        recorded, never = recorded_jobs(paths[0])
        jobs += recorded
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
    if never:
        print(f"never launched by the recorded checks (not compiled): {', '.join(never)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
