"""Where the CPU backend keeps the matrices: copied into huge-page memory at load, or read in the file's
mapping (backends/cpu/weight_memory.py), and the same logits either way."""

from __future__ import annotations

import numpy as np
import pytest

import localllm
from localllm import quant
from localllm.backends.cpu import weight_memory
from localllm.backends.cpu.matmul import relaid_layout
from localllm.backends.cpu.weight_memory import ALIGN, CHUNK, HUGE_PAGE, HugePageArena, copies_weights
from localllm.gguf.reader import GGUFReader
from localllm.gguf.writer import GGUFWriter
from localllm.model.kv_cache import KVCache
from localllm.runtime import Runtime

from test_quant_packed import _mapping_rss_kib
from tiny_models import write_tiny_model

GIB = 1 << 30


@pytest.mark.parametrize("place, weights, kv, available, huge, expected", [
    ("copied", 10 * GIB, 0, 1 * GIB, False, True),  # asked for: copied whatever the machine
    ("mapped", 1, 0, 100 * GIB, True, False),
    ("auto", 3 * GIB, 1 * GIB, 9 * GIB, True, True),  # 4 GiB under half of 9
    ("auto", 3 * GIB, 1 * GIB, 8 * GIB, True, False),  # not under half of 8
    ("auto", 1, 0, 100 * GIB, False, False),  # no transparent huge pages: a copy would gain nothing
])
def test_auto_copies_when_the_model_fits_well_and_huge_pages_exist(place, weights, kv, available, huge, expected):
    assert copies_weights(place, weights, kv, available=available, huge_pages=huge) is expected


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping holding `address` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(v, 16) for v in head.split("-"))
                inside = low <= address < high
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_copy_has_the_bytes_shape_and_type_read_only_in_advised_memory():
    rng = np.random.default_rng(0)
    arena = HugePageArena()
    small = rng.integers(0, 256, (3, 100), dtype=np.uint8)
    floats = rng.standard_normal((5, 7)).astype(np.float32)
    copies = [arena.copy(small), arena.copy(floats)]
    for original, copy in zip((small, floats), copies):
        assert copy.dtype == original.dtype and copy.shape == original.shape
        np.testing.assert_array_equal(copy, original)
        assert not copy.flags.writeable and copy.flags.c_contiguous
        assert copy.ctypes.data % ALIGN == 0
        assert not np.shares_memory(copy, original)
    # small matrices share one advised mapping, one after the other
    assert copies[1].ctypes.data == copies[0].ctypes.data + -(-small.nbytes // ALIGN) * ALIGN
    assert "hg" in _vm_flags(copies[0].ctypes.data)  # MADV_HUGEPAGE given


def test_a_large_matrix_gets_its_own_mapping_on_a_huge_page_boundary_copied_by_threads():
    data = np.random.default_rng(1).integers(0, 256, (CHUNK // 4 // 5 + 12345, 5), dtype=np.uint8)
    arena = HugePageArena(threads=2)
    first = arena.copy(np.zeros((4, 4), np.uint8))
    copy = arena.copy(data)  # pieces of COPY_PIECE bytes over two threads
    np.testing.assert_array_equal(copy, data)
    assert copy.ctypes.data % HUGE_PAGE == 0
    assert not first.ctypes.data <= copy.ctypes.data < first.ctypes.data + CHUNK  # not in the shared mapping
    assert "hg" in _vm_flags(copy.ctypes.data + copy.nbytes - 1)


def test_a_copy_releases_the_mapped_pages_it_came_from(tmp_path):
    data = np.random.default_rng(2).integers(-128, 128, (64, 1 << 16), dtype=np.int8)  # 4 MiB
    path = tmp_path / "t.gguf"
    writer = GGUFWriter(path)
    writer.add("general.architecture", "llama")
    writer.add_tensor("big", data)
    writer.write()
    with GGUFReader(path) as reader:
        view = reader.tensor_bytes("big")
        np.testing.assert_array_equal(view.view(np.int8), data)  # every page read: resident
        before = _mapping_rss_kib(path)
        copy = weight_memory.copy_to_arena(HugePageArena(), view)
        assert before - _mapping_rss_kib(path) >= view.nbytes // 1024 - 8  # all but partial end pages
        np.testing.assert_array_equal(copy.view(np.int8), data)


def _last_logits(model, ids: np.ndarray) -> np.ndarray:
    cache = KVCache(model.backend, model.decoder.hp, 64)
    return model.decoder.forward(ids, 0, cache)[-1].copy()


def _in_file_mapping(array: np.ndarray, model) -> bool:
    return np.shares_memory(array, np.frombuffer(model.reader._mmap, dtype=np.uint8))


@pytest.mark.parametrize("qtype", ["Q8_0", "F16", "Q4_K", "BF16"])
def test_copied_and_mapped_matrices_give_the_same_logits(tmp_path, qtype):
    """Q4_K, F16 and BF16: on a target with their re-laid kernels (the float types: every target) the
    copy is the re-laid one, so upload leaves the matrix mapped and the re-laid copy goes to the
    huge-page memory."""
    path = write_tiny_model(tmp_path / f"m-{qtype}.gguf", "llama", qtype, seed=5)
    ids = np.arange(1, 40, dtype=np.int32)
    logits, models = {}, {}
    for place in ("mapped", "copied"):
        runtime = Runtime.resolve(environ={"LOCALLLM_WEIGHTS": place, "LOCALLLM_COMPILE": "foreground"})
        models[place] = localllm.load(path, n_ctx=64, threads=2, runtime=runtime)
        logits[place] = _last_logits(models[place], ids)
    np.testing.assert_array_equal(logits["copied"].view(np.uint32), logits["mapped"].view(np.uint32))
    mapped = models["mapped"].decoder.w["blk.0.ffn_up.weight"].data
    copied = models["copied"].decoder.w["blk.0.ffn_up.weight"].data
    assert _in_file_mapping(mapped, models["mapped"])
    relaid_later = models["copied"].backend.repack and relaid_layout(quant.get(qtype), mapped) is not None
    assert _in_file_mapping(copied, models["copied"]) == relaid_later
    assert not copied.flags.writeable  # as the mapping: the kernels compiled for one serve the other
    if relaid_later:  # the re-laid copy went into the huge-page memory instead, writable as made
        backend = models["copied"].backend
        weight = models["copied"].decoder.w["blk.0.ffn_up.weight"]
        packed = backend.layouts.layout_of(weight).packed
        assert np.shares_memory(packed, backend.arena._chunk) and packed.flags.writeable
        assert models["mapped"].backend.layouts.arena is None


def test_an_embedding_table_only_gathered_from_stays_mapped(tmp_path):
    """With its own output.weight, token_embd is only gathered from (a row per token): it stays in the
    file's mapping when the matrices are copied; tied to the output (no output.weight), it is copied."""
    runtime = Runtime.resolve(environ={"LOCALLLM_WEIGHTS": "copied", "LOCALLLM_COMPILE": "foreground"})
    untied = localllm.load(write_tiny_model(tmp_path / "untied.gguf", "llama", "Q8_0", seed=5), n_ctx=64, threads=2,
                           runtime=runtime)  # the tiny llama has output.weight
    tied = localllm.load(write_tiny_model(tmp_path / "tied.gguf", "qwen2", "Q8_0", seed=5), n_ctx=64, threads=2,
                         runtime=runtime)
    assert _in_file_mapping(untied.decoder.w["token_embd.weight"].data, untied)
    assert not _in_file_mapping(untied.decoder.w["output.weight"].data, untied)
    assert not _in_file_mapping(tied.decoder.w["token_embd.weight"].data, tied)
