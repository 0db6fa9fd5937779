"""The K-quants (Q2_K..Q6_K, Q8_K) and IQ4_NL / IQ4_XS against llama.cpp's own numbers.

Oracles:
- gguf-py (llama.cpp's Python package) `gguf.quants.dequantize` for every type it knows (all but Q8_K);
- llama.cpp's reference outputs in tests/data/reference/quant/<TYPE>.npz (see its README): rows `x`
  quantized by llama.cpp (`q`), dequantized (`deq`), and llama.cpp's CPU vec_dot of `q` with the
  activation `yq` (`dot`);
- float64 arithmetic on our own (bit-checked) dequantization for the dot products.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numba
import numpy as np
import pytest

from localllm import quant
from localllm.backends.cpu.matmul import matvec_kernel
from localllm.backends.cpu.quant_kernels import kernel_record, vector
from localllm.errors import TensorError
from localllm.quant.activation import QuantizedActivation
from tiny_models import _SCALE_FIELDS

QUANT_DIR = Path(__file__).parents[1] / "data" / "reference" / "quant"

TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS"]
K_TYPES_WITH_REFERENCE = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]  # npz files with a vec_dot `dot`
QUANTIZERS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"]
EXPECTED_ACT = {
    "Q2_K": "q8_k", "Q3_K": "q8_k", "Q4_K": "q8_k", "Q5_K": "q8_k", "Q6_K": "q8_k",
    "Q8_K": "q8_k", "IQ4_NL": "q8_0", "IQ4_XS": "q8_k",
}

# Scale-field values that exercise the float16 conversion: zeros of both signs, the largest finite
# half, the smallest and largest subnormal halves, and ordinary values of both signs.
F16_SPECIALS = np.array([0.0, -0.0, 65504.0, 2.0**-24, 2.0**-14 - 2.0**-24, 1.0, -0.37, 3e-3], dtype=np.float16)
# Q8_K's scale is a float32: zeros, a subnormal, large and ordinary values.
F32_SPECIALS = np.array([0.0, -0.0, 1e-40, 65504.0, 1e20, -3.0, 2.5e-3], dtype=np.float32)

N_BLOCKS = 96  # a few rows' worth; every special value lands in many blocks


def random_blocks(rng: np.random.Generator, qtype: str, n_blocks: int = N_BLOCKS) -> np.ndarray:
    """uint8[n_blocks, type_size]: random bytes with finite (incl. special) values in the scale fields."""
    qt = quant.get(qtype)
    blocks = rng.integers(0, 256, (n_blocks, qt.type_size), dtype=np.uint8)
    for offset, width in _SCALE_FIELDS[qtype]:
        specials = F16_SPECIALS if width == 2 else F32_SPECIALS
        values = specials[rng.integers(0, specials.size, n_blocks)]
        blocks[:, offset : offset + width] = values.reshape(-1, 1).view(np.uint8)
    return blocks


def random_rows(rng: np.random.Generator, qtype: str, n_rows: int = 4, n_blocks_per_row: int = 0) -> np.ndarray:
    """uint8[n_rows, row_bytes] of random blocks (rows of 1024 values unless told otherwise)."""
    qt = quant.get(qtype)
    per_row = n_blocks_per_row or 1024 // qt.block_size
    return random_blocks(rng, qtype, n_rows * per_row).reshape(n_rows, -1)


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def load_reference(qtype: str):
    return np.load(QUANT_DIR / f"{qtype}.npz")


def unpack_q8_k(raw: np.ndarray):
    """llama.cpp's block_q8_K bytes (f32 d, int8 qs[256], int16 bsums[16]) -> our q8_k arrays."""
    blocks = raw.reshape(-1, 292)
    d = blocks[:, :4].copy().view(np.float32).reshape(-1)
    qs = blocks[:, 4:260].copy().view(np.int8).reshape(-1)
    sums = blocks[:, 260:].copy().view("<i2").astype(np.int32).reshape(-1)
    return qs, d, sums


def dequantized_activation(qs: np.ndarray, d: np.ndarray) -> np.ndarray:
    block = qs.shape[0] // d.shape[0]
    return qs.astype(np.float64) * np.repeat(d.astype(np.float64), block)


# ----- registry and layout -----


@pytest.mark.parametrize("qtype", TYPES)
def test_registered_with_ggml_layout_and_pairing(qtype):
    qt = quant.get(qtype)
    assert qt.name == qtype
    assert qt.act == EXPECTED_ACT[qtype]
    assert (qt.block_size, qt.type_size) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]


# ----- dequantization -----


@pytest.mark.parametrize("qtype", [t for t in TYPES if t != "Q8_K"])
def test_dequantize_equals_gguf_bit_for_bit(qtype):
    raw = random_rows(np.random.default_rng(1), qtype, n_rows=6)
    ours = quant.get(qtype).dequantize(raw)
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    np.testing.assert_array_equal(bits(ours), bits(theirs))


def test_q8_k_dequantize_is_d_times_qs():
    # gguf-py has no Q8_K; a float32 product d*q is exactly the float64 product rounded once to float32.
    blocks = random_blocks(np.random.default_rng(2), "Q8_K")
    d = blocks[:, :4].copy().view(np.float32).astype(np.float64)
    qs = blocks[:, 4:260].view(np.int8).astype(np.float64)
    expected = (d * qs).astype(np.float32).reshape(-1)
    np.testing.assert_array_equal(bits(quant.get("Q8_K").dequantize(blocks.reshape(-1))), bits(expected))


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_row_equals_dequantize_bit_for_bit(qtype):
    qt = quant.get(qtype)
    raw = random_rows(np.random.default_rng(3), qtype, n_rows=6)
    expected = qt.dequantize(raw)
    out = np.empty(expected.shape[1], dtype=np.float32)
    # quant's plain dequantizer and the CPU kernels' (vector code where the type has it): the same bits
    for dequantize_row in (qt.dequantize_row, kernel_record(qt).dequantize_row):
        for row in range(raw.shape[0]):
            dequantize_row(raw[row], out)
            np.testing.assert_array_equal(bits(out), bits(expected[row]), err_msg=f"row {row}")


@pytest.mark.parametrize("qtype", K_TYPES_WITH_REFERENCE + ["Q8_K"])
def test_dequantize_equals_llama_cpp_reference(qtype):
    ref = load_reference(qtype)
    np.testing.assert_array_equal(bits(quant.get(qtype).dequantize(ref["q"])), bits(ref["deq"]))


def test_dequantize_keeps_leading_dimensions():
    qt = quant.get("Q4_K")
    raw = random_rows(np.random.default_rng(4), "Q4_K", n_rows=6).reshape(2, 3, -1)
    assert qt.dequantize(raw).shape == (2, 3, 1024)


# ----- dot products -----

# vec_dot sums each block's integer products exactly (int32: |sum| < 2**31 for every type), then
# applies the float32 scales once per block and accumulates the block terms in float32. Against the
# float64 dot of the float32-dequantized weights with the dequantized activation, the difference is
# a few float32 roundings (2**-24 relative) per block term plus one per accumulated block, each at most
# the magnitude of the terms involved, and up to two roundings in each dequantized weight. With at most
# 32 blocks per row, 1e-5 of sum|w_i * a_i| (~170 roundings' worth) bounds all of that, while any
# indexing or scale mistake (a wrong element, group or sign) moves the result by far more than 1e-3.
DOT_RTOL = 1e-5


@pytest.mark.parametrize("qtype", TYPES)
def test_vec_dot_matches_float64_dot_of_dequantized(qtype):
    rng = np.random.default_rng(5)
    qt = quant.get(qtype)
    raw = random_rows(rng, qtype, n_rows=8)
    weights = qt.dequantize(raw).astype(np.float64)
    n = weights.shape[1]
    act = QuantizedActivation(qt.act, n)
    for row in range(raw.shape[0]):
        x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 50.0])).astype(np.float32)
        qs, d, sums = act.quantize(x)
        a = dequantized_activation(qs, d)
        expected = float(np.dot(weights[row], a))
        scale = float(np.dot(np.abs(weights[row]), np.abs(a)))
        got = kernel_record(qt).vec_dot(raw[row], qs, d, sums)
        assert isinstance(got, float) and np.isfinite(got)
        assert abs(got - expected) <= DOT_RTOL * scale + 1e-30, (row, got, expected)


VECTOR_TYPES = [t for t in TYPES if t != "Q8_K"]  # the kernels built from vector.VectorCode


@pytest.mark.parametrize("qtype", VECTOR_TYPES)
def test_vec_dot_portable_vector_path(qtype):
    # The kernels emit AVX2 instructions where the machine has them and portable vector IR elsewhere.
    # Compile a private, uncached copy with the portable path forced and check it like the main one.
    rng = np.random.default_rng(8)
    qt = quant.get(qtype)
    raw = random_rows(rng, qtype, n_rows=4)
    weights = qt.dequantize(raw).astype(np.float64)
    act = QuantizedActivation(qt.act, weights.shape[1])
    kernel_record(qt).vec_dot(raw[0], *act.arrays)  # the cached (native) kernel is compiled before the switch
    saved = vector.VECTOR_ISA
    vector.VECTOR_ISA = "generic"
    try:
        portable = numba.njit(fastmath=True, error_model="numpy")(kernel_record(qt).vec_dot.py_func)
        for row in range(raw.shape[0]):
            qs, d, sums = act.quantize(rng.standard_normal(weights.shape[1]).astype(np.float32))
            a = dequantized_activation(qs, d)
            got = portable(raw[row], qs, d, sums)
            assert abs(got - np.dot(weights[row], a)) <= DOT_RTOL * np.dot(np.abs(weights[row]), np.abs(a))
            assert got == pytest.approx(kernel_record(qt).vec_dot(raw[row], qs, d, sums), rel=1e-6, abs=1e-30)
    finally:
        vector.VECTOR_ISA = saved
    assert "pmaddubsw" not in portable.inspect_asm(portable.signatures[0])


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_matvec_driver_runs_the_kernel_per_row(qtype):
    # The decode matmul (backends/cpu/matmul.py) calls vec_dot from a parallel loop over rows.
    rng = np.random.default_rng(9)
    qt = quant.get(qtype)
    raw = random_rows(rng, qtype, n_rows=24, n_blocks_per_row=2)
    raw.flags.writeable = False  # as the model's memory-mapped weights are
    act = QuantizedActivation(qt.act, 512)
    arrays = act.quantize(rng.standard_normal(512).astype(np.float32))
    out = np.empty(raw.shape[0], dtype=np.float32)
    matvec_kernel(qt)(raw, out, *arrays)
    expected = np.array([kernel_record(qt).vec_dot(row, *arrays) for row in raw], dtype=np.float32)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-30)  # same sums; fast-math may reorder


# Both llama.cpp and we sum each block exactly in integers and differ only in the order of a handful of
# float32 operations per block (4 blocks per row): a few 2**-24 roundings of sum|w_i*a_i| at most.
REFERENCE_DOT_RTOL = 2e-6


@pytest.mark.parametrize("qtype", K_TYPES_WITH_REFERENCE)
def test_vec_dot_matches_llama_cpp(qtype):
    ref = load_reference(qtype)
    qt = quant.get(qtype)
    assert qt.act == "q8_k" and ref["yq"].shape[1] == 4 * 292
    for row in range(ref["q"].shape[0]):
        qs, d, sums = unpack_q8_k(ref["yq"][row])
        scale = float(np.dot(np.abs(ref["deq"][row].astype(np.float64)), np.abs(dequantized_activation(qs, d))))
        got = kernel_record(qt).vec_dot(ref["q"][row], qs, d, sums)
        assert abs(got - float(ref["dot"][row])) <= REFERENCE_DOT_RTOL * scale, (row, got, ref["dot"][row])


def test_q8_k_activation_bsums_agree_with_llama_cpp():
    # The activation our kernels read must be the one llama.cpp builds: quantizing the reference `y` rows
    # reproduces its Q8_K bytes `yq` (d, qs and the 16-element sums).
    ref = load_reference("Q4_K")
    act = QuantizedActivation("q8_k", ref["y"].shape[1])
    for row in range(ref["y"].shape[0]):
        qs, d, sums = act.quantize(ref["y"][row])
        rqs, rd, rsums = unpack_q8_k(ref["yq"][row])
        np.testing.assert_array_equal(qs, rqs)
        np.testing.assert_array_equal(bits(d), bits(rd))
        np.testing.assert_array_equal(sums, rsums)


# ----- quantization -----


@pytest.mark.parametrize("qtype", QUANTIZERS)
def test_quantize_equals_llama_cpp_bit_for_bit(qtype):
    ref = load_reference(qtype)
    ours = quant.get(qtype).quantize(ref["x"])
    assert ours.dtype == np.uint8 and ours.shape == ref["q"].shape
    for row in range(ours.shape[0]):
        np.testing.assert_array_equal(ours[row], ref["q"][row], err_msg=f"row {row}")


@pytest.mark.parametrize("qtype", QUANTIZERS)
def test_quantize_then_dequantize_is_close(qtype):
    # Independent of the reference rows: on new Gaussian data the round-trip RMS error is what the bit
    # width allows (measured 29.8%, 14.9%, 7.1%, 3.6%, 1.8%, 0.7% for 2, 3, 4, 5, 6, 8 bits; bounds
    # ~1.4x that, while a quantizer that drops a bit or a sub-block's scale lands far above them).
    rng = np.random.default_rng(6)
    qt = quant.get(qtype)
    x = rng.standard_normal((4, 2048)).astype(np.float32)
    back = qt.dequantize(qt.quantize(x))
    rel_rms = np.sqrt(np.mean((back - x) ** 2)) / np.sqrt(np.mean(x**2))
    bound = {"Q2_K": 0.42, "Q3_K": 0.21, "Q4_K": 0.10, "Q5_K": 0.05, "Q6_K": 0.025, "Q8_K": 0.01}[qtype]
    assert rel_rms < bound


def test_quantize_keeps_leading_dimensions():
    x = np.random.default_rng(7).standard_normal((2, 3, 512)).astype(np.float32)
    assert quant.get("Q6_K").quantize(x).shape == (2, 3, 2 * 210)


# ----- bad input -----


@pytest.mark.parametrize("qtype", QUANTIZERS)
def test_quantize_rejects_rows_that_are_not_whole_blocks(qtype):
    with pytest.raises(TensorError, match="multiple of 256"):
        quant.get(qtype).quantize(np.zeros((2, 300), dtype=np.float32))


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_rejects_partial_blocks(qtype):
    qt = quant.get(qtype)
    with pytest.raises(TensorError, match=f"{qt.type_size}-byte blocks"):
        qt.dequantize(np.zeros((2, qt.type_size + 1), dtype=np.uint8))


def test_vec_dot_on_the_real_gemma_q4_k_and_q6_k_tensors(gemma_path):
    # The decode hot loop on real weights: a few rows of every Q4_K / Q6_K tensor of Gemma 3 270M
    # (attention output K=1024, FFN down K=2048), same bound as on random blocks.
    from localllm.gguf import GGUFReader

    rng = np.random.default_rng(10)
    seen = set()
    with GGUFReader(gemma_path) as reader:
        for info in reader.tensors.values():
            qtype = info.ggml_type.name
            if qtype not in ("Q4_K", "Q6_K"):
                continue
            qt = quant.get(qtype)
            raw = reader.tensor_bytes(info.name)
            rows = rng.choice(raw.shape[0], size=4, replace=False)
            weights = qt.dequantize(raw[rows]).astype(np.float64)
            act = QuantizedActivation("q8_k", weights.shape[1])
            qs, d, sums = act.quantize(rng.standard_normal(weights.shape[1]).astype(np.float32))
            a = dequantized_activation(qs, d)
            for i, row in enumerate(rows):
                got = kernel_record(qt).vec_dot(raw[row], qs, d, sums)
                bound = DOT_RTOL * np.dot(np.abs(weights[i]), np.abs(a))
                assert abs(got - np.dot(weights[i], a)) <= bound, (info.name, row)
            seen.add(qtype)
    assert seen == {"Q4_K", "Q6_K"}
