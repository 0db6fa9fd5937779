"""GGUF reader: one read-only mmap of the whole file, every structure validated before use.

File layout (GGUF v2/v3, little-endian; ggml/docs/gguf.md):
    magic "GGUF" | uint32 version | uint64 n_tensors | uint64 n_kv
    n_kv x (string key | uint32 value_type | value)
    n_tensors x (string name | uint32 n_dims | uint64 dims[n_dims] | uint32 ggml_type | uint64 offset)
    padding to `general.alignment` (default 32)
    data section: tensor i occupies [data_offset + offset_i, + nbytes_i)
A string is uint64 length + UTF-8 bytes; an array is uint32 element_type + uint64 count + elements.

Numba kernels index tensor bytes without bounds checks, so this module is the only guard: every count,
length, dimension, type and offset is checked against the bytes that are really there, and anything
wrong raises `GGUFError` (file, field, byte offset). Counts are bounded by the bytes left before
anything is allocated, so a hostile header cannot make us allocate more than the file's size.
"""

from __future__ import annotations

import mmap
import os
import struct
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from ..errors import GGUFError
from .constants import (
    DEFAULT_ALIGNMENT,
    GGML_TYPES,
    GGUF_MAGIC,
    MAX_DIMS,
    SCALAR_DTYPES,
    SUPPORTED_VERSIONS,
    GGMLTypeInfo,
    ValueType,
)
from .metadata import Metadata

# llama.cpp refuses tensor names of GGML_MAX_NAME (64) bytes or more; so do we.
MAX_TENSOR_NAME = 63
# Arrays of arrays are legal GGUF; real files never nest deeper than this, and recursion must be bounded.
MAX_ARRAY_DEPTH = 3
# A string costs at least its 8-byte length, an array at least its 12-byte header.
_MIN_ELEMENT_BYTES = {ValueType.STRING: 8, ValueType.ARRAY: 12}
_INT64_MAX = 2**63 - 1

# The numpy dtype of the elements of unquantized tensor types (tensor_array returns these views).
_TENSOR_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,  # raw bits; bf16 -> f32 is bits << 16
    "F64": np.float64,
    "I8": np.int8,
    "I16": np.int16,
    "I32": np.int32,
    "I64": np.int64,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry. `shape` is in ggml order: shape[0] is the contiguous (row) length."""

    name: str
    ggml_type: GGMLTypeInfo
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    n_elements: int
    nbytes: int

    @property
    def row_bytes(self) -> int:
        return self.ggml_type.row_bytes(self.shape[0])

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.shape[0]


class _Cursor:
    """Sequential little-endian reads from the mapped file, each checked against the file's end."""

    def __init__(self, reader: "GGUFReader", buf):
        self.reader = reader
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def fail(self, field: str, problem: str, offset: Optional[int] = None):
        raise GGUFError(self.reader.path, field, self.pos if offset is None else offset, problem)

    def need(self, n: int, field: str) -> None:
        if n > self.end - self.pos:
            self.fail(field, f"needs {n} bytes but only {self.end - self.pos} remain (truncated file)")

    def unpack(self, fmt: str, size: int, field: str):
        self.need(size, field)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self, field: str) -> int:
        return self.unpack("<I", 4, field)

    def u64(self, field: str) -> int:
        return self.unpack("<Q", 8, field)

    def count(self, field: str, min_item_bytes: int) -> int:
        """A uint64 count, bounded by how many items of at least `min_item_bytes` could still fit."""
        start = self.pos
        n = self.u64(field)
        if n * min_item_bytes > self.end - self.pos:
            self.fail(field, f"count {n} cannot fit in the {self.end - self.pos} bytes left", start)
        return n

    def raw_string(self, field: str) -> bytes:
        start = self.pos
        n = self.u64(f"{field} length")
        if n > self.end - self.pos:
            self.fail(field, f"string length {n} exceeds the {self.end - self.pos} bytes left", start)
        data = self.buf[self.pos : self.pos + n]
        self.pos += n
        return data

    def utf8(self, field: str) -> str:
        start = self.pos
        data = self.raw_string(field)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.fail(field, f"is not valid UTF-8 ({exc.reason} at byte {exc.start})", start)

    def text(self, field: str) -> str:
        # String *values* (token texts, templates) are decoded leniently: a stray invalid byte in one
        # token must not make a whole model unreadable. Keys and tensor names are checked strictly.
        return self.raw_string(field).decode("utf-8", errors="replace")

    def value_type(self, field: str) -> ValueType:
        start = self.pos
        code = self.u32(field)
        try:
            return ValueType(code)
        except ValueError:
            self.fail(field, f"unknown metadata value type {code}", start)


# The readers' file mappings -> the address of their first byte (release_pages uses only these: the
# same advice on anonymous memory would zero it).
_FILE_MAPPINGS: "weakref.WeakKeyDictionary[mmap.mmap, int]" = weakref.WeakKeyDictionary()


def release_pages(view: np.ndarray) -> bool:
    """Drop this process's resident pages under `view`, a contiguous tensor view into a GGUFReader's
    mapping (madvise DONTNEED on the whole pages inside it): for a weight whose bytes were copied into
    another layout (the CPU backend's re-laid Q4_K rows), so that the copy does not count twice in the
    process's memory. The file stays mapped and in the page cache; a later read of the view faults its
    pages back in, unchanged. Returns False, doing nothing, for any other memory."""
    owner = view
    while isinstance(owner, np.ndarray):
        owner = owner.base
    if isinstance(owner, memoryview):
        owner = owner.obj
    start = _FILE_MAPPINGS.get(owner) if isinstance(owner, mmap.mmap) else None
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if start is None or advice is None or not view.flags.c_contiguous:
        return False
    first = view.ctypes.data - start
    page = mmap.PAGESIZE
    low, high = -(-first // page) * page, (first + view.nbytes) // page * page
    if high > low:
        try:
            owner.madvise(advice, low, high - low)
        except (OSError, ValueError):
            return False
    return True


class GGUFReader:
    """A validated, memory-mapped GGUF file.

    metadata: key -> value (ints, floats, bools, str; numeric arrays as numpy arrays; string arrays as
    list[str]); value_types: key -> (ValueType, element ValueType or None); tensors: name -> TensorInfo in
    file order. tensor_bytes()/tensor_array() are zero-copy views into the mapping.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as fh:
                self.file_size = os.fstat(fh.fileno()).st_size
                if self.file_size < 24:
                    raise GGUFError(self.path, "header", 0, f"file is {self.file_size} bytes, too short for a GGUF header")
                self._mmap = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise GGUFError(self.path, "file", None, f"cannot open: {exc.strerror or exc}") from None
        self._buffer = np.frombuffer(self._mmap, dtype=np.uint8)
        _FILE_MAPPINGS[self._mmap] = self._buffer.ctypes.data
        self.metadata: Metadata = Metadata(path=self.path)  # a dict with checked accessors (get_int ...)
        self.value_types: dict[str, tuple[ValueType, Optional[ValueType]]] = {}
        self.tensors: dict[str, TensorInfo] = {}
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    # -- parsing ------------------------------------------------------------------------------------------
    def _parse(self) -> None:
        cur = _Cursor(self, self._mmap)
        magic = bytes(self._mmap[:4])
        if magic != GGUF_MAGIC:
            cur.fail("magic", f"expected b'GGUF', found {magic!r} (not a GGUF file)", 0)
        cur.pos = 4
        self.version = cur.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            hint = " (a big-endian file?)" if self.version > 0xFFFF else ""
            cur.fail("version", f"version {self.version} is not supported{hint}; localllm reads versions 2 and 3", 4)
        n_tensors = cur.count("tensor count", 8 + 4 + 8 + 4 + 8)
        n_kv = cur.count("metadata count", 8 + 4 + 1)
        for i in range(n_kv):
            self._read_kv(cur, i)
        self.alignment = self._alignment(cur)
        infos = [self._read_tensor_info(cur, i) for i in range(n_tensors)]
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        if n_tensors and self.data_offset > self.file_size:
            cur.fail("data section", f"starts at {self.data_offset}, past the end of the {self.file_size}-byte file")
        self._place_tensors(infos)

    def _read_kv(self, cur: _Cursor, index: int) -> None:
        start = cur.pos
        key = cur.utf8(f"metadata key #{index}")
        if not key:
            cur.fail(f"metadata key #{index}", "is empty", start)
        if key in self.metadata:
            cur.fail(f"metadata key '{key}'", "appears twice", start)
        vtype = cur.value_type(f"type of '{key}'")
        if vtype == ValueType.ARRAY:
            elem_start = cur.pos
            elem = cur.value_type(f"element type of '{key}'")
            cur.pos = elem_start
            value = self._read_array(cur, key, 1)
            self.value_types[key] = (vtype, elem)
        else:
            value = self._read_scalar(cur, key, vtype)
            self.value_types[key] = (vtype, None)
        self.metadata[key] = value

    def _read_scalar(self, cur: _Cursor, key: str, vtype: ValueType):
        if vtype == ValueType.STRING:
            return cur.text(f"value of '{key}'")
        dtype = np.dtype(SCALAR_DTYPES[vtype])
        start = cur.pos
        cur.need(dtype.itemsize, f"value of '{key}'")
        value = np.frombuffer(self._mmap, dtype=dtype, count=1, offset=start)[0]
        cur.pos += dtype.itemsize
        if vtype == ValueType.BOOL:
            if value > 1:
                cur.fail(f"value of '{key}'", f"bool byte is {int(value)}, not 0 or 1", start)
            return bool(value)
        return value.item()

    def _read_array(self, cur: _Cursor, key: str, depth: int):
        if depth > MAX_ARRAY_DEPTH:
            cur.fail(f"value of '{key}'", f"arrays nested deeper than {MAX_ARRAY_DEPTH}")
        elem = cur.value_type(f"element type of '{key}'")
        if elem in SCALAR_DTYPES:
            dtype = np.dtype(SCALAR_DTYPES[elem])
            n = cur.count(f"length of '{key}'", dtype.itemsize)
            # Copied out of the mapping (at most the file's size): metadata outlives close().
            arr = np.frombuffer(self._mmap, dtype=dtype, count=n, offset=cur.pos).copy()
            cur.pos += n * dtype.itemsize
            if elem == ValueType.BOOL:
                if n and arr.max() > 1:
                    cur.fail(f"value of '{key}'", "bool array holds a byte other than 0 or 1")
                return arr.astype(bool)
            return arr
        n = cur.count(f"length of '{key}'", _MIN_ELEMENT_BYTES[elem])
        if elem == ValueType.STRING:
            return self._read_string_array(cur, key, n)
        return [self._read_array(cur, key, depth + 1) for _ in range(n)]

    def _read_string_array(self, cur: _Cursor, key: str, n: int) -> list[str]:
        # The hot loop of opening a model (262,144 tokens for Gemma): plain local variables, one
        # bounds check per string.
        buf, pos, end = self._mmap, cur.pos, cur.end
        unpack = struct.Struct("<Q").unpack_from
        out = []
        append = out.append
        for i in range(n):
            if pos + 8 > end:
                cur.pos = pos
                cur.fail(f"'{key}'[{i}] length", "truncated file")
            (length,) = unpack(buf, pos)
            pos += 8
            if length > end - pos:
                cur.fail(f"'{key}'[{i}]", f"string length {length} exceeds the {end - pos} bytes left", pos - 8)
            append(buf[pos : pos + length].decode("utf-8", errors="replace"))
            pos += length
        cur.pos = pos
        return out

    def _alignment(self, cur: _Cursor) -> int:
        if "general.alignment" not in self.metadata:
            return DEFAULT_ALIGNMENT
        vtype, _ = self.value_types["general.alignment"]
        value = self.metadata["general.alignment"]
        if vtype != ValueType.UINT32 or value <= 0 or value & (value - 1) or value > 1 << 20:
            cur.fail("general.alignment", f"must be a uint32 power of two up to 1 MiB, found {value!r} ({vtype.name})", None)
        return int(value)

    def _read_tensor_info(self, cur: _Cursor, index: int) -> tuple:
        start = cur.pos
        name = cur.utf8(f"tensor #{index} name")
        field = f"tensor '{name}'"
        if not name or len(name.encode()) > MAX_TENSOR_NAME:
            cur.fail(field, f"name must be 1 to {MAX_TENSOR_NAME} bytes", start)
        n_dims = cur.u32(f"{field} n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            cur.fail(field, f"has {n_dims} dimensions (1 to {MAX_DIMS} allowed)", cur.pos - 4)
        dims_at = cur.pos
        shape = tuple(cur.u64(f"{field} dims") for _ in range(n_dims))
        n_elements = 1
        for d in shape:
            if d == 0:
                cur.fail(field, f"has a zero dimension {list(shape)}", dims_at)
            n_elements *= d
            if n_elements > _INT64_MAX:
                cur.fail(field, f"dimensions {list(shape)} overflow 64 bits", dims_at)
        type_at = cur.pos
        type_id = cur.u32(f"{field} type")
        ggml_type = GGML_TYPES.get(type_id)
        if ggml_type is None:
            cur.fail(field, f"unknown tensor type {type_id}", type_at)
        if shape[0] % ggml_type.block_size:
            cur.fail(field, f"row length {shape[0]} is not a multiple of the {ggml_type.name} block size {ggml_type.block_size}", dims_at)
        offset_at = cur.pos
        offset = cur.u64(f"{field} offset")
        nbytes = n_elements // ggml_type.block_size * ggml_type.type_size
        return name, ggml_type, shape, offset, n_elements, nbytes, start, offset_at

    def _place_tensors(self, infos: list[tuple]) -> None:
        data_size = self.file_size - self.data_offset
        for name, ggml_type, shape, offset, n_elements, nbytes, start, offset_at in infos:
            field = f"tensor '{name}'"
            if name in self.tensors:
                raise GGUFError(self.path, field, start, "name appears twice")
            if offset % self.alignment:
                raise GGUFError(self.path, f"{field} offset", offset_at, f"{offset} is not a multiple of the alignment {self.alignment}")
            if offset > data_size or nbytes > data_size - offset:
                raise GGUFError(
                    self.path, f"{field} data", offset_at,
                    f"bytes [{offset}, {offset + nbytes}) of the data section lie outside its {data_size} bytes",
                )
            self.tensors[name] = TensorInfo(name, ggml_type, shape, self.data_offset + offset, n_elements, nbytes)
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in self.tensors.values())
        for (_, end_a, name_a), (start_b, _, name_b) in zip(spans, spans[1:]):
            if start_b < end_a:
                raise GGUFError(self.path, f"tensor '{name_b}' data", start_b, f"overlaps tensor '{name_a}'")

    # -- access ---------------------------------------------------------------------------------------------
    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise GGUFError(self.path, "metadata key 'general.architecture'", None, "missing or not a string")
        return arch

    def arch_key(self, suffix: str) -> str:
        """'<architecture>.<suffix>' (e.g. 'llama.attention.head_count'), for the checked accessors:
        `reader.metadata.get_int(reader.arch_key("block_count"), min=1)`."""
        return f"{self.architecture}.{suffix}"

    def arch_get(self, suffix: str, default=None):
        """The unchecked value of '<architecture>.<suffix>' (display only; the engine uses arch_key and the
        checked accessors of `metadata`)."""
        return self.metadata.get(self.arch_key(suffix), default)

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view [n_rows, row_bytes] into the mapping."""
        info = self._info(name)
        flat = self._buffer[info.offset : info.offset + info.nbytes]
        return flat.reshape(info.n_rows, info.row_bytes)

    def tensor_array(self, name: str) -> np.ndarray:
        """Unquantized tensors as typed views in NumPy order (reversed ggml shape); quantized ones as
        tensor_bytes()."""
        info = self._info(name)
        dtype = _TENSOR_DTYPES.get(info.ggml_type.name)
        if dtype is None:
            return self.tensor_bytes(name)
        flat = self._buffer[info.offset : info.offset + info.nbytes].view(dtype)
        return flat.reshape(tuple(reversed(info.shape)))

    def _info(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise KeyError(f"{self.path}: no tensor named '{name}'")
        return info

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.tensors.values())

    # -- lifetime ---------------------------------------------------------------------------------------------
    def read_ahead(self) -> bool:
        """Ask the kernel to start reading the whole file into the page cache (madvise WILLNEED: it
        returns at once, the reads run in the background). Returns whether it could ask. The caller
        decides whether the file is small enough to be worth it (localllm.load: under half the
        available memory)."""
        advice = getattr(mmap, "MADV_WILLNEED", None)
        if advice is None or self._mmap is None:
            return False
        try:
            self._mmap.madvise(advice)
        except (OSError, ValueError):
            return False
        return True

    def close(self) -> None:
        """Release the mapping. Views handed out keep it alive until they are dropped (mmap refuses to
        close under exported buffers; then the garbage collector closes it)."""
        mm = getattr(self, "_mmap", None)
        if mm is None:
            return
        self._buffer = None
        try:
            mm.close()
        except BufferError:
            pass
        self._mmap = None

    def __enter__(self) -> "GGUFReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFReader({str(self.path)!r}, v{self.version}, {len(self.metadata)} keys, {len(self.tensors)} tensors)"
