"""Activation quantizers against llama.cpp's CPU path: the `yq` rows of the reference vectors are `y`
quantized by llama.cpp to each weight type's vec_dot_type (Q8_0, Q8_1 or Q8_K). Ours must be identical,
so that every difference left in a dot product is summation order."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REFERENCE_DIR

from localllm.quant.activation import QuantizedActivation


def reference_with(vec_dot_type: int):
    for path in sorted((REFERENCE_DIR / "quant").glob("*.npz")):
        ref = np.load(path)
        if "vec_dot_type" in ref.files and int(ref["vec_dot_type"]) == vec_dot_type:
            return ref
    raise AssertionError(f"no reference file pairs with vec_dot_type {vec_dot_type}")


def test_q8_0_matches_llamacpp():
    ref = reference_with(8)  # Q8_0 blocks: f16 d, int8 qs[32]
    for y, yq in zip(ref["y"], ref["yq"]):
        qs, d, s = QuantizedActivation("q8_0", y.size).quantize(y)
        blocks = yq.reshape(-1, 34)
        np.testing.assert_array_equal(qs, blocks[:, 2:].view(np.int8).reshape(-1))
        np.testing.assert_array_equal(d, blocks[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1))
        np.testing.assert_array_equal(s, blocks[:, 2:].view(np.int8).astype(np.int32).sum(axis=1))


def test_q8_1_matches_llamacpp():
    """Q8_1 = Q8_0's numbers plus s = d * sum(qs) stored as f16 (d before its own rounding to f16:
    amax / 127 in float32); we keep the exact integer sum, from which llama.cpp's s follows."""
    ref = reference_with(9)  # Q8_1 blocks: f16 d, f16 s, int8 qs[32]
    for y, yq in zip(ref["y"], ref["yq"]):
        qs, d, s = QuantizedActivation("q8_0", y.size).quantize(y)
        blocks = yq.reshape(-1, 36)
        np.testing.assert_array_equal(qs, blocks[:, 4:].view(np.int8).reshape(-1))
        np.testing.assert_array_equal(d, blocks[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1))
        stored = blocks[:, 2:4].copy().view(np.float16).astype(np.float32).reshape(-1)
        d_unrounded = np.abs(y.reshape(-1, 32)).max(axis=1) / np.float32(127)
        np.testing.assert_array_equal(stored, (d_unrounded * s.astype(np.float32)).astype(np.float16).astype(np.float32))


def test_q8_k_matches_llamacpp():
    ref = reference_with(15)  # Q8_K blocks: f32 d, int8 qs[256], int16 bsums[16]
    for y, yq in zip(ref["y"], ref["yq"]):
        qs, d, s = QuantizedActivation("q8_k", y.size).quantize(y)
        blocks = yq.reshape(-1, 292)
        np.testing.assert_array_equal(qs, blocks[:, 4:260].view(np.int8).reshape(-1))
        np.testing.assert_array_equal(d, blocks[:, :4].copy().view(np.float32).reshape(-1))
        np.testing.assert_array_equal(s, blocks[:, 260:].copy().view(np.int16).astype(np.int32).reshape(-1))


@pytest.mark.parametrize("kind,n", [("q8_0", 33), ("q8_k", 300)])
def test_lengths_that_are_not_a_block_multiple_are_refused(kind, n):
    with pytest.raises(ValueError):
        QuantizedActivation(kind, n)


@pytest.mark.parametrize("rows", [7, 40])  # on the calling thread, and in parallel (PARALLEL_QUANTIZE_ROWS)
@pytest.mark.parametrize("kind", ["q8_0", "q8_k"])
def test_a_batch_quantizes_each_row_as_the_one_row_quantizer(kind, rows):
    from localllm.backends.cpu.kernels import PARALLEL_QUANTIZE_ROWS
    from localllm.backends.cpu.matmul import BatchActivation

    assert (rows < PARALLEL_QUANTIZE_ROWS) == (rows == 7)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((rows, 1024)).astype(np.float32) * np.logspace(-6, 4, rows, dtype=np.float32)[:, None]
    x[3] = 0.0  # an all-zero row
    x[5, :40] = [1e30, -1e30] * 20
    batch = BatchActivation(kind, rows + 2, 1024).quantize(x)
    for t in range(rows):
        for got, want in zip(batch, QuantizedActivation(kind, 1024).quantize(x[t])):
            np.testing.assert_array_equal(got[t], want, err_msg=f"row {t}")
