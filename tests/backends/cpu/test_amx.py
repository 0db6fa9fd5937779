"""BF16 products on AMX's tile unit (backends/cpu/quant_kernels/amx.py): the activations' two bfloat16
parts against a brute-force statement of "nearest, ties to even", the re-laid tiles against a NumPy
statement of the layout, the products against float64 within the bound the parts allow, the same bits at
every batch size, thread count and layout (the stream and the grid, the file's rows and the re-laid copy),
and the backend's use of them (every product of a BF16 matrix, in both tiers; never F16's).

Only on a CPU with AMX whose OS grants the tile registers: elsewhere BF16 takes float_panels' kernels,
which test_quant_float_panels.py checks, and nothing here can run."""

from __future__ import annotations

import numpy as np
import pytest
from quant_rows import bits

from localllm import quant
from localllm.backends.base import Weight
from localllm.backends.cpu import CPUBackend
from localllm.backends.cpu.matmul import MatmulScratch, TiledWeights, matmul, matmul_rows, matrix_kernel
from localllm.backends.cpu.quant_kernels import amx, kernel_record

pytestmark = pytest.mark.skipif(not amx.available(), reason="no AMX tile unit on this CPU (or the OS refused it)")

BF16 = quant.get("BF16")


def _bf16_rows(rng, n_rows, k, scale=1.0):
    """(raw uint8[n_rows, 2k] BF16 rows, their values as float64)."""
    raw = BF16.quantize(rng.normal(0, scale, (n_rows, k)).astype(np.float32)).reshape(n_rows, -1)
    values = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw, values


def _nearest_bfloat16(values: np.ndarray) -> np.ndarray:
    """The bfloat16 (uint16 bits) nearest each float32, ties to the even one, by comparing the two
    candidates around it in float64 (finite values that stay finite)."""
    down = values.view(np.uint32) & np.uint32(0xFFFF0000)
    up = down + np.uint32(0x10000)
    d_down = np.abs(values.astype(np.float64) - down.view(np.float32).astype(np.float64))
    d_up = np.abs(up.view(np.float32).astype(np.float64) - values.astype(np.float64))
    take_up = (d_up < d_down) | ((d_up == d_down) & ((down >> 16) & 1 == 1))
    return np.where(take_up, up, down).astype(np.uint32) >> 16


def test_activations_split_into_the_nearest_bfloat16_and_the_one_nearest_the_rest():
    rng = np.random.default_rng(0)
    x = (rng.normal(0, 1, (21, 96)) * np.exp(rng.uniform(-20, 20, (21, 96)))).astype(np.float32)
    x[0, :4] = [1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 0.0]  # ties: to even, both ways
    parts = np.zeros((amx.PARTS, 2, 48, amx.GROUP), np.uint32)
    amx.split_activations(x, parts)
    words = parts.transpose(0, 1, 3, 2).reshape(amx.PARTS, 32, 48)[:, :21]  # [part, row t, pair kk]
    halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(amx.PARTS, 21, 96)
    hi = _nearest_bfloat16(x)
    rest = x - (hi << 16).view(np.float32)
    np.testing.assert_array_equal(halves[0], hi)
    np.testing.assert_array_equal(halves[1], _nearest_bfloat16(rest))
    assert list(hi[0, :3]) == [0x3F80, 0x3F82, 0xBF80]
    kept = (halves[0].astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    kept += (halves[1].astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert np.all(np.abs(kept - x) <= 2.0**-17 * np.abs(x))


def test_pack_lays_each_tile_of_16_rows_contiguously():
    rng = np.random.default_rng(1)
    raw, _ = _bf16_rows(rng, 37, 128)  # 3 groups, the last of 5 rows
    packed = amx.pack(raw)
    padded = np.zeros((48, raw.shape[1]), np.uint8)
    padded[:37] = raw
    want = padded.reshape(3, 16, 4, 64).transpose(0, 2, 1, 3)  # [group, chunk, row, 64 bytes]
    np.testing.assert_array_equal(packed, want)


@pytest.mark.parametrize("k", [640, 2048])
def test_products_are_within_the_parts_bound_of_float64(k):
    rng = np.random.default_rng(k)
    raw, w = _bf16_rows(rng, 40, k)
    x = rng.normal(0, 3, (20, k)).astype(np.float32)
    out = np.zeros((20, 40), np.float32)
    amx.matmul(raw, x, out, 2)
    exact = x.astype(np.float64) @ w.T
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(w).T
    # dropped parts (2^-17 of each product) and float32 sums (well under 2^-15 of the magnitudes here)
    assert np.all(np.abs(out - exact) <= 2.0**-15 * magnitude)
    # llama.cpp's BF16 path rounds each activation to bfloat16 (up to 2^-9 of it): its error, by far
    rounded = (_nearest_bfloat16(x) << 16).view(np.float32).astype(np.float64)
    assert np.abs(out - exact).max() < 0.02 * np.abs(rounded @ w.T - exact).max()


@pytest.mark.parametrize("k", [64, 640, 2080])  # 2080: an odd number of chunks (the stream's last one even)
def test_every_batch_size_thread_count_and_layout_gives_the_same_bits(k):
    rng = np.random.default_rng(k + 1)
    n_weights = 37  # a grid step of 32 rows and one of 5; stream groups of 16, 16 and 5
    raw, _ = _bf16_rows(rng, n_weights, k)
    packed = amx.pack(raw)
    x = rng.normal(0, 1, (40, k)).astype(np.float32)
    reference = np.zeros((40, n_weights), np.float32)
    amx.matmul(raw, x, reference, 2)
    for n_rows in (1, 2, 5, 15, 16, 17, 31, 32, 33, 40):
        for threads in (1, 2, 3):
            for layout in (amx.NOT_PACKED, packed):
                out = np.full((n_rows, n_weights), np.nan, np.float32)
                amx.matmul(raw, x[:n_rows], out, threads, layout)
                np.testing.assert_array_equal(bits(out), bits(reference[:n_rows]), err_msg=f"T={n_rows} threads={threads}")
    for r in (0, 16, 36):  # a matrix of one row
        out = np.zeros((3, 1), np.float32)
        amx.matmul(np.ascontiguousarray(raw[r : r + 1]), x[7:10], out, 1)
        np.testing.assert_array_equal(bits(out[:, 0]), bits(reference[7:10, r]))


def test_special_values_give_the_same_result_at_every_batch_size():
    rng = np.random.default_rng(3)
    k = 96
    specials = np.array([np.inf, -np.inf, np.nan, 1e-40, 0.0, -0.0, 3e38, -3e38], np.float32)
    values = rng.normal(0, 1, (20, k)).astype(np.float32)
    values[::4, ::7] = rng.choice(specials, size=values[::4, ::7].shape)
    raw = BF16.quantize(values).reshape(20, -1)
    x = rng.normal(0, 1, (18, k)).astype(np.float32)
    x[3, ::5] = np.inf
    x[5, 2] = np.nan
    whole = np.zeros((18, 20), np.float32)
    amx.matmul(raw, x, whole, 2)
    for t in range(18):
        one = np.zeros((1, 20), np.float32)
        amx.matmul(raw, x[t : t + 1], one, 1)
        assert np.array_equal(np.isnan(one[0]), np.isnan(whole[t]))
        np.testing.assert_array_equal(bits(np.where(np.isnan(one[0]), 0, one[0])), bits(np.where(np.isnan(whole[t]), 0, whole[t])))


def test_bf16_matrices_take_the_tiles_and_f16_ones_never():
    rng = np.random.default_rng(4)
    raw, _ = _bf16_rows(rng, 24, 640)
    assert matrix_kernel(BF16, raw) is kernel_record("BF16").matrix and amx.suits(raw)
    assert not amx.suits(np.ascontiguousarray(raw[:, :-2]))  # K = 639: not a whole chunk (float_panels')
    assert kernel_record("F16").matrix.matmul is not kernel_record("BF16").matrix.matmul  # F16: float_panels'
    x = rng.normal(0, 1, (3, 640)).astype(np.float32)
    want = np.zeros((3, 24), np.float32)
    amx.matmul(raw, x, want, 1)
    for product in (matmul, matmul_rows):
        out = np.zeros((3, 24), np.float32)
        product(BF16, raw, x, out, MatmulScratch())
        np.testing.assert_array_equal(bits(out), bits(want))


@pytest.mark.parametrize("repack", [True, False])
def test_the_backend_computes_the_same_bits_in_both_tiers_and_layouts(repack):
    rng = np.random.default_rng(5)
    raw, _ = _bf16_rows(rng, 48, 640)
    x = rng.normal(0, 1, (20, 640)).astype(np.float32)
    want = np.zeros((20, 48), np.float32)
    amx.matmul(raw, x, want, 1)
    backend = CPUBackend(threads=2, repack=repack)
    weight = backend.upload(Weight("w", "BF16", (640, 48), raw))
    for basic in (True, False):
        backend.basic_tier = basic
        for rows in (1, 2, 20):
            out = np.zeros((rows, 48), np.float32)
            backend.matmul(weight, x[:rows], out)
            np.testing.assert_array_equal(bits(out), bits(want[:rows]), err_msg=f"basic={basic} rows={rows}")
    assert isinstance(backend._layout_of(weight), TiledWeights) == repack
