"""Q4_K, Q5_K, Q6_K, Q3_K, Q2_K and IQ4_XS rows re-laid 16 at a time (backends/cpu/quant_kernels/q4_k_x16.py,
q5_k_x16.py, q6_k_x16.py, q3_k_x16.py, q2_k_x16.py, iq4_xs_x16.py, backends/cpu/matmul.PackedWeights): the layout
against a NumPy statement of it, the lane kernel against the one-row vec_dot bit for bit at every batch
size (decode's one row included) and on every VectorCode instruction-set path, the backend's choice of
layout, and the release of the mapped pages the re-laid rows came from."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from quant_rows import bits, compiled_for_isa, isa_paths
from test_quant_kquant_rows import _activations, _expected
from test_quant_tiles import _weights

from localllm import quant
from localllm.backends.base import Weight
from localllm.backends.cpu import CPUBackend
from localllm.backends.cpu.matmul import BatchActivation, ExpertPack, MatmulScratch, PackedWeights, packed_available
from localllm.backends.cpu.quant_kernels.q4_k_tiles import available as tiles_available
from localllm.gguf.reader import GGUFReader, release_pages
from localllm.gguf.writer import GGUFWriter
from localllm.backends.cpu.quant_kernels import iq4_nl_x16, iq4_xs_x16, kernel_record, kernel_records, q2_k_x16, q3_k_x16, q4_0_x16, q4_k_x16, q5_k_x16, q6_k_x16, vector

MODULES = {"Q2_K": q2_k_x16, "Q3_K": q3_k_x16, "Q4_K": q4_k_x16, "Q5_K": q5_k_x16, "Q6_K": q6_k_x16, "IQ4_XS": iq4_xs_x16}  # the 256-element types with a packed layout (their kernel record's `packed`)
# Bytes of a block whose largest values give the largest products in pairs (a row's block[WIDEST] all
# 0xFF): Q4_K's quants (nibbles 15: on AVX2 vpmaddubsw saturates past 32767, so the kernel must not feed
# it 16 x a high nibble), Q3_K's hmask and quants (every u = q + 4 at 7), Q2_K's scale codes and quants
# (scales and mins 15, quants 3), Q5_K's fifth bits and nibbles (every value 31), Q6_K's ql and qh (every
# u = q + 32 at 63), IQ4_XS's scales and indices (scales 31, every value KVALUES[15] = 113: 241 unsigned,
# whose pairs saturate vpmaddubsw).
WIDEST = {"Q4_K": slice(16, 144), "Q3_K": slice(0, 96), "Q2_K": slice(0, 80), "Q5_K": slice(16, 176), "Q6_K": slice(0, 192), "IQ4_XS": slice(2, 136)}
TYPES = sorted(MODULES)
TESTED_ELSEWHERE = {"Q4_0": q4_0_x16, "IQ4_NL": iq4_nl_x16}  # test_quant_tiles_legacy.py


def test_the_packed_types_are_those_whose_record_has_a_packed_kernel():
    records = {record.name: record.packed for record in kernel_records() if record.packed is not None}
    modules = MODULES | TESTED_ELSEWHERE
    assert sorted(records) == sorted(modules)
    for name, packed in records.items():
        assert (packed.pack, packed.matvec) == (modules[name].pack, modules[name].matvec_packed)


def test_q4_k_pack_puts_word_s_of_row_i_at_16s_plus_i():
    rng = np.random.default_rng(1)
    raw = _weights("Q4_K", rng, 37, 512)  # two tiles, 5 rows left out
    packed = q4_k_x16.pack(raw)
    words = raw[:32].view(np.uint32).reshape(2, 16, 2, 36)  # [tile, row i, block b, word s]
    want = words.transpose(0, 2, 3, 1).reshape(4, 576)  # record tile * 2 + b, word 16 * s + i
    np.testing.assert_array_equal(packed, want)


def test_q2_k_pack_puts_word_w_of_row_i_at_16w_plus_i():
    rng = np.random.default_rng(3)
    raw = _weights("Q2_K", rng, 33, 512)  # two tiles, 1 row left out
    packed = q2_k_x16.pack(raw)
    words = raw[:32].view(np.uint32).reshape(2, 16, 2, 21)  # [tile, row i, block b, word w]
    np.testing.assert_array_equal(packed.view(np.uint32), words.transpose(0, 2, 3, 1).reshape(4, 336))


def test_q5_k_pack_puts_word_w_of_row_i_at_16w_plus_i():
    rng = np.random.default_rng(5)
    raw = _weights("Q5_K", rng, 39, 512)  # two tiles, 7 rows left out
    packed = q5_k_x16.pack(raw)
    words = raw[:32].view(np.uint32).reshape(2, 16, 2, 44)  # [tile, row i, block b, word w]
    np.testing.assert_array_equal(packed, words.transpose(0, 2, 3, 1).reshape(4, 704))


def test_iq4_xs_pack_puts_word_w_of_row_i_at_16w_plus_i():
    rng = np.random.default_rng(4)
    raw = _weights("IQ4_XS", rng, 34, 512)  # two tiles, 2 rows left out
    packed = iq4_xs_x16.pack(raw)
    words = raw[:32].view(np.uint32).reshape(2, 16, 2, 34)  # [tile, row i, block b, word w]
    np.testing.assert_array_equal(packed.view(np.uint32), words.transpose(0, 2, 3, 1).reshape(4, 544))


def test_q3_k_pack_puts_d_first_then_word_w_of_row_i_at_16w_plus_i():
    rng = np.random.default_rng(2)
    raw = _weights("Q3_K", rng, 35, 512)  # two tiles, 3 rows left out
    packed = q3_k_x16.pack(raw)
    blocks = raw[:32].reshape(2, 16, 2, 110)  # [tile, row i, block b, byte]
    d = blocks[..., 108:110].transpose(0, 2, 1, 3).reshape(4, 32)  # record tile * 2 + b: row i's d at 2i
    words = blocks[..., :108].reshape(2, 16, 2, 27, 4).transpose(0, 2, 3, 1, 4).reshape(4, 27 * 64)  # word w of row i at 64w + 4i
    np.testing.assert_array_equal(packed, np.concatenate([d, words], axis=1))


def test_q6_k_pack_puts_d_first_then_the_words_in_reading_order():
    rng = np.random.default_rng(7)
    raw = _weights("Q6_K", rng, 38, 512)  # two tiles, 6 rows left out
    packed = q6_k_x16.pack(raw)
    blocks = raw[:32].reshape(2, 16, 2, 210)  # [tile, row i, block b, byte]
    d = blocks[..., 208:210].transpose(0, 2, 1, 3).reshape(4, 32)  # record tile * 2 + b: row i's d at 2i
    words = blocks[..., :208].reshape(2, 16, 2, 52, 4).transpose(0, 2, 3, 1, 4)  # [tile, b, word w, row i, byte]
    order = [48, 49, 50, 51] + [w for h in range(2) for s8 in range(8) for w in (16 * h + s8, 16 * h + 8 + s8, 32 + 8 * h + s8)]
    np.testing.assert_array_equal(packed, np.concatenate([d, words[:, :, order].reshape(4, 52 * 64)], axis=1))


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("k", [256, 2048, 4608])
def test_packed_kernel_equals_vec_dot_at_every_batch_size(name, k):
    QT, module = quant.get(name), MODULES[name]
    rng = np.random.default_rng(k)
    raw = _weights(name, rng, 48, k)
    packed = module.pack(raw)
    thresholds = (module.UNPACK_ROWS, getattr(module, "NARROW_UNPACK_ROWS", 2))
    assert module.CHUNK == 256 and module.ROWS == 4 and all(2 <= n <= 8 for n in thresholds)  # the sizes below cross them all
    for n_rows in (1, 2, 3, 4, 5, 7, 8, 16, 255, 256, 257):
        batch = BatchActivation(QT.act, n_rows, k).quantize(_activations(rng, n_rows, k, 3.0))
        for n_parts in (1, 2, 5):
            out = np.full((n_rows, 48), np.nan, dtype=np.float32)
            module.matvec_packed(packed, k // 256, n_parts, out, *batch)
            np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw, batch)), err_msg=f"{name} K={k} T={n_rows} parts={n_parts}")


def test_grouped_kernel_equals_vec_dot_of_each_rows_expert():
    """matvec_packed_grouped over four experts of 32 rows stacked: each group's rows (one, a few, and past
    UNPACK_ROWS and CHUNK) through its expert, bit for bit as vec_dot, whatever the runs; rows of an
    unused expert's group count untouched."""
    QT, k, rows, n_expert = quant.get("Q4_K"), 512, 32, 4
    rng = np.random.default_rng(5)
    raw = _weights("Q4_K", rng, n_expert * rows, k)
    packed = q4_k_x16.pack(raw)  # whole tiles per expert: the stack packs as the experts one after another
    for sizes in ([1, 0, 1, 1], [3, 9, 0, 1], [0, 260, 2, 0]):
        groups = np.array([e for e, n in enumerate(sizes) if n], dtype=np.int32)
        bounds = np.concatenate([[0], np.cumsum([n for n in sizes if n])]).astype(np.int32)
        batch = BatchActivation(QT.act, int(bounds[-1]), k).quantize(_activations(rng, int(bounds[-1]), k, 3.0))
        for n_parts in (1, 2, 3):
            out = np.full((int(bounds[-1]), rows), np.nan, dtype=np.float32)
            q4_k_x16.matvec_packed_grouped(packed, k // 256, rows // 16, groups, bounds, n_parts, out, *batch)
            for g, e in enumerate(groups):
                a, b = bounds[g], bounds[g + 1]
                want = _expected(QT, raw[e * rows : (e + 1) * rows], tuple(x[a:b] for x in batch))
                np.testing.assert_array_equal(bits(out[a:b]), bits(want), err_msg=f"{sizes} parts={n_parts} expert {e}")


def test_expert_pack_relays_an_expert_when_first_routed_to_and_releases_its_pages():
    QT, k, rows, n_expert = quant.get("Q4_K"), 256, 16, 3
    rng = np.random.default_rng(6)
    raw = _weights("Q4_K", rng, n_expert * rows, k)
    pack = ExpertPack(QT, raw.copy(), n_expert)
    x = _activations(rng, 2, k, 1.0)
    out = np.zeros((2, rows), dtype=np.float32)
    pack.matmul(x, np.array([2], np.int32), np.array([0, 2], np.int32), out, MatmulScratch(), 2)
    assert pack.ready.tolist() == [False, False, True]
    np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw[2 * rows :], BatchActivation(QT.act, 2, k).quantize(x))))


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n_weights", [16, 21, 47])
def test_packed_weights_take_the_last_rows_by_the_row_kernels(name, n_weights):
    QT = quant.get(name)
    rng = np.random.default_rng(n_weights)
    raw = _weights(name, rng, n_weights, 1024)
    packed = PackedWeights(QT, raw)
    assert packed.n_packed == n_weights - n_weights % 16
    for n_rows in (1, 3, 20):
        x = _activations(rng, n_rows, 1024, 1.0)
        out = np.full((n_rows, n_weights), np.nan, dtype=np.float32)
        packed.matmul(x, out, MatmulScratch(), 2)
        np.testing.assert_array_equal(bits(out), bits(_expected(QT, raw, BatchActivation(QT.act, n_rows, 1024).quantize(x))))


@pytest.mark.parametrize("name", TYPES)
def test_packed_kernel_equals_vec_dot_on_every_isa(name):
    QT, module = quant.get(name), MODULES[name]
    rng = np.random.default_rng(43)
    k = 512
    raw = _weights(name, rng, 32, k)
    # rows of the largest quants against activations of +127: the largest byte products in pairs
    raw.reshape(32, -1, QT.type_size)[20:24, :, WIDEST[name]] = 0xFF
    packed = module.pack(raw)
    batches = [BatchActivation(QT.act, n, k).quantize(_activations(rng, n, k, 2.0)) for n in (1, 3, 6, 20)]  # each path of the driver
    batches += [BatchActivation(QT.act, n, k).quantize(np.ones((n, k), dtype=np.float32)) for n in (1, 6)]
    expected = [_expected(QT, raw, batch) for batch in batches]
    saved = vector.VECTOR_ISA
    try:
        for isa in isa_paths():
            vector.VECTOR_ISA = isa
            kernel = compiled_for_isa(module.matvec_packed)  # compiled now, for isa
            for batch, want in zip(batches, expected):
                out = np.full((batch[0].shape[0], 32), np.nan, dtype=np.float32)
                kernel(packed, k // 256, 2, out, *batch)
                np.testing.assert_array_equal(bits(out), bits(want), err_msg=f"{name} {isa} T={batch[0].shape[0]}")
    finally:
        vector.VECTOR_ISA = saved


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q8_0"])
def test_backend_repacks_k_quants_only_where_the_lane_kernels_are_fast_with_the_same_results(qtype):
    rng = np.random.default_rng(9)
    raw = _weights(qtype, rng, 32, 512) if qtype != "Q8_0" else quant.get(qtype).quantize(rng.normal(0, 0.05, (32, 512)).astype(np.float32)).reshape(32, -1)
    results = {}
    for repack in (False, True):
        backend = CPUBackend(threads=2, repack=repack)
        weight = backend.upload(Weight("w", qtype, (512, 32), raw))
        for n_rows in (1, 3, 20):
            x = _activations(np.random.default_rng(n_rows), n_rows, 512, 1.0)
            out = np.full((n_rows, 32), np.nan, dtype=np.float32)
            backend.matmul(weight, x, out)
            results.setdefault(n_rows, []).append(bits(out))
        repacked = isinstance(backend._layout_of(weight), PackedWeights)
        # AVX-512 VNNI targets take the types whose layout is marked `wide`, AVX2 those marked `narrow`
        kind = kernel_record(qtype).packed
        suited = kind is not None and (kind.wide if tiles_available() else kind.narrow and packed_available())
        assert repacked == (repack and suited)
    for n_rows, (plain, packed) in results.items():
        np.testing.assert_array_equal(plain, packed, err_msg=f"{qtype} T={n_rows}")


def _mapping_rss_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_release_pages_drops_the_mapped_pages_and_keeps_the_bytes(tmp_path):
    data = np.random.default_rng(0).integers(-128, 128, (64, 1 << 16), dtype=np.int8)  # 4 MiB
    path = tmp_path / "t.gguf"
    writer = GGUFWriter(path)
    writer.add("general.architecture", "llama")
    writer.add_tensor("small", np.arange(5, dtype=np.float32))  # so that "big" starts inside a page
    writer.add_tensor("big", data)
    writer.write()
    with GGUFReader(path) as reader:
        view = reader.tensor_bytes("big")
        assert view.ctypes.data % 4096 != 0
        np.testing.assert_array_equal(view.view(np.int8), data)  # every page read: resident
        before = _mapping_rss_kib(path)
        assert release_pages(view)
        after = _mapping_rss_kib(path)
        assert before - after >= view.nbytes // 1024 - 8  # all but the partial pages at its two ends
        np.testing.assert_array_equal(view.view(np.int8), data)  # read again from the file, unchanged
        small = reader.tensor_array("small")
        np.testing.assert_array_equal(small, np.arange(5, dtype=np.float32))  # its neighbour's page kept its bytes
    copy = np.array(data)
    assert not release_pages(copy.view(np.uint8))  # memory that is not a reader's file mapping: left alone
    np.testing.assert_array_equal(copy, data)
