"""Backend.take_rows (the row gather of the batched forward): the host default is np.take, which the CPU
backend inherits; the CUDA backend's kernel, and the batching engine on the CUDA backend, are checked in
a child process under numba's CUDA simulator (cuda_engine_checks.py, run by test_cuda_sim.py)."""

from __future__ import annotations

import numpy as np

from localllm.backends import create_backend
from localllm.backends.base import Backend

def test_the_cpu_backend_takes_rows_as_np_take():
    cpu = create_backend("cpu", 1)
    assert type(cpu).take_rows is Backend.take_rows  # the host default, inherited unchanged
    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, (9, 5)).astype(np.float32)
    rows = np.array([8, 0, 4, 4], dtype=np.int32)
    out = cpu.alloc((6, 5))
    cpu.take_rows(x, rows, out[:4])
    np.testing.assert_array_equal(out[:4], np.take(x, rows, axis=0))
    assert not out[4:].any()  # only the caller's rows are written
