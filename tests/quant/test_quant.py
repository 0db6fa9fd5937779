"""Every registered quant type against llama.cpp: the gguf package (its NumPy port of ggml-quants.c) and
llama.cpp's own outputs on test vectors (tests/data/reference/quant/*.npz, made through libggml).

Parametrized over the registry, so a new type is tested by adding it to `quant._MODULES`.
Tolerance for dot products (stated once, used everywhere): our vec_dot and a float64 dot of the same
dequantized numbers differ only in float32 rounding and summation order. Integer block sums are exact,
so the error is a few float32 roundings per block, relative to sum |w_i a_i|: bound 1e-5 x sum |w_i a_i|.
"""

from __future__ import annotations

import gguf
import numba
import numpy as np
import pytest
from conftest import REFERENCE_DIR
from quant_rows import bits, random_rows

from localllm import quant
from localllm.backends.cpu.drivers import row_drivers
from localllm.backends.cpu.matmul import BatchActivation, matvec_kernel
from localllm.backends.cpu.quant_kernels import kernel_record, vector
from localllm.errors import TensorError
from localllm.quant.activation import QuantizedActivation

DOT_RTOL = 1e-5
NAMES = quant.supported_names()
IN_GGUF = [name for name in NAMES if name != "Q8_K"]  # gguf.quants has no Q8_K (reference vectors below)


def _gguf_can_quantize(name: str) -> bool:
    try:
        gguf.quants.quantize(np.zeros((1, 256), np.float32), gguf.GGMLQuantizationType[name])
    except NotImplementedError:
        return False
    return True



@pytest.mark.parametrize("name", IN_GGUF)
def test_dequantize_equals_gguf_bit_for_bit(name):
    rng = np.random.default_rng(1)
    raw = random_rows(name, 6, 512, rng)
    ours = quant.get(name).dequantize(raw)
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(ours.shape)
    np.testing.assert_array_equal(bits(ours), bits(theirs))


@pytest.mark.parametrize("name", NAMES)
def test_numba_row_kernel_equals_numpy_reference(name):
    rng = np.random.default_rng(2)
    qt = quant.get(name)
    raw = random_rows(name, 6, 512, rng)
    expected = qt.dequantize(raw)
    out = np.empty(512, dtype=np.float32)
    # quant's plain dequantizer and the CPU kernels' (vector code where the type has it): the same bits
    for dequantize_row in (qt.dequantize_row, kernel_record(qt).dequantize_row):
        for r in range(raw.shape[0]):
            dequantize_row(raw[r], out)
            np.testing.assert_array_equal(bits(out), bits(expected[r]))


def dequantized_activation(qt, args, x):
    """The activation as the kernel sees it: float32 as is, or quants times their block scale."""
    if qt.act == "f32":
        return x.astype(np.float64)
    qs, d = args[0], args[1]
    block = len(qs) // len(d)
    return (qs.astype(np.float64).reshape(-1, block) * d[:, None]).reshape(-1)


@pytest.mark.parametrize("name", NAMES)
def test_vec_dot_within_stated_tolerance(name):
    rng = np.random.default_rng(3)
    qt = quant.get(name)
    n = 1024
    raw = random_rows(name, 8, n, rng, extremes=False)
    weights = qt.dequantize(raw).astype(np.float64)
    act = QuantizedActivation(qt.act, n)
    for r in range(raw.shape[0]):
        x = (rng.standard_normal(n) * rng.choice([1e-2, 1.0, 30.0])).astype(np.float32)
        args = act.quantize(x)
        a = dequantized_activation(qt, args, x)
        got = float(kernel_record(qt).vec_dot(raw[r], *args))
        expected = float(weights[r] @ a)
        scale = float(np.abs(weights[r] * a).sum())
        assert abs(got - expected) <= DOT_RTOL * scale + 1e-30, (r, got, expected)
        # Against the unquantized activation: each activation element is off by at most half a step
        # (d/2 per block), so |error| <= sum |w_i| * d_block(i) / 2.
        if qt.act != "f32":
            d = np.abs(np.repeat(args[1], n // len(args[1])).astype(np.float64))
            bound = float(np.abs(weights[r]) @ (d / 2)) * (1 + 1e-4) + DOT_RTOL * scale
            assert abs(got - float(weights[r] @ x.astype(np.float64))) <= bound


@pytest.mark.parametrize("name", NAMES)
def test_matvec_driver_on_read_only_weights_equals_vec_dot_per_row(name):
    # Decode runs vec_dot from the parallel matvec driver over memory-mapped (read-only) weights: a
    # different Numba array type from the writable rows above, so it is compiled and checked separately.
    rng = np.random.default_rng(5)
    qt = quant.get(name)
    raw = random_rows(name, 12, 512, rng, extremes=False)
    raw.flags.writeable = False
    args = QuantizedActivation(qt.act, 512).quantize(rng.standard_normal(512).astype(np.float32))
    out = np.empty(raw.shape[0], dtype=np.float32)
    matvec_kernel(qt)(raw, out, *args)
    expected = np.array([kernel_record(qt).vec_dot(np.array(row), *args) for row in raw], dtype=np.float32)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-30)  # same sums; fast-math may reorder


@pytest.mark.parametrize("name", NAMES)
def test_batched_matvec_equals_the_decode_matvec_bit_for_bit_whatever_the_grouping(name):
    # The server relies on every out[t, r] of the batched driver (activation rows four at a time where
    # a type has 1x4 kernels, one by one otherwise) being exactly what the decode matvec gives for
    # activation t alone (weight rows four at a time where a type has 4x1 kernels). 13 weight rows and
    # 1..9 activation rows exercise the groups and the tails.
    rng = np.random.default_rng(8)
    qt = quant.get(name)
    raw = random_rows(name, 13, 512, rng)
    x = rng.standard_normal((9, 512)).astype(np.float32) * rng.uniform(0.01, 100, (9, 1)).astype(np.float32)
    expected = np.empty((9, raw.shape[0]), dtype=np.float32)
    for t in range(9):
        matvec_kernel(qt)(raw, expected[t], *QuantizedActivation(qt.act, 512).quantize(x[t]))
    for n_rows in (1, 4, 6, 9):
        batch = BatchActivation(qt.act, n_rows, 512).quantize(x[:n_rows])
        out = np.empty((n_rows, raw.shape[0]), dtype=np.float32)
        row_drivers(qt).matvec_rows(raw, out, *batch)
        np.testing.assert_array_equal(bits(out), bits(expected[:n_rows]), err_msg=f"{n_rows} rows")


@pytest.mark.parametrize("name", [n for n in NAMES if kernel_record(n).grid is not None])
def test_grid_matvec_equals_vec_dot_bit_for_bit(name):
    # Where the drivers use the grid kernels, their arithmetic is pinned (VectorCode.grid_sum: explicit
    # FMA, fixed float flags), so they equal the type's own vec_dot exactly, wherever it is compiled.
    rng = np.random.default_rng(9)
    qt = quant.get(name)
    raw = random_rows(name, 13, 512, rng)
    args = QuantizedActivation(qt.act, 512).quantize(rng.standard_normal(512).astype(np.float32))
    out = np.empty(raw.shape[0], dtype=np.float32)
    matvec_kernel(qt)(raw, out, *args)
    expected = np.array([kernel_record(qt).vec_dot(row, *args) for row in raw], dtype=np.float32)
    np.testing.assert_array_equal(bits(out), bits(expected))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_vec_dot_portable_vector_path(name):
    # These kernels are built from vector.VectorCode, which emits AVX2 instructions where the machine has
    # them and portable vector IR elsewhere: compile an uncached copy with the portable path forced.
    rng = np.random.default_rng(6)
    qt = quant.get(name)
    raw = random_rows(name, 4, 512, rng, extremes=False)
    weights = qt.dequantize(raw).astype(np.float64)
    act = QuantizedActivation(qt.act, 512)
    saved = vector.VECTOR_ISA
    vector.VECTOR_ISA = "generic"
    try:
        portable = numba.njit(fastmath=True, error_model="numpy")(kernel_record(qt).vec_dot.py_func)
        for r in range(raw.shape[0]):
            args = act.quantize(rng.standard_normal(512).astype(np.float32))
            a = dequantized_activation(qt, args, None)
            got = float(portable(raw[r], *args))
            assert abs(got - float(weights[r] @ a)) <= DOT_RTOL * float(np.abs(weights[r] * a).sum()) + 1e-30
    finally:
        vector.VECTOR_ISA = saved
    assert "pmaddubsw" not in portable.inspect_asm(portable.signatures[0])


@pytest.mark.parametrize("name", [n for n in IN_GGUF if quant.get(n).quantize is not None and _gguf_can_quantize(n)])
def test_quantize_equals_gguf_bit_for_bit(name):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((8, 512)) * rng.choice([1e-4, 1.0, 1e3], (8, 1))).astype(np.float32)
    x[1] = 0.0
    x[2, 17] = 5e4  # one huge value
    x[3, ::2] = -x[3, 1::2]
    theirs = gguf.quants.quantize(x, gguf.GGMLQuantizationType[name])
    ours = quant.get(name).quantize(x)
    np.testing.assert_array_equal(ours.reshape(-1), np.asarray(theirs).reshape(-1).view(np.uint8))


# -- exact ties: values that land on a half step after scaling ---------------------------------------------
# Random inputs almost never do, so a quantizer that rounds half to even where llama.cpp rounds half
# away from zero (or the reverse) passes the tests above. Each block below gets a power-of-two scale
# 2**e (exact in float32 and float16, and so is its reciprocal): the scaled values are exactly
# t + 0.5 for most elements. Block layouts (ggml-quants.c, the _ref quantizers):
# - Q8_0: d = amax / 127, q = roundf(x / d), so amax = 127 * 2**e;
# - Q4_0 / Q5_0: d = max / -L (max: the signed value of largest magnitude, L = 8 / 16),
#   q = trunc(x / d + L + 0.5), so max = +-L * 2**e;
# - Q4_1 / Q5_1: d = (max - min) / L (L = 15 / 31), q = trunc((x - min) / d + 0.5), so
#   max = min + L * 2**e with min a multiple of 2**e.
TIE_EXPONENTS = [-20, -9, 0, 7]  # 2**-20: a float16 subnormal scale
SYMMETRIC_LEVELS = {"Q8_0": 127, "Q4_0": 8, "Q5_0": 16}
AFFINE_LEVELS = {"Q4_1": 15, "Q5_1": 31}


def tie_blocks(name: str, n_blocks: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(x float32[n_blocks, 32], scaled float64[n_blocks, 32]): blocks of `name` and each value as the
    quantizer scales it before rounding ((x - min) / d or x / d, worked out from the layout above)."""
    x = np.empty((n_blocks, 32))
    scaled = np.empty_like(x)
    for b in range(n_blocks):
        step = 2.0 ** rng.choice(TIE_EXPONENTS)
        if name in SYMMETRIC_LEVELS:
            levels = SYMMETRIC_LEVELS[name]
            t = rng.integers(-levels, levels - 1, 32) + 0.5  # |t| < levels: the extreme stays unique
            t[rng.integers(0, 32)] = rng.choice([-1, 1]) * levels  # the extreme: amax, or max at -L * d
            sign = 1.0 if name == "Q8_0" else -float(np.sign(t[np.abs(t).argmax()]))  # d = max / -L
            x[b], scaled[b] = t * step, t * sign
        else:
            levels = AFFINE_LEVELS[name]
            low = float(rng.integers(-levels, 1))  # min / 2**e
            t = rng.integers(0, levels, 32) + 0.5
            t[:2] = [0.0, float(levels)]  # the min and the max
            rng.shuffle(t)
            x[b], scaled[b] = (low + t) * step, t
    return x.astype(np.float32), scaled


def f16_ties(rng, n: int) -> np.ndarray:
    """float32[n]: midpoints between neighbouring float16 values (normal, subnormal, and 65520 between
    the largest finite float16 and the next power of two), exact in float32."""
    codes = rng.integers(0, 0x7BFF, n).astype(np.uint16)  # finite, below the largest
    low = codes.view(np.float16).astype(np.float64)
    high = (codes + np.uint16(1)).view(np.float16).astype(np.float64)
    mid = (low + high) / 2 * rng.choice([-1.0, 1.0], n)
    mid[:3] = [65520.0, -65520.0, 2.0**-25]
    return mid.astype(np.float32)


def bf16_ties(rng, n: int) -> np.ndarray:
    """float32[n] whose low 16 bits are exactly half of a bfloat16 step (0x8000), both parities of
    the kept bit, finite exponents only."""
    high = rng.integers(0, 0x7F7F, n).astype(np.uint32) | (rng.integers(0, 2, n).astype(np.uint32) << 15)
    return ((high << 16) | 0x8000).view(np.float32)


def mxfp4_ties(rng, n_blocks: int) -> np.ndarray:
    """float32[n_blocks * 32]: in each block (scale 2^k) the midpoints between neighbouring MXFP4 levels
    (0, 1, 2, 3, 4, 6, 8, 12 times the scale, either sign), one of them 10 * 2^k, which sets the block's
    exponent to give exactly that scale (floor(log2(10 * 2^k)) - 2 + 127 = k + 128)."""
    mids = np.array([0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0])
    x = rng.choice(mids, (n_blocks, 32)) * rng.choice([-1.0, 1.0], (n_blocks, 32))
    x[np.arange(n_blocks), rng.integers(0, 32, n_blocks)] = 10.0
    return (x * 2.0 ** rng.choice(TIE_EXPONENTS, (n_blocks, 1))).astype(np.float32).reshape(-1)


def tie_rows(name: str, rng) -> np.ndarray:
    """float32[4, 512] of exact ties for `name`'s rounding."""
    if name == "MXFP4":
        return mxfp4_ties(rng, 4 * 16).reshape(4, 512)
    if name == "F16":
        return f16_ties(rng, 4 * 512).reshape(4, 512)
    if name == "BF16":
        return bf16_ties(rng, 4 * 512).reshape(4, 512)
    return tie_blocks(name, 4 * 16, rng)[0].reshape(4, 512)


TIE_NAMES = ["F16", "BF16", "MXFP4", *SYMMETRIC_LEVELS, *AFFINE_LEVELS]


def test_the_tie_inputs_are_exact_ties():
    rng = np.random.default_rng(11)
    for name in [*SYMMETRIC_LEVELS, *AFFINE_LEVELS]:
        x, scaled = tie_blocks(name, 64, rng)
        assert np.mean(scaled % 1 == 0.5) > 0.9, name
    f16 = f16_ties(rng, 1000).astype(np.float64)
    with np.errstate(over="ignore"):  # 65520 rounds to inf
        assert np.all(np.abs(f16 - f16.astype(np.float16).astype(np.float64)) > 0)  # none is a float16
    bf16 = bf16_ties(rng, 1000)
    assert np.all(bf16.view(np.uint32) & 0xFFFF == 0x8000) and np.all(np.isfinite(bf16))


@pytest.mark.parametrize("name", TIE_NAMES)
def test_quantize_rounds_exact_ties_as_gguf(name):
    assert _gguf_can_quantize(name)
    x = tie_rows(name, np.random.default_rng(12))
    with np.errstate(over="ignore"):  # F16: +-65520 round to +-inf, as in ggml
        theirs = gguf.quants.quantize(x, gguf.GGMLQuantizationType[name])
    ours = quant.get(name).quantize(x)
    np.testing.assert_array_equal(ours.reshape(-1), np.asarray(theirs).reshape(-1).view(np.uint8))


def test_every_type_gguf_can_quantize_gets_tie_inputs():
    names = [n for n in IN_GGUF if quant.get(n).quantize is not None and _gguf_can_quantize(n)]
    assert sorted(set(names) - {"F32"}) == sorted(TIE_NAMES)  # F32 stores its input: nothing to round


def test_q8_k_rounds_exact_ties_half_to_even():
    """Q8_K has no quantizer in gguf.quants; expected bytes worked out from ggml's quantize_row_q8_K_ref:
    max = the signed value of largest magnitude, iscale = -127 / max, q = MIN(127, nearest_int(iscale
    * x)) where nearest_int adds 1.5 * 2**23 (the FPU's round half to even), d = 1 / iscale (float32),
    bsums[16] = the sums of each 16 quants (int16). Here max = -127 * 2**e, so iscale = 2**-e and the
    other values are exact ties t + 0.5."""
    rng = np.random.default_rng(13)
    x = np.empty((4, 256))
    for b, e in enumerate([-20, -3, 0, 5]):
        t = rng.integers(-127, 126, 256) + 0.5
        t[rng.integers(0, 256)] = -127.0
        x[b] = t * 2.0**e
    x = x.astype(np.float32)
    scaled = x.astype(np.float64) / (2.0 ** np.array([-20, -3, 0, 5]))[:, None]
    q = np.rint(scaled).astype(np.int8)  # numpy rounds half to even
    assert np.any(q != np.sign(scaled) * np.floor(np.abs(scaled) + 0.5))  # ties that half away would round elsewhere
    expected = np.zeros((4, 292), np.uint8)
    expected[:, :4] = (2.0 ** np.array([-20, -3, 0, 5], dtype=np.float32))[:, None].view(np.uint8)
    expected[:, 4:260] = q.view(np.uint8)
    expected[:, 260:] = q.astype(np.int16).reshape(4, 16, 16).sum(axis=2).astype("<i2").view(np.uint8)
    np.testing.assert_array_equal(quant.get("Q8_K").quantize(x), expected)


@pytest.mark.parametrize("name", NAMES)
def test_rows_that_are_not_whole_blocks_are_refused_with_a_clear_error(name):
    qt = quant.get(name)
    with pytest.raises(TensorError, match=name):
        qt.dequantize(np.zeros((2, qt.type_size + 1), dtype=np.uint8))
    if qt.quantize is not None and qt.block_size > 1:
        with pytest.raises(TensorError, match=name):
            qt.quantize(np.zeros((2, qt.block_size + 1), dtype=np.float32))


# -- llama.cpp's own outputs ------------------------------------------------------------------------------

REFERENCE_TYPES = sorted(p.stem for p in (REFERENCE_DIR / "quant").glob("*.npz"))


def reference(name):
    return np.load(REFERENCE_DIR / "quant" / f"{name}.npz")


@pytest.mark.parametrize("name", [n for n in REFERENCE_TYPES if quant.is_supported(n)])
def test_llamacpp_reference_dequantize_quantize_and_dot(name):
    ref = reference(name)
    qt = quant.get(name)
    q = ref["q"].reshape(ref["x"].shape[0], -1)
    np.testing.assert_array_equal(bits(qt.dequantize(q)), bits(ref["deq"].reshape(q.shape[0], -1)))
    if qt.quantize is not None:
        # llama.cpp made `q` with ggml_quantize_chunk and no importance matrix: the _ref quantizers, the
        # path every localllm quantizer follows, so no type is an exception. (IQ4_NL and IQ4_XS have no
        # file here: their quantizers are checked against ggml's in tests/quantize/test_quantize.py.)
        np.testing.assert_array_equal(qt.quantize(ref["x"]).reshape(q.shape), q)
    if "dot" not in ref.files:
        return  # llama.cpp has no vec_dot for this type (Q8_K is only ever an activation format)
    n = ref["x"].shape[1]
    deq = ref["deq"].reshape(q.shape[0], -1).astype(np.float64)
    act = QuantizedActivation(qt.act, n)
    for r in range(q.shape[0]):
        args = act.quantize(ref["y"][r])
        got = float(kernel_record(qt).vec_dot(q[r], *args))
        ours_a = dequantized_activation(qt, args, ref["y"][r])
        llama_a, llama_s = llama_activation(int(ref["vec_dot_type"]), ref["yq"][r], ref["y"][r])
        # Beyond summation order (DOT_RTOL), the two differ only where llama.cpp holds the activation
        # differently: F16/BF16 activations for float weights (a term sum |w| |a_ours - a_llama|), and
        # Q8_1's block sum s stored as float16 (relative error 2^-11, times the block's largest weight,
        # which bounds the Q4_1/Q5_1 minimum it multiplies).
        bound = DOT_RTOL * float(np.abs(deq[r] * ours_a).sum()) + float(np.abs(deq[r]) @ np.abs(ours_a - llama_a))
        if llama_s is not None:
            bound += 2.0**-11 * float(np.abs(deq[r]).reshape(-1, 32).max(axis=1) @ np.abs(llama_s)) * 1.01
        assert abs(got - float(ref["dot"][r])) <= bound + 1e-30, (name, r, got, float(ref["dot"][r]))


def llama_activation(vec_dot_type: int, yq: np.ndarray, y: np.ndarray):
    """llama.cpp's quantized activation row as float64 values, and Q8_1's stored block sums."""
    if vec_dot_type == 0:  # F32
        return y.astype(np.float64), None
    if vec_dot_type == 1:  # F16
        return yq.view(np.float16).astype(np.float64), None
    if vec_dot_type == 30:  # BF16
        return (yq.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64), None
    if vec_dot_type == 8:  # Q8_0: f16 d, int8 qs[32]
        blocks = yq.reshape(-1, 34)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float64)
        return (d * blocks[:, 2:].view(np.int8)).reshape(-1), None
    if vec_dot_type == 9:  # Q8_1: f16 d, f16 s (= d * sum qs), int8 qs[32]
        blocks = yq.reshape(-1, 36)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float64)
        s = blocks[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(-1)
        return (d * blocks[:, 4:].view(np.int8)).reshape(-1), s
    if vec_dot_type == 15:  # Q8_K: f32 d, int8 qs[256], int16 bsums[16]
        blocks = yq.reshape(-1, 292)
        d = blocks[:, :4].copy().view(np.float32).astype(np.float64)
        return (d * blocks[:, 4:260].view(np.int8)).reshape(-1), None
    raise AssertionError(f"unexpected vec_dot_type {vec_dot_type}")


def test_every_registered_type_has_a_reference_or_an_oracle():
    """Nothing in the registry goes unchecked: each type is in gguf.quants or in llama.cpp's vectors."""
    for name in NAMES:
        assert name in IN_GGUF or name in REFERENCE_TYPES, name
