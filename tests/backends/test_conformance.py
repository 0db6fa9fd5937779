"""Backend conformance (as llama.cpp's test-backend-ops): every op of the interface (backends/base.py) on
every backend of the registry, for every quant type the backend supports, against a plain NumPy float64
reference (conformance_reference.py: each bound derived there).

The op calls are written once (conformance_runs.py); the CPU backend runs them in this process, the CUDA
backend under numba's CUDA simulator in a child process (backend_targets.py), each on the sizes that
reach its paths (backend_targets.FULL, .SIMULATOR). A matrix product must be within the bound of the
product with the float32 activation or of the one with the activation in the weight type's pairing format
(Q8_0 / Q8_K, as llama.cpp's integer dot products take it). Exact where the interface promises exact
results: embed equals the quant module's dequantization; take_rows, kv_store, kv_store_paged, add and
scale equal NumPy's bits; matmul_rows, matmul_segments and matmul_experts equal the matmuls they stand
for, and attention_paged equals attention on a contiguous cache, bit for bit.

Run it: python -m pytest -q tests/backends/test_conformance.py (-k cpu, -k cuda for one backend).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from backend_targets import ATTENTION_SMALL, Targets, profile_of
from conformance_reference import (
    U,
    attention_reference,
    dequantized,
    delta_net_reference,
    gated_act_reference,
    layer_norm_reference,
    matmul_references,
    pairing_block,
    rms_norm_reference,
    rope_reference,
    short_conv_reference,
)
from localllm import quant
from localllm.backends import BACKENDS
from localllm.model.kv_paged import BatchLayout

BACKEND_NAMES = list(BACKENDS)
TYPE_NAMES = quant.supported_names()  # the names of quant.all_types(), without importing every module
# Registered types a backend's supports() declines (test_supports_every_registered_type_... checks it): none today, the CUDA
# backend converting the types it has no kernel for to float16 at upload.
UNSUPPORTED: dict[str, tuple[str, ...]] = {name: () for name in BACKEND_NAMES}


@pytest.fixture(scope="module")
def targets():
    started = Targets()
    yield started
    started.close()


def per_backend(values_of, ids=str):
    """Parameters (backend name, value) for each value of that backend's profile."""
    return [pytest.param(name, value, id=f"{name}-{ids(value)}")
            for name in BACKEND_NAMES for value in values_of(profile_of(name))]


def per_backend_and_type(values_of=None, ids=str):
    """Parameters (backend name, quant type[, value of the backend's profile]) over the types the
    backend supports."""
    params = []
    for name in BACKEND_NAMES:
        for qtype in TYPE_NAMES:
            if qtype in UNSUPPORTED[name]:
                continue
            if values_of is None:
                params.append(pytest.param(name, qtype, id=f"{name}-{qtype}"))
            else:
                params += [pytest.param(name, qtype, v, id=f"{name}-{qtype}-{ids(v)}") for v in values_of(profile_of(name))]
    return params


def rng_for(*parts) -> np.random.Generator:
    """A generator seeded by the test's parameters (str hashes vary per process; crc32 does not)."""
    return np.random.default_rng(zlib.crc32("/".join(map(str, parts)).encode()))


def random_weight(rng, qtype: str, n: int, k: int) -> np.ndarray:
    """uint8[n, row_bytes]: values ~N(0, 0.05) through the type's own quantizer."""
    return quant.get(qtype).quantize(rng.normal(0, 0.05, (n, k)).astype(np.float32)).reshape(n, -1)


def bound_failure(got: np.ndarray, ref: np.ndarray, bound: np.ndarray) -> str | None:
    """None if |got - ref| <= bound everywhere, else what is past it."""
    err = np.abs(got.astype(np.float64) - ref)
    bad = ~(err <= bound)  # NaN fails too
    if not bad.any():
        return None
    i = np.unravel_index(np.argmax(np.where(bad, err / np.maximum(bound, 1e-300), 0)), err.shape)
    return (f"{bad.sum()} of {bad.size} values past the bound; worst at {i}: got {got[i]!r}, reference "
            f"{ref[i]!r}, |diff| {err[i]:.3e} > bound {bound[i]:.3e}")


def assert_within(got: np.ndarray, ref: np.ndarray, bound: np.ndarray, what: str) -> None:
    failure = bound_failure(got, ref, bound)
    if failure:
        pytest.fail(f"{what}: {failure}", pytrace=False)


def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, what
    unsigned = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    differ = got.view(unsigned) != want.view(unsigned)
    assert not differ.any(), f"{what}: {differ.sum()} of {differ.size} values differ, first at {np.argwhere(differ)[0]}"


# ----- quant types and matrix products -------------------------------------------------------------------------


@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
def test_supports_every_registered_type_but_the_declared_ones(targets, backend_name):
    for qtype in TYPE_NAMES:
        assert targets[backend_name].run("supports", qtype=qtype) == (qtype not in UNSUPPORTED[backend_name]), qtype


def check_product(out, qtype, raw, held_as, x, bias, what):
    """out within the bound of the product with the float32 activation, or of the one with the activation
    in the type's pairing format (conformance_reference, "matmul"), as the backend holds the weight."""
    assert held_as in (qtype, "F16"), f"{what}: the backend holds the weight as {held_as}"
    references = matmul_references(dequantized(qtype, raw, held_as), x, bias, pairing_block(qtype))
    failures = {kind: bound_failure(out, ref, bound) for kind, (ref, bound) in references.items()}
    if all(failures.values()):
        pytest.fail(f"{what}: " + "; ".join(f"with the {kind} activation, {f}" for kind, f in failures.items()), pytrace=False)


@pytest.mark.parametrize("backend_name,qtype,rows", per_backend_and_type(lambda p: p.batches, ids=lambda t: f"T{t}"))
def test_matmul(targets, backend_name, qtype, rows):
    """T=1 twice through one weight (without, then with a bias); T>1 with a bias where T is odd."""
    p = profile_of(backend_name)
    rng = rng_for("matmul", backend_name, qtype, rows)
    raw = random_weight(rng, qtype, p.n_out, p.k)
    bias = rng.normal(0, 0.1, p.n_out).astype(np.float32)
    batches = [rng.normal(0, 1, (rows, p.k)).astype(np.float32) for _ in range(2 if rows == 1 else 1)]
    biases = [None, bias] if rows == 1 else [bias if rows % 2 else None]
    got = targets[backend_name].run("matmul", qtype=qtype, raw=raw, k=p.k, batches=batches, biases=biases)
    for call, (x, b, out) in enumerate(zip(batches, biases, got["outs"])):
        check_product(out, qtype, raw, got["held_as"], x, b, f"{backend_name} {qtype} T={rows} call {call}")


# The quants of the first block of every row moved by one step (bit 0 of each 4-bit quant flipped): the
# references of that matrix must be out of their bounds somewhere in the product of the true one, or the
# bounds could not see one wrong block. (type: the bytes of a block holding its quants)
BROKEN_QUANTS = {"Q4_0": slice(2, 18), "Q4_K": slice(16, 144)}


@pytest.mark.parametrize("backend_name,qtype", [pytest.param(b, q, id=f"{b}-{q}") for b in BACKEND_NAMES for q in BROKEN_QUANTS])
def test_matmul_bound_catches_one_wrong_block(targets, backend_name, qtype):
    p = profile_of(backend_name)
    rng = rng_for("broken", backend_name, qtype)
    raw = random_weight(rng, qtype, p.n_out, p.k)
    x = rng.normal(0, 1, (1, p.k)).astype(np.float32)
    got = targets[backend_name].run("matmul", qtype=qtype, raw=raw, k=p.k, batches=[x], biases=[None])
    blocks = raw.copy().reshape(raw.shape[0], -1, quant.get(qtype).type_size)
    blocks[:, 0, BROKEN_QUANTS[qtype]] ^= 0x11
    broken = dequantized(qtype, blocks.reshape(raw.shape), got["held_as"])
    for kind, (ref, bound) in matmul_references(broken, x, None, pairing_block(qtype)).items():
        assert (np.abs(got["outs"][0] - ref) > bound).any(), kind


@pytest.mark.parametrize("backend_name,qtype,rows", per_backend_and_type(lambda p: p.rows_batches, ids=lambda t: f"T{t}"))
def test_matmul_rows_equal_single_row_matmuls(targets, backend_name, qtype, rows):
    """Each row exactly as a T=1 matmul computes it (the server's batched decode), and within the bound."""
    p = profile_of(backend_name)
    rng = rng_for("rows", backend_name, qtype, rows)
    raw = random_weight(rng, qtype, p.n_out, p.k)
    x = rng.normal(0, 1, (rows, p.k)).astype(np.float32)
    bias = rng.normal(0, 0.1, p.n_out).astype(np.float32)
    got = targets[backend_name].run("matmul_rows", qtype=qtype, raw=raw, k=p.k, x=x, bias=bias)
    assert_bits_equal(got["together"], got["alone"], f"{backend_name} {qtype} matmul_rows T={rows}")
    check_product(got["together"], qtype, raw, got["held_as"], x, bias, f"{backend_name} {qtype} matmul_rows")


@pytest.mark.parametrize("backend_name,qtype", per_backend_and_type())
def test_matmul_segments_equal_each_segment_alone(targets, backend_name, qtype):
    p = profile_of(backend_name)
    rng = rng_for("segments", backend_name, qtype)
    raw = random_weight(rng, qtype, p.n_out, p.k)
    x = rng.normal(0, 1, (p.bounds[-1], p.k)).astype(np.float32)
    bias = rng.normal(0, 0.1, p.n_out).astype(np.float32)
    got = targets[backend_name].run("matmul_segments", qtype=qtype, raw=raw, k=p.k, x=x, bounds=p.bounds, bias=bias)
    assert_bits_equal(got["together"], got["alone"], f"{backend_name} {qtype} segments {p.bounds}")
    for a, b in zip(p.bounds[:-1], p.bounds[1:]):  # each its own path (the CPU: BLAS for a long one)
        check_product(got["together"][a:b], qtype, raw, got["held_as"], x[a:b], bias, f"{backend_name} {qtype} segment {a}:{b}")


@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("backend_name,qtype", per_backend_and_type())
def test_matmul_experts_equal_each_row_through_its_expert_alone(targets, backend_name, qtype, with_bias):
    """Three experts; rows grouped as routing groups them (expert 2 then 0, expert 1 unused): every row
    exactly as a T=1 matmul of its expert computes it (with its bias, gpt-oss's), and within the bound of
    that expert's product."""
    p = profile_of(backend_name)
    rng = rng_for("experts", backend_name, qtype, with_bias)
    n_expert, groups, bounds = 3, [0, 2], [0, 3, 5]
    rows = max(16, p.n_out // 16 * 16)  # whole tiles of 16 rows: where the CPU has a grouped kernel, it runs
    raw = random_weight(rng, qtype, n_expert * rows, p.k)
    x = rng.normal(0, 1, (bounds[-1], p.k)).astype(np.float32)
    bias = rng.normal(0, 0.1, (n_expert, rows)).astype(np.float32) if with_bias else None
    got = targets[backend_name].run("matmul_experts", qtype=qtype, raw=raw, k=p.k, n_expert=n_expert, x=x,
                                    groups=groups, bounds=bounds, bias=bias)
    assert_bits_equal(got["together"], got["alone"], f"{backend_name} {qtype} matmul_experts")
    for g, expert in enumerate(groups):
        a, b = bounds[g], bounds[g + 1]
        check_product(got["together"][a:b], qtype, raw[expert * rows : (expert + 1) * rows], got["held_as"],
                      x[a:b], None if bias is None else bias[expert], f"{backend_name} {qtype} expert {expert}")


@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
def test_combine_experts_sums_weighted_rows_in_order(targets, backend_name):
    """out[t] = sum_j w[t, j] * src[slots[t, j]], j in order: within 2 float32 roundings per term of the
    float64 sum (a product and an add each; a fused multiply-add rounds once), repeats and any order of
    slots allowed."""
    rng = rng_for("combine", backend_name)
    src = rng.normal(0, 1, (9, 40)).astype(np.float32)
    slots = np.array([[4, 0, 8], [1, 1, 2], [8, 7, 3]], dtype=np.int32)
    weights = rng.uniform(0, 1, slots.shape).astype(np.float32)
    got = targets[backend_name].run("combine_experts", src=src, slots=slots, weights=weights)
    terms = weights[:, :, None].astype(np.float64) * src[slots].astype(np.float64)  # [T, J, E]
    bound = 2 * slots.shape[1] * U * np.abs(terms).sum(axis=1)
    assert_within(got, terms.sum(axis=1), bound, f"{backend_name} combine_experts")
    ordered = weights[:, 0, None] * src[slots[:, 0]]  # float32, as the CPU backend adds
    for j in range(1, slots.shape[1]):
        ordered = ordered + weights[:, j, None] * src[slots[:, j]]
    if backend_name == "cpu":
        assert_bits_equal(got, ordered, "cpu combine_experts in llama.cpp's order")


@pytest.mark.parametrize("backend_name,qtype", per_backend_and_type())
def test_embed_gives_the_dequantized_rows(targets, backend_name, qtype):
    """Exact: the rows as the quant module's NumPy reference dequantizes them (as the backend holds them)."""
    p = profile_of(backend_name)
    raw = random_weight(rng_for("embed", backend_name, qtype), qtype, p.n_out, p.k)
    ids = np.array([p.n_out - 1, 0, 3, 3], dtype=np.int32)  # last row, first row, a repeat
    got = targets[backend_name].run("embed", qtype=qtype, raw=raw, k=p.k, ids=ids)
    want = dequantized(qtype, raw, got["held_as"])[ids].astype(np.float32)
    assert_bits_equal(got["out"], want, f"{backend_name} {qtype} embed")


@pytest.mark.parametrize("backend_name,qtype", [pytest.param(b, q, id=f"{b}-{q}") for b in BACKEND_NAMES for q in ("F16", "BF16")])
def test_float16_and_bfloat16_decode_as_numpy_widens_them(targets, backend_name, qtype):
    """Bit patterns through embed (all 65,536 where the profile allows, else a random 2,048), plus zeros,
    subnormals, the largest half, infinities and a NaN: equal to NumPy's widening (NaN as NaN), decoded by
    the backend's own kernels for the type (held as itself)."""
    n = profile_of(backend_name).f16_patterns
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    if n < 65536:
        bits = bits[rng_for("f16", backend_name).choice(65536, n, replace=False)]
    bits = np.concatenate([bits, np.array([0, 0x8000, 1, 1023, 1024, 0x7BFF, 0x7C00, 0xFC00, 0x8001, 0x7E01], np.uint16)])
    bits = np.resize(bits, (len(bits) + 31) // 32 * 32).reshape(-1, 32)
    want = bits.view(np.float16).astype(np.float32) if qtype == "F16" else (bits.astype(np.uint32) << 16).view(np.float32)
    got = targets[backend_name].run("embed", qtype=qtype, raw=bits.view(np.uint8), k=32,
                                    ids=np.arange(bits.shape[0], dtype=np.int32))
    assert got["held_as"] == qtype
    out, nan = got["out"], np.isnan(want)
    np.testing.assert_array_equal(np.isnan(out), nan)
    assert_bits_equal(out[~nan], want[~nan], f"{backend_name} {qtype} decoding")


@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
def test_take_rows_gathers_rows_exactly(targets, backend_name):
    """The batched forward's gather of each sequence's last row: any order, repeats allowed."""
    x = rng_for("take", backend_name).normal(0, 1, (7, 12)).astype(np.float32)
    rows = np.array([3, 0, 6, 6], dtype=np.int32)
    assert_bits_equal(targets[backend_name].run("take_rows", x=x, rows=rows), x[rows], f"{backend_name} take_rows")


# ----- row ops -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("backend_name,shape", per_backend(lambda p: p.norm_shapes, ids=lambda s: "x".join(map(str, s))))
def test_layer_norm(targets, backend_name, shape, in_place, with_bias):
    """Rows of the last axis, off-centre (mean 3) so that the centring matters."""
    rng = rng_for("layer_norm", backend_name, shape, with_bias)
    x = rng.normal(3, 2, shape).astype(np.float32)
    weight = rng.normal(1, 0.1, shape[-1]).astype(np.float32)
    bias = rng.normal(0, 0.5, shape[-1]).astype(np.float32) if with_bias else None
    got = targets[backend_name].run("layer_norm", x=x, weight=weight, bias=bias, eps=1e-12, in_place=in_place)
    assert_within(got, *layer_norm_reference(x, weight, bias, 1e-12), f"{backend_name} layer_norm {shape}")


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("backend_name,shape", per_backend(lambda p: p.norm_shapes, ids=lambda s: "x".join(map(str, s))))
def test_rms_norm(targets, backend_name, shape, in_place):
    """Rows of the last axis ([T, H, D]: T*H rows, as the Q/K norms; [T, D]); in place as those run."""
    rng = rng_for("rms", backend_name, shape)
    x = rng.normal(0, 2, shape).astype(np.float32)
    weight = rng.normal(1, 0.1, shape[-1]).astype(np.float32)
    got = targets[backend_name].run("rms_norm", x=x, weight=weight, eps=1e-6, in_place=in_place)
    assert_within(got, *rms_norm_reference(x, weight, 1e-6), f"{backend_name} rms_norm {shape}")


_FACTORS: dict[int, np.ndarray] = {}


def rope_factors(n_rot: int) -> np.ndarray:
    """float32[n_rot/2] RoPE frequency factors, one array per n_rot for the whole session: the CPU backend
    keys its frequencies by the factors array's id(), as a model's arrays (alive as long as it) allow."""
    if n_rot not in _FACTORS:
        _FACTORS[n_rot] = rng_for("factors", n_rot).uniform(1, 4, n_rot // 2).astype(np.float32)
    return _FACTORS[n_rot]


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
@pytest.mark.parametrize("backend_name,shape", per_backend(lambda p: p.rope_shapes, ids=lambda s: "x".join(map(str, s))))
def test_rope(targets, backend_name, shape, neox):
    """Partial rotation (n_rot < D) with frequency factors, a frequency scale and an mscale (YaRN's,
    LongRoPE's attention factor); a full one without; positions up to 97,500 (float32 angles lose digits
    there: the bound grows with the angle)."""
    n_tok, n_head, head_dim, n_rot = shape
    rng = rng_for("rope", backend_name, shape, neox)
    x = rng.normal(0, 1, (n_tok, n_head, head_dim)).astype(np.float32)
    positions = np.array([0, 7, 1000] if n_tok == 3 else [5] if n_tok == 1 else np.arange(n_tok) * 2500, np.int32)
    factors, freq_scale, mscale = (rope_factors(n_rot), 0.5, 1.19) if n_rot < head_dim else (None, 1.0, 1.0)
    got = targets[backend_name].run("rope", x=x, positions=positions, n_rot=n_rot, base=10000.0, neox=neox,
                                    factors=factors, freq_scale=freq_scale, mscale=mscale)
    assert_within(got, *rope_reference(x, positions, n_rot, 10000.0, neox, factors, freq_scale, mscale),
                  f"{backend_name} rope")
    assert not np.allclose(got, x)  # it rotated something


# ----- KV cache and attention ------------------------------------------------------------------------------------

# float32 values whose float16 rounding is a corner: ties to even, subnormals, the largest half and the
# first values past it (65520 rounds to inf), infinities, signed zeros
F16_CORNERS = [0.0, -0.0, 1.0, -2.5, 65504.0, 65519.0, 65520.0, -65536.0, 1e6, -1e6, 6.1e-5, 6.0e-5, 3e-8,
               2.98e-8, 1e-9, 1e-8, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 2049.0, 2051.0, 0.1, -0.3333, 1e-4, 5.96e-8,
               2.0**-24, 1.5 * 2.0**-24, 2.0**-25, np.inf, -np.inf]


@pytest.mark.parametrize("backend_name,rows", per_backend(lambda p: p.kv_rows, ids=lambda t: f"T{t}"))
def test_kv_store_rounds_to_float16_as_numpy(targets, backend_name, rows):
    """Rows start..start+T of both caches equal NumPy's float32 -> float16 rounding bit for bit (values
    from 1e-9 to 1e5 and the corners); the rows around them stay as alloc left them (zero)."""
    p = profile_of(backend_name)
    n_kv, start = 2, 3
    rng = rng_for("kv", backend_name, rows)
    scales = np.logspace(-9, 5, rows * n_kv * p.kv_head_dim)
    values = (rng.normal(0, 1, scales.shape) * scales).astype(np.float32)
    values[: len(F16_CORNERS)] = F16_CORNERS
    k = values.reshape(rows, n_kv, p.kv_head_dim)
    v = -values[::-1].reshape(k.shape)
    n_ctx = start + rows + 2
    got = targets[backend_name].run("kv_store", k=k, v=v, n_ctx=n_ctx, start=start)
    for name, src in (("k", k), ("v", v)):
        want = np.zeros((n_ctx, *k.shape[1:]), np.float16)
        with np.errstate(over="ignore"):  # the values past float16's range, on purpose
            want[start : start + rows] = src
        assert_bits_equal(got[name], want, f"{backend_name} kv_store {name}")


def attention_inputs(rng, case):
    """q float32[T, Hq, D]; caches float16[n_ctx, Hkv, D] whose rows past start + T hold 30000: a backend
    that reads a key it must not see gets a result far off."""
    n_ctx = case.start + case.n_tokens + 3
    q = rng.normal(0, 1, (case.n_tokens, case.n_head, case.head_dim)).astype(np.float32)
    k, v = (rng.normal(0, 1, (n_ctx, case.n_kv, case.head_dim)).astype(np.float16) for _ in range(2))
    k[case.start + case.n_tokens :] = v[case.start + case.n_tokens :] = 30000.0
    return q, k, v


@pytest.mark.parametrize("backend_name,case", per_backend(lambda p: p.attention, ids=lambda c: c.name))
def test_attention(targets, backend_name, case):
    rng = rng_for("attention", backend_name, case.name)
    q, k, v = attention_inputs(rng, case)
    sinks = rng.normal(1.0, 1.0, case.n_head).astype(np.float32) if case.sinks else None  # near the scores' range
    scale = case.head_dim**-0.5
    got = targets[backend_name].run("attention", q=q, cache_k=k, cache_v=v, start=case.start, scale=scale,
                                    window=case.window, softcap=case.softcap, sinks=sinks)
    positions = case.start + np.arange(case.n_tokens)
    assert_within(got, *attention_reference(q, k, v, positions, scale, case.window, case.softcap, sinks),
                  f"{backend_name} attention {case}")
    if case.softcap or case.sinks:  # the cap or the sinks change the result: without, the reference is off
        plain, _ = attention_reference(q, k, v, positions, scale, case.window)
        assert np.abs(plain - got).max() > 1e-2


@pytest.mark.parametrize("backend_name,case", per_backend(lambda p: p.attention, ids=lambda c: c.name))
def test_attention_bidirectional(targets, backend_name, case):
    """Encoders' attention: every row sees all start + T keys (the cases' windows and caps do not apply;
    their sinks do)."""
    rng = rng_for("attention_bidirectional", backend_name, case.name)
    q, k, v = attention_inputs(rng, case)
    sinks = rng.normal(1.0, 1.0, case.n_head).astype(np.float32) if case.sinks else None
    scale = case.head_dim**-0.5
    got = targets[backend_name].run("attention_bidirectional", q=q, cache_k=k, cache_v=v, start=case.start, scale=scale,
                                    sinks=sinks)
    last = np.full(case.n_tokens, case.start + case.n_tokens - 1)
    assert_within(got, *attention_reference(q, k, v, last, scale, 0, 0.0, sinks), f"{backend_name} attention_bidirectional {case}")
    if case.n_tokens > 1:  # the causal mask would change the first rows
        causal, _ = attention_reference(q, k, v, case.start + np.arange(case.n_tokens), scale, 0, 0.0, sinks)
        assert np.abs(causal - got).max() > 1e-2


@pytest.mark.parametrize("case", [c for c in ATTENTION_SMALL if not c.window], ids=lambda c: c.name)
def test_attention_bidirectional_default(case):
    """The interface's own attention_bidirectional (one `attention` call per row, which the CUDA backend
    inherits), run on the CPU backend's attention: as the reference."""
    from localllm.backends.base import Backend
    from localllm.backends.cpu.backend import CPUBackend

    rng = rng_for("attention_bidirectional_default", case.name)
    q, k, v = attention_inputs(rng, case)
    sinks = rng.normal(1.0, 1.0, case.n_head).astype(np.float32) if case.sinks else None
    scale = case.head_dim**-0.5
    out = np.zeros_like(q)
    Backend.attention_bidirectional(CPUBackend(threads=2), q, k, v, case.start, scale, out, sinks)
    last = np.full(case.n_tokens, case.start + case.n_tokens - 1)
    assert_within(out, *attention_reference(q, k, v, last, scale, 0, 0.0, sinks), f"default attention_bidirectional {case}")


def paged_layout(rng, sequences, block_size):
    """A BatchLayout of the sequences [(first position, rows)] over shuffled blocks (with unused ones)."""
    per_seq = [-(-(start + rows) // block_size) for start, rows in sequences]
    blocks = rng.permutation(sum(per_seq) + 2).astype(np.int32)
    tables = np.zeros((len(sequences), max(per_seq)), np.int32)
    used = 0
    for s, n in enumerate(per_seq):
        tables[s, :n] = blocks[used : used + n]
        used += n
    row_seq = np.concatenate([np.full(rows, s, np.int32) for s, (_, rows) in enumerate(sequences)])
    positions = np.concatenate([np.arange(start, start + rows, dtype=np.int32) for start, rows in sequences])
    slots = (tables[row_seq, positions // block_size] * block_size + positions % block_size).astype(np.int32)
    seq_rows = np.array([rows for _, rows in sequences], np.int32)
    return BatchLayout(tokens=np.zeros(len(row_seq), np.int32), positions=positions, slots=slots, row_seq=row_seq,
                       tables=tables, seq_first=np.concatenate([[0], np.cumsum(seq_rows)[:-1]]).astype(np.int32),
                       seq_rows=seq_rows, seq_start=np.array([start for start, _ in sequences], np.int32),
                       block_size=block_size), len(blocks)


@pytest.mark.parametrize("softcap,sinks", [(0.0, False), (0.8, False), (0.0, True)], ids=["", "softcap", "sinks"])
@pytest.mark.parametrize("window", [0, 3], ids=["causal", "window"])
@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
def test_paged_store_and_attention(targets, backend_name, window, softcap, sinks):
    """Sequences over shuffled blocks of 4 positions (a decode row, a short chunk, and on the CPU a chunk
    long enough for BLAS): the store puts each row at its slot (NumPy's float16 rounding, nothing else
    touched); each row's attention is within the bound of the reference over its sequence's keys, and
    equal to `attention` of its sequence's rows on a contiguous cache, bit for bit."""
    sequences = profile_of(backend_name).paged_sequences
    rng = rng_for("paged", backend_name, window)
    n_head, n_kv, head_dim, block_size = 4, 2, 16, 4
    layout, n_blocks = paged_layout(rng, sequences, block_size)
    n_rows = len(layout.row_seq)
    cache_k, cache_v = (rng.normal(0, 1, (n_blocks, block_size, n_kv, head_dim)).astype(np.float16) for _ in range(2))
    k, v, q = (rng.normal(0, 1, (n_rows, h, head_dim)).astype(np.float32) for h in (n_kv, n_kv, n_head))
    sinks = rng.normal(1.0, 1.0, n_head).astype(np.float32) if sinks else None
    want_k, want_v = cache_k.copy(), cache_v.copy()
    want_k.reshape(-1, n_kv, head_dim)[layout.slots] = k
    want_v.reshape(-1, n_kv, head_dim)[layout.slots] = v
    contiguous = []  # each sequence's keys and values in position order: [first position + rows, Hkv, D]
    for s, (start, rows) in enumerate(sequences):
        positions = np.arange(start + rows)
        slots = layout.tables[s, positions // block_size] * block_size + positions % block_size
        contiguous.append((want_k.reshape(-1, n_kv, head_dim)[slots], want_v.reshape(-1, n_kv, head_dim)[slots]))
    got = targets[backend_name].run("paged", q=q, k=k, v=v, cache_k=cache_k, cache_v=cache_v, layout=layout,
                                    scale=0.3, window=window, contiguous=contiguous, softcap=softcap, sinks=sinks)
    assert_bits_equal(got["k"], want_k, f"{backend_name} kv_store_paged k")
    assert_bits_equal(got["v"], want_v, f"{backend_name} kv_store_paged v")
    for s, (keys, values) in enumerate(contiguous):
        rows = slice(layout.seq_first[s], layout.seq_first[s] + layout.seq_rows[s])
        ref, bound = attention_reference(q[rows], keys, values, layout.positions[rows], 0.3, window, softcap, sinks)
        assert_within(got["out"][rows], ref, bound, f"{backend_name} attention_paged sequence {s}")
    assert_bits_equal(got["out"], got["alone"], f"{backend_name} attention_paged against attention")


# ----- elementwise -------------------------------------------------------------------------------------------------

# Gates below -87 are left out: the CPU's exp (backends/cpu/kernels._exp_nonpositive) returns e^-87 for
# them by design (the floor of float32's normal range), so its SiLU there is g e^-87 instead of g e^g:
# a relative error up to e^(-87 - g), under 1e-35 absolute. Not a bound to widen; reported (issue 27).
GATE_CORNERS = [-12.0, -10.0, -9.99, 9.99, 10.0, 12.0, 0.0, -0.0, 1e-6, -1e-6, 1e-9, 30.0, -30.0, 87.0, -87.0]


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("kind", ["silu", "gelu_tanh", "swiglu_oai", "sigmoid"])
@pytest.mark.parametrize("backend_name,shape", per_backend(lambda p: p.act_shapes, ids=lambda s: "x".join(map(str, s))))
def test_gated_act(targets, backend_name, shape, kind, in_place):
    """act(gate) * up; gates ~N(0, 3) and the corners of the CPU's GELU table (|g| >= 10 computed, not
    looked up) and of exp; in place (out is gate) as the decoder runs it. gpt-oss's clamped SwiGLU gets
    up values past its clamp (+-7) too."""
    rng = rng_for("act", backend_name, shape, kind)
    gate = rng.normal(0, 3, shape).astype(np.float32)
    gate.reshape(-1)[: len(GATE_CORNERS)] = GATE_CORNERS
    up = rng.normal(0, 5 if kind == "swiglu_oai" else 1, shape).astype(np.float32)
    got = targets[backend_name].run("gated_act", gate=gate, up=up, kind=kind, in_place=in_place)
    assert_within(got, *gated_act_reference(gate, up, kind), f"{backend_name} {kind}")


@pytest.mark.parametrize("silu", [False, True], ids=["plain", "silu"])
@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
def test_short_conv_carries_its_window_across_calls(targets, backend_name, silu):
    """A prompt, a decode step and a short chunk of one sequence, through a window that starts at zero:
    each part's output as the float64 convolution over the whole sequence gives it, and the window
    after them its last K-1 inputs, bit for bit (copied, not computed)."""
    rng = rng_for("short_conv", backend_name, silu)
    k, c = 4, 40
    weight = rng.normal(0, 0.5, (c, k)).astype(np.float32)
    parts = [rng.normal(0, 1, (n, c)).astype(np.float32) for n in (5, 1, 2)]
    got = targets[backend_name].run("short_conv", x_parts=parts, weight=weight, silu=silu)
    ref, bound, window = short_conv_reference(np.concatenate(parts), weight, np.zeros((k - 1, c), np.float32), silu)
    assert_within(np.concatenate(got["outs"]), ref, bound, f"{backend_name} short_conv")
    assert_bits_equal(got["window"], window, f"{backend_name} short_conv window")


def delta_net_inputs(rng, n_tokens, n_k, n_v, size):
    """One part of a sequence as the model feeds delta_net: q and k L2-normalised per head, v ~ N(0, 1),
    log decays g in (-2.5, 0) (-softplus of N(0, 1)), beta in (0, 1)."""
    def unit(x):
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)
    return {"q": unit(rng.normal(0, 1, (n_tokens, n_k, size))), "k": unit(rng.normal(0, 1, (n_tokens, n_k, size))),
            "v": rng.normal(0, 1, (n_tokens, n_v, size)).astype(np.float32),
            "g": (-np.log1p(np.exp(rng.normal(0, 1, (n_tokens, n_v))))).astype(np.float32),
            "beta": (1 / (1 + np.exp(-rng.normal(0, 1, (n_tokens, n_v))))).astype(np.float32)}


# delta_net against its float64 token loop: with ||k|| = 1, beta <= 1 and decays <= 1 each step is a
# contraction of the state, so rounding does not grow along the sequence. Measured on the CPU (heads of
# 16, 64 and 128, up to 32 of them, up to 200 tokens, three seeds each): worst 1.0e-7 for the token loop
# and 3.5e-7 for the chunks, against outputs up to 0.5 and states of order 1. The bound leaves a
# factor of five.
DELTA_NET_TOLERANCE = 2e-6


@pytest.mark.parametrize("grouped", [False, True], ids=["tiled", "grouped"])
@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
def test_delta_net_matches_the_token_loop(targets, backend_name, grouped):
    """A 70-token prompt (past the CPU's 64-token chunk: two chunks), two decode steps and a 5-token
    chunk of one sequence, four value heads on two key heads (tiled: h % 2, Qwen3.5; grouped: h // 2,
    Qwen3-Next), from a nonzero state: each output and the state after, against the float64 token loop."""
    rng = rng_for("delta_net", backend_name, grouped)
    n_k, n_v, size = 2, 4, 16
    parts = [delta_net_inputs(rng, n, n_k, n_v, size) for n in (70, 1, 1, 5)]
    state = rng.normal(0, 0.3, (n_v, size, size)).astype(np.float32)
    got = targets[backend_name].run("delta_net", parts=parts, state=state, grouped=grouped)
    whole = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    ref_out, ref_state = delta_net_reference(whole["q"], whole["k"], whole["v"], whole["g"], whole["beta"], state,
                                             grouped)
    out = np.concatenate(got["outs"])
    assert np.abs(out - ref_out).max() <= DELTA_NET_TOLERANCE, np.abs(out - ref_out).max()
    assert np.abs(got["state"] - ref_state).max() <= DELTA_NET_TOLERANCE, np.abs(got["state"] - ref_state).max()


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
def test_add_is_float32_addition(targets, backend_name, in_place):
    """IEEE addition rounds correctly, so every float32 backend gives NumPy's float32 bits; in place as
    the residual adds run."""
    a, b = rng_for("add", backend_name).normal(0, 1, (2, 7, 40)).astype(np.float32)  # [T, N] as the residuals
    got = targets[backend_name].run("add", a=a, b=b, in_place=in_place)
    assert_bits_equal(got, a + b, f"{backend_name} add")


@pytest.mark.parametrize("factor", [3.5, -0.125])
@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
def test_scale_is_float32_multiplication(targets, backend_name, factor):
    """Factors exact in float32, so that the product is one correctly rounded multiplication: NumPy's bits."""
    x = rng_for("scale", backend_name).normal(0, 1, (7, 40)).astype(np.float32)
    got = targets[backend_name].run("scale", x=x, factor=factor)
    assert_bits_equal(got, x * np.float32(factor), f"{backend_name} scale")


@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
def test_softcap_is_tanh_within_a_few_ulp(targets, backend_name):
    """cap * tanh(x / cap) for x from 0 to far past the cap (both signs, zero, and values where tanh is
    1 in float32): within 8 float32 ulps of cap (a division or product, tanh, a product) of float64."""
    x = rng_for("softcap", backend_name).normal(0, 40, (7, 40)).astype(np.float32)
    x[0, :6] = [0.0, -0.0, 1e-30, 1e4, -1e4, 29.99]
    cap = 30.0
    got = targets[backend_name].run("softcap", x=x, cap=cap)
    want = cap * np.tanh(x.astype(np.float64) / cap)
    assert np.abs(got - want).max() <= 8 * U * cap
    assert np.abs(got).max() <= cap


# ----- what the suite covers ----------------------------------------------------------------------------------

# Each op of the interface -> the run (conformance_runs.RUNS) that calls it; the interface's other methods
# (memory, kernels, steps) are not ops. A new op fails the test below until a run covers it.
OPS_RUN_BY = {"matmul": "matmul", "matmul_rows": "matmul_rows", "matmul_segments": "matmul_segments",
              "matmul_experts": "matmul_experts", "combine_experts": "combine_experts",
              "take_rows": "take_rows", "embed": "embed", "rms_norm": "rms_norm", "layer_norm": "layer_norm", "rope": "rope",
              "kv_store": "kv_store", "attention": "attention", "attention_bidirectional": "attention_bidirectional", "kv_store_paged": "paged", "attention_paged": "paged",
              "gated_act": "gated_act", "add": "add", "scale": "scale", "softcap": "softcap",
              "short_conv": "short_conv", "delta_net": "delta_net"}
NOT_OPS = {"plan_memory", "prepare_kernels", "wait_for_kernels", "supports", "upload", "alloc", "to_host",
           "begin_step", "end_step", "expert_matrices"}


def test_every_op_of_the_interface_is_run():
    from conformance_runs import RUNS
    from localllm.backends.base import Backend

    methods = {name for name, value in vars(Backend).items() if callable(value) and not name.startswith("_")}
    assert methods - NOT_OPS == set(OPS_RUN_BY)
    assert set(OPS_RUN_BY.values()) <= set(RUNS)


# ----- the sizes above against the CPU backend's thresholds -----------------------------------------------------


def test_cpu_profile_crosses_the_cpu_thresholds():
    """The FULL profile's sizes reach both sides of each CPU threshold they are chosen for (see
    backend_targets.FULL); a threshold that moves past them must move the sizes too."""
    from backend_targets import FULL
    from localllm.backends.cpu.backend import PARALLEL_STORE_ROWS
    from localllm.backends.cpu.threads import SMALL_ATTENTION_WORK, SMALL_OP_WORK
    from localllm.backends.cpu.attention_blas import BLOCK
    from localllm.backends.cpu.matmul import BLAS_MIN_ROWS, TILE_MIN_ROWS

    assert min(FULL.batches) == 1 and max(FULL.batches) >= BLAS_MIN_ROWS > max(t for t in FULL.batches if t < 18)
    assert min(FULL.rows_batches) < TILE_MIN_ROWS <= max(FULL.rows_batches) and FULL.n_out % 16
    segments = np.diff(FULL.bounds)
    assert segments.min() == 1 and segments.max() >= BLAS_MIN_ROWS
    for shapes in (FULL.norm_shapes, [(t, h, d) for t, h, d, _ in FULL.rope_shapes], FULL.act_shapes):
        sizes = [int(np.prod(s)) for s in shapes]
        assert min(sizes) < SMALL_OP_WORK <= max(sizes)
    assert min(FULL.kv_rows) < PARALLEL_STORE_ROWS <= max(FULL.kv_rows)
    work = [c.n_tokens * c.n_head * (c.start + c.n_tokens) * c.head_dim for c in FULL.attention if c.n_tokens < BLAS_MIN_ROWS]
    assert min(work) < SMALL_ATTENTION_WORK <= max(work)
    assert max(c.n_tokens for c in FULL.attention) > BLOCK and max(rows for _, rows in FULL.paged_sequences) >= BLAS_MIN_ROWS
