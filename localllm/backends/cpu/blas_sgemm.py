"""NumPy's own OpenBLAS `cblas_sgemm`, callable from Numba kernels, parallel ones included.

Prefill attention multiplies through BLAS (attention_blas.py). Calling it from Python threads, as
NumPy's matmul does, puts those threads beside Numba's OpenMP workers, which keep spinning on their
cores for a while after each parallel region (threads.py): a Python thread started right after a
region waited ~0.8 ms for its core. Called from inside a Numba prange loop, the same BLAS function
runs on the OpenMP workers themselves.

The function is found in the OpenBLAS that NumPy loaded (threadpoolctl names its file), by the names
of the 64-bit-integer interface that NumPy's wheels ship (`scipy_cblas_sgemm64_`); its address is a
kernel argument, so the compiled kernels hold no address and Numba can cache them. Where NumPy uses
another BLAS (Accelerate, MKL), `address()` is None and the callers keep NumPy's matmul.

The call is the one NumPy's matmul makes for a C-contiguous A [M, K] times the transpose of a
C-contiguous B [N, K], or times a C-contiguous B [K, N] (row-major, alpha 1, beta 0): the same
kernels on the same operands, so the results are NumPy's bit for bit
(tests/backends/cpu/test_attention_blas.py), except where M or N is 1: NumPy then calls the
matrix-vector product instead (measured: last-bit differences on a one-row block).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import Optional

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's enum values
_NAMES = ("scipy_cblas_sgemm64_", "cblas_sgemm64_")  # the ILP64 interface: 64-bit M, N, K and leading dims


@lru_cache(maxsize=1)
def address() -> Optional[int]:
    """The address of NumPy's OpenBLAS cblas_sgemm (ILP64), or None where there is none to find."""
    try:
        import threadpoolctl

        infos = threadpoolctl.threadpool_info()
    except Exception:  # pragma: no cover - threadpoolctl is a dependency; any failure means "not found"
        return None
    for info in infos:
        if info.get("internal_api") != "openblas":
            continue
        try:
            library = ctypes.CDLL(info["filepath"])
        except OSError:  # pragma: no cover
            continue
        for name in _NAMES:
            function = getattr(library, name, None)
            if function is not None:
                return ctypes.cast(function, ctypes.c_void_p).value
    return None


@intrinsic
def sgemm(typingctx, function, trans_b, m, n, k, a, lda, b, ldb, c, ldc):
    """c[m, n] = a[m, k] @ op(b) through the cblas_sgemm at `function` (an address), row-major, alpha 1,
    beta 0; op(b) is b's transpose when trans_b (b [n, k], leading dimension ldb) else b [k, n]. a, b
    and c are addresses of float32 data (arr.ctypes.data plus a byte offset); lda, ldb and ldc in
    elements. The caller keeps the arrays alive and the shapes within them (no checks here)."""
    sig = types.void(types.intp, types.boolean, types.intp, types.intp, types.intp, types.intp, types.intp,
                     types.intp, types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        function_, trans_b_, m_, n_, k_, a_, lda_, b_, ldb_, c_, ldc_ = args
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        floats = f32.as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, f32, floats, i64, floats, i64, f32, floats, i64])
        callee = builder.inttoptr(function_, fnty.as_pointer())
        trans = builder.select(trans_b_, i32(TRANS), i32(NO_TRANS))
        builder.call(callee, [i32(ROW_MAJOR), i32(NO_TRANS), trans, m_, n_, k_, f32(1.0), builder.inttoptr(a_, floats), lda_,
                              builder.inttoptr(b_, floats), ldb_, f32(0.0), builder.inttoptr(c_, floats), ldc_])
        return context.get_dummy_value()

    return sig, codegen
