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


def _first_largest_magnitude(values):
    """llama.cpp's scan in quantize_row_q8_K_ref, transcribed: (amax, the value), NaNs never counted."""
    amax, vmax = np.float32(0.0), np.float32(0.0)
    for v in values:
        if abs(v) > amax:
            amax, vmax = abs(v), v
    return amax, vmax


def _q8_k_reference(y):
    """quantize_row_q8_K_ref, scalar, float32 arithmetic: (qs, d, bsums) for y float32[256 * k]."""
    qs, d, sums = [], [], []
    for block in y.reshape(-1, 256):
        amax, vmax = _first_largest_magnitude(block)
        if amax == 0:
            qs += [0] * 256
            d.append(np.float32(0.0))
            sums += [0] * 16
            continue
        iscale = np.float32(-127.0) / vmax
        q = [min(127, int(np.rint(iscale * v))) for v in block]
        qs += q
        d.append(np.float32(1.0) / iscale)
        sums += [sum(q[16 * g : 16 * g + 16]) for g in range(16)]
    return np.array(qs, np.int8), np.array(d, np.float32), np.array(sums, np.int32)


def test_q8_k_keeps_the_first_value_of_largest_magnitude_and_its_sign():
    """The vectorized search (largest_magnitude_bits) against the scalar scan on the blocks where the
    choice matters: equal magnitudes of opposite signs in either order, signed zeros, one value alone."""
    rng = np.random.default_rng(5)
    blocks = rng.standard_normal((8, 256)).astype(np.float32)
    blocks[0, [7, 200]] = [-9.0, 9.0]  # the first maximum is negative: the scale's sign follows it
    blocks[1, [7, 200]] = [9.0, -9.0]
    blocks[2, 100:] = -blocks[2, :156]  # every magnitude twice, the later negated
    blocks[3] = 0.0
    blocks[3, ::2] = -0.0  # all zero, both signs: the all-zero block
    blocks[4] = 0.0
    blocks[4, 255] = -1e-30  # a single (tiny) value, last
    blocks[5, :] = 2.5
    blocks[5, 31] = -2.5  # ties everywhere
    y = blocks.reshape(-1)
    got = QuantizedActivation("q8_k", y.size).quantize(y)
    for name, ours, want in zip(("qs", "d", "bsums"), got, _q8_k_reference(y)):
        np.testing.assert_array_equal(ours, want, err_msg=name)


def test_largest_magnitude_search_passes_over_nans_and_counts_infinities():
    from localllm.quant.activation import largest_magnitude_bits

    rng = np.random.default_rng(6)
    for case in range(40):
        xb = (rng.standard_normal(256) * 10.0 ** rng.integers(-30, 30)).astype(np.float32)
        xb[rng.integers(0, 256, 5)] = np.nan
        if case % 4 == 0:
            xb[rng.integers(0, 256, 2)] = [np.inf, -np.inf]
        if case % 5 == 0:
            xb[:] = np.nan
        key = int(largest_magnitude_bits(xb))
        amax, vmax = _first_largest_magnitude(xb)
        assert np.array([key >> 32], np.uint32).view(np.float32)[0] == amax
        if amax > 0:
            assert xb[255 - (key & 0xFFFFFFFF)] == vmax and np.signbit(xb[255 - (key & 0xFFFFFFFF)]) == np.signbit(vmax)


def _q8_0_reference(y):
    """quantize_row_q8_0 as llama.cpp's AVX path computes it, scalar, float32 arithmetic: (qs, d, sums)."""
    qs, d, sums = [], [], []
    for block in y.reshape(-1, 32):
        amax = np.float32(np.abs(block).max())
        inv = np.float32(127.0) / amax if amax else np.float32(0.0)
        q = [int(np.rint(np.float32(v * inv))) for v in block]
        qs += q
        with np.errstate(over="ignore"):  # a huge block's scale: float16 infinity, as ggml stores it
            d.append(np.float32(np.float16(amax / np.float32(127.0))))
        sums.append(sum(q))
    return np.array(qs, np.int8), np.array(d, np.float32), np.array(sums, np.int32)


def test_q8_0_vector_and_strided_rows_give_the_scalar_transcription():
    """Unit-stride rows go through the vector block code, others through the scalar loop: both against
    a transcription, on blocks of zeros of both signs, halfway cases after scaling, tiny and huge
    values; then NaN, infinity and a block of subnormals only (whose 127 / amax overflows: no
    transcription, the two paths must still agree)."""
    rng = np.random.default_rng(7)
    blocks = rng.standard_normal((8, 32)).astype(np.float32)
    blocks[1] = 0.0
    blocks[1, ::3] = -0.0
    blocks[2] *= np.float32(1e-30)
    blocks[3] = np.arange(32, dtype=np.float32) - 15.5  # amax 15.5: many x * 127 / 15.5 near .5
    blocks[4, :] = 127.0
    blocks[4, ::2] = 0.5  # scaled by 1: exact halves, rounded to even
    blocks[5] *= np.float32(3e37)
    y = blocks.reshape(-1)
    expected = _q8_0_reference(y)
    wide = np.zeros(2 * y.size, np.float32)
    wide[::2] = y
    for row in (y, wide[::2]):
        got = QuantizedActivation("q8_0", y.size).quantize(row)
        for g, e, name in zip(got, expected, ("qs", "d", "sums")):
            np.testing.assert_array_equal(g, e, err_msg=f"{name}, stride {row.strides[0]}")
    y[[3, 40, 77]] = [np.nan, np.inf, -np.inf]
    y[96:128] = rng.uniform(-1e-39, 1e-39, 32)
    wide[::2] = y
    with np.errstate(invalid="ignore"):
        contiguous = [a.copy() for a in QuantizedActivation("q8_0", y.size).quantize(y)]
        strided = QuantizedActivation("q8_0", y.size).quantize(wide[::2])
    for a, b in zip(contiguous, strided):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
