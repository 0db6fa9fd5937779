"""GGUF reader and writer: round trips, agreement with llama.cpp's gguf package, and hostile files.

The gguf package (llama.cpp's own Python reader/writer) is the independent oracle: files we write must
read back identically there, and files it writes must read identically here.
"""

from __future__ import annotations

import os
import struct

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localllm.errors import GGUFError
from localllm.gguf import GGML_TYPES_BY_NAME, GGUFReader, GGUFWriteError, GGUFWriter, ValueType

# -- round trips ----------------------------------------------------------------------------------------

SCALARS = [
    ("t.u8", 200, ValueType.UINT8),
    ("t.i8", -100, ValueType.INT8),
    ("t.u16", 60000, ValueType.UINT16),
    ("t.i16", -30000, ValueType.INT16),
    ("t.u32", 4_000_000_000, ValueType.UINT32),
    ("t.i32", -2_000_000_000, ValueType.INT32),
    ("t.f32", 0.1, ValueType.FLOAT32),
    ("t.bool", True, ValueType.BOOL),
    ("t.str", "héllo ▁ 世界 🙂", ValueType.STRING),
    ("t.u64", 2**63 + 5, ValueType.UINT64),
    ("t.i64", -(2**62), ValueType.INT64),
    ("t.f64", 1e300, ValueType.FLOAT64),
]
ARRAYS = [
    ("a.u8", np.array([0, 1, 255], dtype=np.uint8), ValueType.UINT8),
    ("a.i32", np.array([-1, 2, 3], dtype=np.int32), ValueType.INT32),
    ("a.f32", np.array([0.5, -0.0, np.inf], dtype=np.float32), ValueType.FLOAT32),
    ("a.f64", np.array([1e-300], dtype=np.float64), ValueType.FLOAT64),
    ("a.u64", np.array([2**64 - 1], dtype=np.uint64), ValueType.UINT64),
    ("a.bool", np.array([True, False, True]), ValueType.BOOL),
    ("a.str", ["", "a", "▁the", "<0x0A>", "日本語"], ValueType.STRING),
    ("a.empty", np.array([], dtype=np.int32), ValueType.INT32),
]


def _write_sample(path, tensor_types=("F32", "F16", "Q8_0", "Q4_K"), alignment=None):
    rng = np.random.default_rng(0)
    w = GGUFWriter(path, alignment=alignment)
    w.add("general.architecture", "llama")
    for key, value, vt in SCALARS:
        w.add(key, value, vt)
    for key, value, et in ARRAYS:
        w.add(key, value, ValueType.ARRAY, et)
    w.add("a.nested", [[1, 2], [3]], ValueType.ARRAY, ValueType.ARRAY)
    tensors = {}
    for i, name in enumerate(tensor_types):
        info = GGML_TYPES_BY_NAME[name]
        shape = (info.block_size * 8 if info.block_size > 1 else 24, 3)
        n_bytes = shape[0] * shape[1] // info.block_size * info.type_size
        raw = rng.integers(0, 256, n_bytes, dtype=np.uint8).reshape(shape[1], -1)
        w.add_tensor(f"t{i}.{name.lower()}", raw, name, shape=shape)
        tensors[f"t{i}.{name.lower()}"] = (name, shape, raw)
    w.write()
    return tensors


def test_round_trip_every_value_type_and_tensor_type(tmp_path):
    types = [t for t in GGML_TYPES_BY_NAME if t not in ("Q4_2", "Q4_3")]
    path = tmp_path / "all.gguf"
    tensors = _write_sample(path, types)
    with GGUFReader(path) as r:
        assert r.version == 3
        for key, value, vt in SCALARS:
            assert r.value_types[key] == (vt, None)
            if vt == ValueType.FLOAT32:
                assert r.metadata[key] == float(np.float32(value))
            else:
                assert r.metadata[key] == value
        for key, value, et in ARRAYS:
            assert r.value_types[key] == (ValueType.ARRAY, et)
            if et == ValueType.STRING:
                assert r.metadata[key] == value
            else:
                np.testing.assert_array_equal(r.metadata[key], value)
        assert [list(a) for a in r.metadata["a.nested"]] == [[1, 2], [3]]
        assert list(r.tensors) == list(tensors)
        for name, (ggml_type, shape, raw) in tensors.items():
            info = r.tensors[name]
            assert info.ggml_type.name == ggml_type and info.shape == shape
            np.testing.assert_array_equal(r.tensor_bytes(name), raw)
            assert info.offset % r.alignment == 0


def test_files_we_write_open_in_the_gguf_package(tmp_path):
    path = tmp_path / "x.gguf"
    tensors = _write_sample(path, alignment=64)
    g = gguf.GGUFReader(path)
    assert g.alignment == 64
    fields = g.fields
    for key, value, vt in SCALARS:
        f = fields[key]
        assert f.types == [gguf.GGUFValueType(int(vt))]
        got = f.contents()
        assert got == (float(np.float32(value)) if vt == ValueType.FLOAT32 else value)
    assert fields["a.str"].contents() == ARRAYS[6][1]
    np.testing.assert_array_equal(fields["a.i32"].contents(), [-1, 2, 3])
    for t in g.tensors:
        ggml_type, shape, raw = tensors[t.name]
        assert t.tensor_type.name == ggml_type
        assert tuple(int(d) for d in t.shape) == shape
        np.testing.assert_array_equal(np.asarray(t.data).reshape(-1).view(np.uint8), raw.reshape(-1))


def test_files_the_gguf_package_writes_read_here(tmp_path):
    path = tmp_path / "theirs.gguf"
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_uint32("qwen2.block_count", 3)
    w.add_float32("qwen2.rope.freq_base", 1e6)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ab"])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.5])
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    data = np.arange(64, dtype=np.float32).reshape(2, 32)
    w.add_tensor("blk.0.x.weight", data)
    w.add_tensor("blk.0.h.weight", data.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFReader(path) as r:
        assert r.architecture == "qwen2"
        assert r.arch_get("block_count") == 3
        assert r.arch_get("rope.freq_base") == 1e6
        assert r.metadata["tokenizer.ggml.tokens"] == ["a", "b", "ab"]
        np.testing.assert_array_equal(r.metadata["tokenizer.ggml.scores"], [0.0, -1.0, -2.5])
        assert r.metadata["tokenizer.ggml.add_bos_token"] is False
        np.testing.assert_array_equal(r.tensor_array("blk.0.x.weight"), data)
        np.testing.assert_array_equal(r.tensor_array("blk.0.h.weight"), data.astype(np.float16))
        assert r.tensors["blk.0.x.weight"].shape == (32, 2)


def test_real_gemma_file_agrees_with_the_gguf_package(gemma_path):
    g = gguf.GGUFReader(gemma_path)
    with GGUFReader(gemma_path) as r:
        assert set(r.metadata) == {k for k in g.fields if not k.startswith("GGUF.")}
        for key in r.metadata:
            theirs = g.fields[key].contents()
            ours = r.metadata[key]
            if isinstance(ours, np.ndarray):
                np.testing.assert_array_equal(ours, theirs)
            else:
                assert ours == theirs, key
        assert len(r.tensors) == len(g.tensors)
        for t in g.tensors:
            info = r.tensors[t.name]
            assert info.offset == t.data_offset
            assert info.nbytes == t.n_bytes and info.ggml_type.name == t.tensor_type.name
            ours = r.tensor_bytes(t.name)
            assert not ours.flags.writeable and not ours.flags.owndata  # a view into the mapping
            np.testing.assert_array_equal(ours.reshape(-1), np.asarray(t.data).reshape(-1).view(np.uint8))


def test_writer_is_atomic_and_refuses_bad_tensors(tmp_path):
    path = tmp_path / "m.gguf"
    w = GGUFWriter(path)
    with pytest.raises(GGUFWriteError):
        w.add_tensor("q", np.zeros((2, 33), np.uint8), "Q8_0", shape=(32, 2))  # 66 bytes for 68 needed
    with pytest.raises(GGUFWriteError):
        w.add_tensor("q", np.zeros((2, 34), np.uint8), "Q8_0", shape=(33, 2))  # not a block multiple

    class Boom(Exception):
        pass

    w.add_tensor("x", np.zeros(4, np.float32))
    w._tensors["x"] = ("F32", (4,), _Exploding(Boom))
    with pytest.raises(Boom):
        w.write()
    assert list(tmp_path.iterdir()) == []  # no final file, no leftover temporary


class _Exploding:
    """Stands in for tensor data and fails halfway through a write."""

    nbytes = 16

    def __init__(self, exc):
        self.exc = exc

    def reshape(self, *_):
        raise self.exc("disk full")


# -- hostile files ------------------------------------------------------------------------------------
# Files are built byte by byte here (not with our writer) so every field can be made wrong.


def _s(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _kv_u32(key: bytes, value: int) -> bytes:
    return _s(key) + struct.pack("<II", ValueType.UINT32, value)


def _tensor(name: bytes, dims, type_id: int, offset: int) -> bytes:
    return _s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", type_id, offset)


def build(kvs=None, tensors=None, data=None, version=3, magic=b"GGUF", n_tensors=None, n_kv=None, align=32):
    kvs = [_s(b"general.architecture") + struct.pack("<I", ValueType.STRING) + _s(b"llama")] if kvs is None else kvs
    if tensors is None:
        tensors = [_tensor(b"a", (32,), 0, 0), _tensor(b"b", (32, 2), 8, 128)]
    data = bytes(range(256)) * 2 if data is None else data
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(tensors)
    head += bytes(-len(head) % align)
    return head + data


def _open(tmp_path, blob: bytes):
    path = tmp_path / "h.gguf"
    path.write_bytes(blob)
    return GGUFReader(path)


def test_the_valid_baseline_opens(tmp_path):
    with _open(tmp_path, build()) as r:
        assert list(r.tensors) == ["a", "b"]
        assert r.tensor_bytes("b").shape == (2, 34)


HOSTILE = {
    "empty": b"",
    "bad magic": build(magic=b"GGML"),
    "version 1": build(version=1),
    "big-endian version": build(version=3 << 24),
    "huge tensor count": build(n_tensors=2**62),
    "huge kv count": build(n_kv=2**64 - 1),
    "kv count one too many": build(n_kv=2),
    "huge key length": build(kvs=[struct.pack("<Q", 2**60) + b"x"]),
    "key not utf-8": build(kvs=[_s(b"\xff\xfe") + struct.pack("<IB", ValueType.UINT8, 1)]),
    "empty key": build(kvs=[_s(b"") + struct.pack("<IB", ValueType.UINT8, 1)]),
    "duplicate key": build(kvs=[_kv_u32(b"k", 1), _kv_u32(b"k", 2)]),
    "unknown value type": build(kvs=[_s(b"k") + struct.pack("<II", 13, 0)]),
    "unknown array element type": build(kvs=[_s(b"k") + struct.pack("<IIQ", ValueType.ARRAY, 99, 1)]),
    "huge array count": build(kvs=[_s(b"k") + struct.pack("<IIQ", ValueType.ARRAY, ValueType.UINT64, 2**61)]),
    "huge string-array count": build(kvs=[_s(b"k") + struct.pack("<IIQ", ValueType.ARRAY, ValueType.STRING, 2**40)]),
    "string in array too long": build(kvs=[_s(b"k") + struct.pack("<IIQ", ValueType.ARRAY, ValueType.STRING, 1) + struct.pack("<Q", 2**50)]),
    "string value too long": build(kvs=[_s(b"k") + struct.pack("<IQ", ValueType.STRING, 10**9)]),
    "bool not 0/1": build(kvs=[_s(b"k") + struct.pack("<IB", ValueType.BOOL, 7)]),
    "deep nested arrays": build(kvs=[_s(b"k") + struct.pack("<IIQ", ValueType.ARRAY, ValueType.ARRAY, 1) * 1 + (struct.pack("<IQ", ValueType.ARRAY, 1) * 50)]),
    "alignment zero": build(kvs=[_kv_u32(b"general.alignment", 0)]),
    "alignment not power of two": build(kvs=[_kv_u32(b"general.alignment", 48)]),
    "alignment wrong type": build(kvs=[_s(b"general.alignment") + struct.pack("<IQ", ValueType.UINT64, 32)]),
    "zero dims": build(tensors=[_s(b"a") + struct.pack("<IIQ", 0, 0, 0)]),
    "five dims": build(tensors=[_tensor(b"a", (1, 1, 1, 1, 32), 0, 0)]),
    "zero-length dim": build(tensors=[_tensor(b"a", (32, 0), 0, 0)]),
    "dimension overflow": build(tensors=[_tensor(b"a", (2**32, 2**32, 2**32), 0, 0)]),
    "product wraps to small": build(tensors=[_tensor(b"a", (2**33, 2**31), 0, 0)]),
    "unknown tensor type": build(tensors=[_tensor(b"a", (32,), 77, 0)]),
    "removed tensor type Q4_2": build(tensors=[_tensor(b"a", (32,), 4, 0)]),
    "row not a block multiple": build(tensors=[_tensor(b"a", (33,), 8, 0)]),
    "misaligned offset": build(tensors=[_tensor(b"a", (32,), 0, 4)]),
    "offset out of file": build(tensors=[_tensor(b"a", (32,), 0, 2**40)]),
    "offset wraps": build(tensors=[_tensor(b"a", (32,), 0, 2**64 - 32)]),
    "tensor runs past end": build(tensors=[_tensor(b"a", (32, 5), 0, 0)]),
    "overlapping tensors": build(tensors=[_tensor(b"a", (32,), 0, 0), _tensor(b"b", (64,), 0, 96)]),
    "duplicate tensor names": build(tensors=[_tensor(b"a", (32,), 0, 0), _tensor(b"a", (32,), 0, 128)]),
    "tensor name not utf-8": build(tensors=[_tensor(b"\xc3\x28", (32,), 0, 0)]),
    "tensor name too long": build(tensors=[_tensor(b"x" * 64, (32,), 0, 0)]),
    "data section missing": build(data=b""),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_file_raises_gguf_error(tmp_path, case):
    with pytest.raises(GGUFError) as err:
        _open(tmp_path, HOSTILE[case])
    message = str(err.value)
    assert "h.gguf" in message and "\n" not in message


def test_truncation_anywhere_raises_gguf_error(tmp_path):
    """Every prefix of a valid file that cuts into the header, the padding or the tensor data fails."""
    blob = build()
    with _open(tmp_path, blob) as r:
        needed = max(t.offset + t.nbytes for t in r.tensors.values())
    for cut in range(needed):
        with pytest.raises(GGUFError):
            _open(tmp_path, blob[:cut])


def test_a_truncated_real_model_is_refused(tmp_path, gemma_path):
    head = open(gemma_path, "rb").read(8_000_000)  # the full header, a little of the data
    with pytest.raises(GGUFError, match="outside"):
        _open(tmp_path, head)
    with pytest.raises(GGUFError, match="truncated"):
        _open(tmp_path, head[:3_000_000])  # inside the 262,144-token vocabulary


def test_random_noise_raises_gguf_error(tmp_path):
    rng = np.random.default_rng(1)
    for _ in range(200):
        noise = rng.integers(0, 256, rng.integers(0, 400), dtype=np.uint8).tobytes()
        with pytest.raises(GGUFError):
            _open(tmp_path, b"GGUF" + struct.pack("<I", 3) + noise)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzzed_headers_open_or_raise_gguf_error(tmp_path, data):
    """Mutate bytes of a valid file's header: the reader either opens it (and then every tensor view lies
    inside the file) or raises GGUFError — never another exception."""
    blob = bytearray(build(kvs=[_kv_u32(b"general.alignment", 32), _s(b"n") + struct.pack("<IIQ", ValueType.ARRAY, ValueType.STRING, 2) + _s(b"ab") + _s(b"c")]))
    header_len = len(blob) - 512
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, header_len - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    try:
        r = _open(tmp_path, bytes(blob))
    except GGUFError:
        return
    with r:
        for info in r.tensors.values():
            assert info.offset + info.nbytes <= len(blob)
            assert r.tensor_bytes(info.name).size == info.nbytes


def test_version_2_files_open(tmp_path):
    """GGUF v2 has v3's layout (64-bit counts and lengths); v3 only added the big-endian variant."""
    with _open(tmp_path, build(version=2)) as r:
        assert r.version == 2 and list(r.tensors) == ["a", "b"]


def test_written_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = GGUFWriter(tmp_path / "m.gguf").write()
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644



def test_read_ahead_only_for_files_well_under_available_memory(gemma_path, monkeypatch):
    from localllm import api

    assert api.available_memory() > 0
    reader = GGUFReader(gemma_path)
    try:
        asked = []
        monkeypatch.setattr(reader, "read_ahead", lambda: asked.append(1) or True)
        monkeypatch.setattr(api, "available_memory", lambda: 4 * reader.file_size)
        assert api.read_ahead_if_small(reader) and asked == [1]
        monkeypatch.setattr(api, "available_memory", lambda: reader.file_size)  # it would take half
        assert not api.read_ahead_if_small(reader) and asked == [1]
        monkeypatch.undo()
        assert reader.read_ahead()  # the advice itself is accepted by the kernel
    finally:
        reader.close()
