"""The instruction-set paths of vector.VectorCode give the same numbers, bit for bit.

VectorCode emits, per compile target, VNNI (vpdpbusd), GFNI (nibble split) and AVX-512 mask code where
the target has them ("auto"), plain AVX2 ("avx2"), or portable vector IR ("generic"). Each path computes
the same integer lanes, and the float code around them is the same IR, so every kernel must give the
same bits on every path. Uncached copies of the kernels are compiled with each path forced (each path
whose code differs on this target: quant_rows.isa_paths) and compared on random blocks (extreme bytes
included: -128 in Q8_0 quants, every fifth-bit pattern).
"""

from __future__ import annotations

import re
from pathlib import Path

import numba
import numpy as np
import pytest
from quant_rows import bits, isa_paths, random_rows

from localllm import quant
from localllm.backends.cpu.drivers import drivers, row_drivers
from localllm.backends.cpu.matmul import BatchActivation
from localllm.backends.cpu.quant_kernels import kernel_record, vector
from localllm.quant.activation import QuantizedActivation

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
N = 512


def _run_under(isa, fn, *args):
    """Call fn(*args) with VECTOR_ISA = isa, so that its first call compiles that path."""
    saved = vector.VECTOR_ISA
    vector.VECTOR_ISA = isa
    try:
        return fn(*args)
    finally:
        vector.VECTOR_ISA = saved


@pytest.mark.parametrize("name", TYPES)
def test_vec_dot_and_dequantize_equal_on_every_isa(name):
    rng = np.random.default_rng(21)
    qt = quant.get(name)
    raw = random_rows(name, 6, N, rng)
    act = QuantizedActivation(qt.act, N)
    acts = [tuple(a.copy() for a in act.quantize(rng.standard_normal(N).astype(np.float32) * 3)) for _ in range(3)]
    results = {}
    for isa in isa_paths():
        dot = numba.njit(fastmath=True, error_model="numpy")(kernel_record(qt).vec_dot.py_func)
        deq = numba.njit(error_model="numpy")(kernel_record(qt).dequantize_row.py_func)
        out = np.empty((raw.shape[0], N), dtype=np.float32)
        dots = np.array(
            [_run_under(isa, dot, row, *a) for a in acts for row in raw], dtype=np.float32
        )
        for r, row in enumerate(raw):
            _run_under(isa, deq, row, out[r])
        results[isa] = (bits(dots), bits(out))
    for isa in isa_paths()[1:]:
        np.testing.assert_array_equal(results[isa][0], results["auto"][0], err_msg=f"vec_dot, {isa} vs auto")
        np.testing.assert_array_equal(results[isa][1], results["auto"][1], err_msg=f"dequantize_row, {isa} vs auto")


@pytest.mark.parametrize("name", [n for n in TYPES if kernel_record(n).grid is not None])
def test_grid_drivers_equal_on_every_isa(name):
    rng = np.random.default_rng(22)
    qt = quant.get(name)
    raw = random_rows(name, 13, N, rng)
    act = QuantizedActivation(qt.act, N).quantize(rng.standard_normal(N).astype(np.float32))
    batch = BatchActivation(qt.act, 6, N).quantize(rng.standard_normal((6, N)).astype(np.float32))
    module = drivers(qt)
    results = {}
    for isa in isa_paths():
        matvec = numba.njit(fastmath=True)(module.matvec.py_func)
        matvec_rows = numba.njit(fastmath=True)(module.matvec_rows.py_func)
        one = np.empty(raw.shape[0], dtype=np.float32)
        many = np.empty((6, raw.shape[0]), dtype=np.float32)
        _run_under(isa, matvec, raw, one, *act)
        _run_under(isa, matvec_rows, raw, many, *batch)
        results[isa] = (bits(one), bits(many))
    for isa in isa_paths()[1:]:
        np.testing.assert_array_equal(results[isa][0], results["auto"][0], err_msg=f"matvec, {isa} vs auto")
        np.testing.assert_array_equal(results[isa][1], results["auto"][1], err_msg=f"matvec_rows, {isa} vs auto")


def test_auto_uses_the_instructions_the_host_has():
    features = set(numba.core.registry.cpu_target.target_context.codegen()._tm_features.split(","))
    qt = quant.get("Q5_0")
    dot = numba.njit(fastmath=True, error_model="numpy")(kernel_record(qt).vec_dot.py_func)
    raw = random_rows("Q5_0", 1, N, np.random.default_rng(23))
    dot(raw[0], *QuantizedActivation("q8_0", N).quantize(np.ones(N, dtype=np.float32)))
    asm = dot.inspect_asm(dot.signatures[0])
    if "+avxvnni" in features or {"+avx512vnni", "+avx512vl"} <= features:
        assert "vpdpbusd" in asm
    if "+gfni" in features:
        assert "vgf2p8affineqb" in asm
    if {"+avx512bw", "+avx512vl"} <= features:
        assert "kmovd" in asm


# Every type, IQ4_NL and IQ4_XS included since their vec_dot sums its blocks through fma_f32 (a fast-math
# `acc +=` was reordered differently in different drivers, and the rows differed in the last bits).
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n_rows", [2, 3, 4, 6, 7, 8, 9])
def test_batched_matvec_equals_vec_dot_on_long_rows(name, n_rows):
    # The batched decode (matvec_rows: grid, pair and 1x4 kernels) against each row's own vec_dot, on
    # rows of 2048 (8 super-blocks, 64 blocks): a kernel whose float accumulation drifts from vec_dot's
    # order shows here, where two blocks often round alike.
    rng = np.random.default_rng(24)
    qt = quant.get(name)
    k = 2048
    raw = random_rows(name, 11, k, rng, extremes=False)
    x = rng.standard_normal((n_rows, k)).astype(np.float32)
    batch = BatchActivation(qt.act, n_rows, k).quantize(x)
    out = np.empty((n_rows, raw.shape[0]), dtype=np.float32)
    row_drivers(qt).matvec_rows(raw, out, *batch)
    expected = np.array([[kernel_record(qt).vec_dot(row, *(a[t] for a in batch)) for row in raw] for t in range(n_rows)], dtype=np.float32)
    np.testing.assert_array_equal(bits(out), bits(expected))


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0"])
def test_matvec_over_a_large_matrix_takes_rows_apart_with_the_same_values(name):
    # From APART_MIN_BYTES the Q8_0 and Q4_0 decode matvecs read four rows a quarter of the matrix apart
    # a step (faster when the matrix streams from memory), the last N % 4 one by one: the same values as
    # vec_dot on every row, and as the four-row kernel on a slice below the size. 61 distinct rows
    # repeated, so that a row written to another part's place would not match.
    qt = quant.get(name)
    min_bytes = kernel_record(qt).grid.apart_min_bytes
    rng = np.random.default_rng(25)
    seed = random_rows(name, 61, 640, rng, extremes=False)
    n_rows = -(-min_bytes // seed.shape[1]) // 4 * 4 + 7  # N % 4 == 3
    raw = np.ascontiguousarray(np.tile(seed, (-(-n_rows // 61), 1))[:n_rows])
    assert raw.nbytes >= min_bytes
    args = QuantizedActivation("q8_0", 640).quantize(rng.standard_normal(640).astype(np.float32))
    out = np.full(raw.shape[0], np.nan, dtype=np.float32)
    drivers(qt).matvec(raw, out, *args)
    expected = np.array([kernel_record(qt).vec_dot(row, *args) for row in seed], dtype=np.float32)
    np.testing.assert_array_equal(bits(out), bits(expected)[np.arange(n_rows) % 61])
    small = np.empty(61, dtype=np.float32)
    drivers(qt).matvec(seed, small, *args)
    np.testing.assert_array_equal(bits(small), bits(expected))


def test_auto_only_features_are_the_features_the_auto_checks_read():
    # The per-path tests skip "avx2" on a target with none of vector.AUTO_ONLY_FEATURES, where it would
    # compile "auto"'s code again: a feature checked under "auto" and missing from that list would let
    # such a target skip a path that differs.
    kernels = Path(vector.__file__).parent
    read = set()
    for name in ("vector.py", "float_panels_ir.py", "amx_tiles.py"):
        read |= set(re.findall(r"[\"'](\+[a-z0-9-]+)[\"']", (kernels / name).read_text()))
    assert read - {"+avx2"} == set(vector.AUTO_ONLY_FEATURES)


def test_avx2_is_compiled_apart_exactly_where_auto_has_more():
    class Codegen:
        def __init__(self, features):
            self._tm_features = features

    class Context:
        def __init__(self, features):
            self._codegen = Codegen(features)

        def codegen(self):
            return self._codegen

    assert vector.distinct_isas(Context("+sse4.2,+avx2,+fma,+f16c,-avx512f,-gfni")) == ("auto", "generic")
    for extra in sorted(vector.AUTO_ONLY_FEATURES):
        assert vector.distinct_isas(Context(f"+avx2,+fma,{extra}")) == ("auto", "avx2", "generic")


@pytest.mark.parametrize("isa", vector.VECTOR_ISAS)
def test_the_amx_tiles_follow_the_path_being_compiled(isa, monkeypatch):
    # The per-path tests set vector.VECTOR_ISA to compile "avx2" and "generic": on a target with the tile
    # unit, those must not take the tiles (amx_tiles once read the value it saw at import, always "auto").
    from localllm.backends.cpu.quant_kernels import amx_tiles

    monkeypatch.setattr(amx_tiles, "_target_features", lambda context: {"+avx2", "+amx-tile", "+amx-bf16"})
    monkeypatch.setattr(vector, "VECTOR_ISA", isa)
    assert amx_tiles.target_has_amx() == (isa == "auto")
