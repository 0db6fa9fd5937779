"""The tile kernels of the 32-element block types, IQ4_NL's too (backends/cpu/quant_kernels/legacy_tiles.py: 16 weight
rows as vector lanes, prefill) against the one-row vec_dot, bit for bit: vec_dot keeps eight float lanes
across blocks, the tiles eight accumulators of 16 rows, so every row count, block count (odd ones: the
last block unpacked alone), batch size (two activation rows at a time, then one), extreme weights and
activations, and every VectorCode instruction-set path (uncached copies compiled under each
VECTOR_ISA, as in test_quant_isa.py: "avx2" and "generic" take each tile as two halves of 8 rows, the
QUAD_OFFSET types' quants signed) must give the same bits; and matmul_rows must take the tiles from
their min_rows where the target has them (AVX2: NARROW_MIN_ROWS)."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
from quant_rows import bits, compiled_for_isa, isa_paths, random_rows
from test_quant_kquant_rows import _activations, _expected

from localllm import quant
from localllm.backends.cpu.matmul import BatchActivation, MatmulScratch, PackedWeights, matmul_rows, tile_rows_from
from localllm.backends.cpu.quant_kernels import TileKernel, iq4_nl_x16, kernel_record, legacy_tiles, q4_0_x16, vector

KERNELS = {
    "Q4_0": legacy_tiles.q4_0_tiles,
    "Q4_1": legacy_tiles.q4_1_tiles,
    "Q5_0": legacy_tiles.q5_0_tiles,
    "Q5_1": legacy_tiles.q5_1_tiles,
    "Q8_0": legacy_tiles.q8_0_tiles,
    "IQ4_NL": legacy_tiles.iq4_nl_tiles,
}
TYPES = sorted(KERNELS)


def _weights(name, rng, n_rows, k):
    """Every byte pattern and special scale (random_rows: f16 infinities, NaNs, subnormals, zeros), then
    ordinary rows."""
    special = random_rows(name, min(n_rows, 13), k, rng)
    ordinary = quant.get(name).quantize(rng.normal(0, 0.05, (n_rows - special.shape[0], k)).astype(np.float32))
    return np.concatenate([special, ordinary.reshape(-1, special.shape[1])])


def _check(name, kernel, raw, batch, columns=None, label=""):
    n_rows = batch[0].shape[0]
    out = np.full((n_rows, raw.shape[0]), np.nan, dtype=np.float32)
    kernel(raw, out, *batch)
    want = _expected(quant.get(name), raw, batch)
    tiled = slice(0, raw.shape[0] - raw.shape[0] % legacy_tiles.TILE) if columns is None else columns
    np.testing.assert_array_equal(bits(out[:, tiled]), bits(want[:, tiled]), err_msg=f"{name} {label}")


def test_every_type_record_has_its_tile_kernel():
    for name, kernel in KERNELS.items():
        assert kernel_record(name).tiles == TileKernel(kernel, legacy_tiles.MIN_ROWS[name], legacy_tiles.NARROW_MIN_ROWS[name])


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("k", [256, 2048, 4608])
def test_tiles_equal_vec_dot_across_the_kernels_steps(name, k):
    QT = quant.get(name)
    rng = np.random.default_rng(k + 11)
    raw = _weights(name, rng, 32, k)
    for n_rows in (1, 2, 3, 4, 5, 16, 19, 64, 255, 256, 257):
        batch = BatchActivation(QT.act, n_rows, k).quantize(_activations(rng, n_rows, k, 3.0))
        _check(name, KERNELS[name], raw, batch, label=f"K={k} T={n_rows}")


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("k", [32, 96, 288, 672])
def test_tiles_equal_vec_dot_for_odd_and_few_blocks(name, k):
    QT = quant.get(name)
    rng = np.random.default_rng(k)
    raw = _weights(name, rng, 35, k)  # two tiles and three rows the kernel leaves alone
    for n_rows in (1, 6, 17):
        batch = BatchActivation(QT.act, n_rows, k).quantize(_activations(rng, n_rows, k, 1.0))
        _check(name, KERNELS[name], raw, batch, label=f"K={k} T={n_rows}")


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("scale", [1e-3, 1e4])
def test_tiles_equal_vec_dot_at_extreme_activations(name, scale):
    QT = quant.get(name)
    rng = np.random.default_rng(int(scale * 1000) % 1000 + 3)
    k = 1024
    raw = _weights(name, rng, 16, k)
    x = _activations(rng, 20, k, scale)
    x[5] = np.where(rng.random(k) < 0.5, -1.0, 1.0) * 1e30  # every quant at +-127
    _check(name, KERNELS[name], raw, BatchActivation(QT.act, 20, k).quantize(x), label=f"scale {scale}")


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n_weights", [16, 21, 47])
def test_matmul_rows_takes_tiles_and_the_rest_by_rows(name, n_weights):
    QT = quant.get(name)
    rng = np.random.default_rng(n_weights)
    k = 640
    raw = _weights(name, rng, n_weights, k)
    min_rows = tile_rows_from(kernel_record(name).tiles) or legacy_tiles.MIN_ROWS[name]
    for n_rows in (min_rows - 1, min_rows, min_rows + 5):
        x = _activations(rng, n_rows, k, 1.0)
        batch = BatchActivation(QT.act, n_rows, k).quantize(x)
        out = np.full((n_rows, n_weights), np.nan, dtype=np.float32)
        matmul_rows(QT, raw, x, out, MatmulScratch())
        np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw, batch)), err_msg=f"{name} N={n_weights} T={n_rows}")


@pytest.mark.parametrize("name", TYPES)
def test_matmul_rows_calls_the_tile_kernel_from_min_rows_where_available(name, monkeypatch):
    # Same bits either way, so only a spy shows whether the dispatch took the tiles: where the target
    # has them, a batch of MIN_ROWS rows must (or the speed is lost silently), one row fewer must not.
    calls = []
    kernel = KERNELS[name]
    spy = dataclasses.replace(kernel_record(name).tiles, matvec=lambda *args: calls.append(args[1].shape[0]) or kernel(*args))
    record = dataclasses.replace(kernel_record(name), tiles=spy)
    cpu_matmul = sys.modules["localllm.backends.cpu.matmul"]  # the module (the package exports a function of that name)
    monkeypatch.setattr(cpu_matmul, "kernel_record", lambda qt: record if qt.name == name else kernel_record(qt))
    QT = quant.get(name)
    rng = np.random.default_rng(5)
    raw = _weights(name, rng, 32, 512)
    rows_from = tile_rows_from(spy)  # AVX-512 VNNI: MIN_ROWS; AVX2: NARROW_MIN_ROWS (None: never)
    min_rows = rows_from or legacy_tiles.MIN_ROWS[name]
    for n_rows in (min_rows - 1, min_rows):
        x = _activations(rng, n_rows, 512, 1.0)
        out = np.empty((n_rows, 32), dtype=np.float32)
        matmul_rows(QT, raw, x, out, MatmulScratch())
        np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw, BatchActivation(QT.act, n_rows, 512).quantize(x))))
    assert calls == ([min_rows] if rows_from is not None else [])
    if legacy_tiles.available():
        assert rows_from == legacy_tiles.MIN_ROWS[name]


@pytest.mark.parametrize("name", TYPES)
def test_tiles_equal_vec_dot_on_every_isa(name):
    QT = quant.get(name)
    rng = np.random.default_rng(41)
    k = 544  # 17 blocks: an odd last block
    # two tiles: the special rows' (Q8_0's holds quants of -128, whose tiles keep the signs on the weights
    # on AVX2) and ordinary rows' (on AVX2 signed by the activation, legacy_tiles.SIGNED_BY_ACTIVATION)
    raw = _weights(name, rng, 37, k)
    if name == "Q8_0":
        quants = raw.reshape(37, -1, 34)[:, :, 2:].view(np.int8)
        assert (quants[:16] == -128).any() and not (quants[16:32] == -128).any()
    saturated = np.where(np.arange(k) % 2, 1.0, -1.0)[None].repeat(3, 0).astype(np.float32)  # alternating +-127
    batches = [BatchActivation(QT.act, n, k).quantize(_activations(rng, n, k, 2.0)) for n in (5, 16, 35)]
    batches.append(BatchActivation(QT.act, 3, k).quantize(saturated))
    expected = [_expected(QT, raw, batch) for batch in batches]
    saved = vector.VECTOR_ISA
    try:
        for isa in isa_paths():
            vector.VECTOR_ISA = isa
            tiles = compiled_for_isa(KERNELS[name])  # compiled now, for isa
            for batch, want in zip(batches, expected):
                n_rows = batch[0].shape[0]
                out = np.full((n_rows, raw.shape[0]), np.nan, dtype=np.float32)
                tiles(raw, out, *batch)
                np.testing.assert_array_equal(bits(out[:, :32]), bits(want[:, :32]), err_msg=f"{name} {isa} T={n_rows}")
    finally:
        vector.VECTOR_ISA = saved


# -- Q4_0 and IQ4_NL re-laid 16 rows at a time (q4_0_x16, iq4_nl_x16: the same records; every batch
# size, decode included) --

PACKED = {"Q4_0": q4_0_x16, "IQ4_NL": iq4_nl_x16}


def test_the_packed_32_element_types_are_those_whose_record_has_a_packed_kernel():
    for name, module in PACKED.items():
        record = kernel_record(name).packed
        assert (record.pack, record.matvec) == (module.pack, module.matvec_packed)


def test_q4_0_pack_puts_row_i_scale_at_2i_and_its_quant_word_c_at_32_plus_64c_plus_4i():
    rng = np.random.default_rng(2)
    raw = _weights("Q4_0", rng, 37, 288)  # two tiles of 9 blocks, 5 rows left out
    packed = q4_0_x16.pack(raw)
    blocks = raw[:32].reshape(2, 16, 9, 18)  # [tile, row, block, byte]
    want = np.empty((2, 9, 288), dtype=np.uint8)
    want[:, :, :32] = blocks[:, :, :, :2].transpose(0, 2, 1, 3).reshape(2, 9, 32)
    quants = blocks[:, :, :, 2:].reshape(2, 16, 9, 4, 4)  # [tile, row, block, word c, byte]
    want[:, :, 32:] = quants.transpose(0, 2, 3, 1, 4).reshape(2, 9, 256)
    np.testing.assert_array_equal(packed, want.reshape(18, 288))


@pytest.mark.parametrize("name", sorted(PACKED))
@pytest.mark.parametrize("k,n_weights", [(256, 48), (2048, 48), (4608, 48), (2048, 144), (256, 256)])
def test_packed_kernel_equals_vec_dot_at_every_batch_size(name, k, n_weights):
    # 9 and 16 tiles: the decode's tiles a quarter of the matrix apart (APART), and the tile left over.
    QT, module = quant.get(name), PACKED[name]
    rng = np.random.default_rng(k + n_weights)
    raw = _weights(name, rng, n_weights, k)
    packed = module.pack(raw)
    for n_rows in (1, 2, 3, 4, 5, 16, 33, 256, 257):
        batch = BatchActivation(QT.act, n_rows, k).quantize(_activations(rng, n_rows, k, 3.0))
        for n_parts in (1, 2, 5):
            out = np.full((n_rows, n_weights), np.nan, dtype=np.float32)
            module.matvec_packed(packed, k // 32, n_parts, out, *batch)
            np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw, batch)), err_msg=f"{name} K={k} T={n_rows} parts={n_parts}")


@pytest.mark.parametrize("name", sorted(PACKED))
@pytest.mark.parametrize("n_weights", [16, 21, 47])
def test_packed_weights_take_the_last_rows_by_the_row_kernels(name, n_weights):
    QT = quant.get(name)
    rng = np.random.default_rng(n_weights)
    raw = _weights(name, rng, n_weights, 1056)  # 33 blocks
    packed = PackedWeights(QT, raw)
    assert packed.n_packed == n_weights - n_weights % 16
    for n_rows in (1, 3, 40):
        x = _activations(rng, n_rows, 1056, 1.0)
        out = np.full((n_rows, n_weights), np.nan, dtype=np.float32)
        packed.matmul(x, out, MatmulScratch(), 2)
        np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw, BatchActivation(QT.act, n_rows, 1056).quantize(x))))


@pytest.mark.parametrize("name", sorted(PACKED))
def test_packed_kernel_equals_vec_dot_on_every_isa(name):
    QT, module = quant.get(name), PACKED[name]
    rng = np.random.default_rng(43)
    k = 544
    raw = _weights(name, rng, 80, k)  # 5 tiles: four a quarter apart in the decode, one left over
    packed = module.pack(raw)
    batches = [BatchActivation(QT.act, n, k).quantize(_activations(rng, n, k, 2.0)) for n in (1, 7)]
    expected = [_expected(QT, raw, batch) for batch in batches]
    saved = vector.VECTOR_ISA
    try:
        for isa in isa_paths():
            vector.VECTOR_ISA = isa
            kernel = compiled_for_isa(module.matvec_packed)  # compiled now, for isa
            for batch, want in zip(batches, expected):
                out = np.full((batch[0].shape[0], 80), np.nan, dtype=np.float32)
                kernel(packed, k // 32, 2, out, *batch)
                np.testing.assert_array_equal(bits(out), bits(want), err_msg=f"{name} {isa} T={batch[0].shape[0]}")
    finally:
        vector.VECTOR_ISA = saved
