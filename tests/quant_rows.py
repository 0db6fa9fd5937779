"""Random quantized rows for the quant and kernel tests: every block's float fields (scales, mins)
drawn from chosen edge values rather than random bytes, which would be NaN or inf."""

from __future__ import annotations

import numba
import numpy as np

from localllm import quant
from localllm.gguf import GGML_TYPES_BY_NAME

# Byte offsets of the float fields of each block (f16, or f32 for Q8_K): random bytes there would be
# NaN/inf; tests fill them with chosen values instead.
FLOAT_FIELDS = {
    "Q4_0": [(0, 2)], "Q4_1": [(0, 2), (2, 2)], "Q5_0": [(0, 2)], "Q5_1": [(0, 2), (2, 2)], "Q8_0": [(0, 2)],
    "Q2_K": [(80, 2), (82, 2)], "Q3_K": [(108, 2)], "Q4_K": [(0, 2), (2, 2)], "Q5_K": [(0, 2), (2, 2)],
    "Q6_K": [(208, 2)], "Q8_K": [(0, 4)], "IQ4_NL": [(0, 2)], "IQ4_XS": [(0, 2)], "MXFP4": [],
}
# Byte offsets of E8M0 exponents (a power of two each): any byte is valid, but the largest would overflow
# products to inf; tests draw them from E8M0_CASES (2^-128 and 2^-127 are float32 subnormals).
E8M0_FIELDS = {"MXFP4": [0]}
E8M0_CASES = [0, 1, 2, 100, 118, 121, 124, 126, 127, 128, 130, 140]
SCALE_CASES = [0.0, -0.0, 1.0, -0.37, 65504.0, 6e-8, 2.0**-24, 1e-3]  # incl. f16 max and subnormals


def random_rows(name: str, n_rows: int, n: int, rng, extremes: bool = True) -> np.ndarray:
    """uint8[n_rows, row_bytes]: random quants, float fields drawn from SCALE_CASES and a normal."""
    info = GGML_TYPES_BY_NAME[name]
    if info.block_size == 1:
        values = rng.standard_normal((n_rows, n)).astype(np.float32)
        if extremes:
            values[0, :8] = [0.0, -0.0, 65504.0, 6e-8, -1e-30, 3.4e38, 1.0, -2.5]
        return quant.get(name).quantize(values) if name != "F32" else values.view(np.uint8)
    blocks = rng.integers(0, 256, (n_rows * n // info.block_size, info.type_size), dtype=np.uint8)
    for offset, width in FLOAT_FIELDS[name]:
        dtype = np.float16 if width == 2 else np.float32
        scales = rng.choice(SCALE_CASES + list(rng.standard_normal(8)), size=blocks.shape[0]).astype(dtype)
        blocks[:, offset : offset + width] = scales.view(np.uint8).reshape(-1, width)
    for offset in E8M0_FIELDS.get(name, ()):
        blocks[:, offset] = rng.choice(E8M0_CASES, size=blocks.shape[0])
    blocks[0] = 0  # an all-zero block
    return blocks.reshape(n_rows, -1)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def isa_paths() -> tuple[str, ...]:
    """The VectorCode paths the per-path tests compile and compare on this machine ("auto" first): those
    whose code differs here (vector.distinct_isas)."""
    from numba.core.registry import cpu_target

    from localllm.backends.cpu.quant_kernels import vector

    return vector.distinct_isas(cpu_target.target_context)


def compiled_for_isa(kernel):
    """A parallel kernel compiled afresh for vector.VECTOR_ISA as it is now, serially (prange as range):
    the per-ISA tests check the vector code each ISA inlines, which is the same in a serial compile,
    and Numba's parallel lowering was most of their time."""
    return numba.njit(error_model="numpy")(kernel.py_func)
