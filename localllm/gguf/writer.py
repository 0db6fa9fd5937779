"""GGUF writer (version 3): metadata and tensors of any supported type, written atomically.

The file is written under a temporary name in the target directory and renamed over the final name
only once it is complete and flushed, so an interrupted write never leaves a truncated model behind.

Two ways to supply tensor data:
- in memory: `add_tensor(name, data, ...)` for every tensor, then `write()`;
- streamed: `declare_tensor(name, type, shape)` for every tensor (the header, with every offset, follows
  from types and shapes alone), then `with writer.stream() as out:` and `out.write_tensor(name, data)`
  in declaration order, so only one tensor's bytes need exist at a time (`localllm quantize`).
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
import uuid
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ..errors import InsufficientDiskSpace, LocalLLMError, missing_directory, os_error_message
from .constants import DEFAULT_ALIGNMENT, GGML_TYPES, GGML_TYPES_BY_NAME, GGUF_MAGIC, MAX_DIMS, SCALAR_DTYPES, WRITE_VERSION, ValueType

# numpy dtype -> the ggml type a plain array is stored as.
_DTYPE_TO_GGML = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.float64): "F64",
    np.dtype(np.int8): "I8",
    np.dtype(np.int16): "I16",
    np.dtype(np.int32): "I32",
    np.dtype(np.int64): "I64",
}
# numpy dtype kind/size -> metadata value type.
_DTYPE_TO_VALUE = {np.dtype(code): vt for vt, code in SCALAR_DTYPES.items() if vt != ValueType.BOOL}
_DTYPE_TO_VALUE[np.dtype(bool)] = ValueType.BOOL


class GGUFWriteError(LocalLLMError):
    """Metadata or a tensor that cannot be written as given."""


def _infer_scalar_type(value) -> ValueType:
    if isinstance(value, (bool, np.bool_)):
        return ValueType.BOOL
    if isinstance(value, np.generic):
        return _DTYPE_TO_VALUE[value.dtype]
    if isinstance(value, int):
        return ValueType.INT32 if -(2**31) <= value < 2**31 else ValueType.INT64
    if isinstance(value, float):
        return ValueType.FLOAT32
    if isinstance(value, str):
        return ValueType.STRING
    if isinstance(value, (list, tuple, np.ndarray)):
        return ValueType.ARRAY
    raise GGUFWriteError(f"cannot store a {type(value).__name__} as GGUF metadata")


def _infer_element_type(values) -> ValueType:
    if isinstance(values, np.ndarray):
        if values.dtype not in _DTYPE_TO_VALUE:
            raise GGUFWriteError(f"cannot store a {values.dtype} array as GGUF metadata")
        return _DTYPE_TO_VALUE[values.dtype]
    if len(values) == 0:
        return ValueType.INT32
    kinds = {_infer_scalar_type(v) for v in values}
    if kinds <= {ValueType.INT32, ValueType.INT64}:
        return max(kinds)
    if len(kinds) != 1:
        raise GGUFWriteError(f"a metadata array mixes types {sorted(k.name for k in kinds)}")
    return kinds.pop()


class GGUFWriter:
    """Collect metadata (`add`) and tensors (`add_tensor`), then `write()` once."""

    def __init__(self, path: str | os.PathLike, alignment: Optional[int] = None):
        self.path = Path(path)
        self._kv: dict[str, tuple[ValueType, Optional[ValueType], Any]] = {}
        # name -> (ggml type name, ggml-order shape, data; None for a declared tensor)
        self._tensors: dict[str, tuple[str, tuple[int, ...], Optional[np.ndarray]]] = {}
        if alignment is not None:
            self.add("general.alignment", alignment, ValueType.UINT32)

    @property
    def alignment(self) -> int:
        entry = self._kv.get("general.alignment")
        return int(entry[2]) if entry else DEFAULT_ALIGNMENT

    # -- metadata ---------------------------------------------------------------------------------------
    def add(self, key: str, value, value_type: Optional[ValueType] = None, element_type: Optional[ValueType] = None) -> None:
        """Set a metadata key. Types are inferred when not given: bool, int (INT32, or INT64 when it does
        not fit), float (FLOAT32), str, list/tuple/ndarray (ARRAY of the elements' type)."""
        if not isinstance(key, str) or not key:
            raise GGUFWriteError("metadata keys must be non-empty strings")
        vtype = ValueType(value_type) if value_type is not None else _infer_scalar_type(value)
        elem = None
        if vtype == ValueType.ARRAY:
            elem = ValueType(element_type) if element_type is not None else _infer_element_type(value)
        if key == "general.alignment":
            if vtype != ValueType.UINT32 or int(value) <= 0 or int(value) & (int(value) - 1):
                raise GGUFWriteError("general.alignment must be a power of two stored as UINT32")
        self._kv[key] = (vtype, elem, value)

    def copy_metadata(self, reader, skip: Sequence[str] = ()) -> None:
        """Copy every metadata key of a GGUFReader, with its stored types (keys in `skip` left out)."""
        for key, value in reader.metadata.items():
            if key in skip:
                continue
            vtype, elem = reader.value_types[key]
            self.add(key, value, vtype, elem)

    # -- tensors ------------------------------------------------------------------------------------------
    def add_tensor(self, name: str, data: np.ndarray, ggml_type: Optional[str] = None, shape: Optional[Sequence[int]] = None) -> None:
        """Add a tensor. Plain float/int arrays: the type and (ggml-order) shape follow from the array.
        Quantized data (and BF16 bits): `data` holds the raw bytes, `ggml_type` names the type and `shape`
        gives the ggml-order shape (shape[0] = elements per row)."""
        data = np.ascontiguousarray(data)
        if ggml_type is None:
            ggml_type = _DTYPE_TO_GGML.get(data.dtype)
            if ggml_type is None:
                raise GGUFWriteError(f"tensor '{name}': no ggml type for dtype {data.dtype}; pass ggml_type")
        ggml_type = _type_name(name, ggml_type)
        if shape is None:
            if data.dtype == np.uint8 and GGML_TYPES_BY_NAME[ggml_type].block_size > 1:
                raise GGUFWriteError(f"tensor '{name}': quantized data needs its shape")
            shape = tuple(reversed(data.shape)) or (1,)
        ggml_type, shape, nbytes = self._check_tensor(name, ggml_type, shape)
        if data.nbytes != nbytes:
            raise GGUFWriteError(f"tensor '{name}': {data.nbytes} bytes given, {ggml_type} {list(shape)} needs {nbytes}")
        self._tensors[name] = (ggml_type, shape, data)

    def declare_tensor(self, name: str, ggml_type: str, shape: Sequence[int]) -> int:
        """Declare a tensor whose bytes `stream()` will take later; returns the byte size it must have."""
        ggml_type, shape, nbytes = self._check_tensor(name, _type_name(name, ggml_type), shape)
        self._tensors[name] = (ggml_type, shape, None)
        return nbytes

    def _check_tensor(self, name: str, ggml_type: str, shape: Sequence[int]) -> tuple[str, tuple[int, ...], int]:
        if name in self._tensors:
            raise GGUFWriteError(f"tensor '{name}' added twice")
        if not name or len(name.encode()) > 63:
            raise GGUFWriteError(f"tensor name '{name}' must be 1 to 63 bytes")
        info = GGML_TYPES_BY_NAME[ggml_type]
        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= MAX_DIMS or min(shape) < 1:
            raise GGUFWriteError(f"tensor '{name}': shape {list(shape)} must have 1 to {MAX_DIMS} positive dimensions")
        if shape[0] % info.block_size:
            raise GGUFWriteError(f"tensor '{name}': row length {shape[0]} is not a multiple of the {ggml_type} block size {info.block_size}")
        return ggml_type, shape, _nbytes(ggml_type, shape)

    def file_size(self) -> int:
        """Bytes the written file will have (header, padding and every tensor, declared or added)."""
        header, offsets = self._layout()
        return len(header) + (_align(offsets[-1][0] + offsets[-1][1], self.alignment) if offsets else 0)

    # -- output -----------------------------------------------------------------------------------------
    def write(self) -> Path:
        """Write the file (every tensor added with its data): temporary name, fsync, then rename."""
        declared = [name for name, entry in self._tensors.items() if entry[2] is None]
        if declared:
            raise GGUFWriteError(f"tensor '{declared[0]}' was declared without data: write it through stream()")
        with self.stream() as out:
            for name, entry in self._tensors.items():
                out.write_tensor(name, entry[2])
        return self.path

    def stream(self) -> "TensorStream":
        """Open the temporary file and write the header; the returned context manager takes every tensor's
        bytes in order and, on a clean exit, renames the file into place. On any exception (Ctrl-C
        included) or a missing tensor, the temporary file is removed and nothing appears under `path`."""
        return TensorStream(self)

    def _layout(self) -> tuple[bytes, list[tuple[int, int]]]:
        """The header (padded to the alignment) and each tensor's (data-section offset, bytes)."""
        align = self.alignment
        header = bytearray()
        header += GGUF_MAGIC + struct.pack("<IQQ", WRITE_VERSION, len(self._tensors), len(self._kv))
        for key, (vtype, elem, value) in self._kv.items():
            header += _string(key) + struct.pack("<I", vtype)
            header += _value(vtype, elem, value)
        offset = 0
        placed = []
        for name, (ggml_type, shape, _) in self._tensors.items():
            nbytes = _nbytes(ggml_type, shape)
            header += _string(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
            header += struct.pack("<IQ", GGML_TYPES_BY_NAME[ggml_type].type_id, offset)
            placed.append((offset, nbytes))
            offset = _align(offset + nbytes, align)
        header += bytes(_align(len(header), align) - len(header))
        return bytes(header), placed


class TensorStream:
    """One write of a GGUFWriter's file: header first, then tensor bytes in declaration order."""

    def __init__(self, writer: GGUFWriter):
        self._writer = writer
        self._names = list(writer._tensors)
        self._next = 0
        self._written = 0  # bytes of the data section written so far
        self._fh = None
        self.tmp_path: Optional[Path] = None

    def __enter__(self) -> "TensorStream":
        path = self._writer.path
        header, self._placed = self._writer._layout()
        require_directory(path.parent)  # never a silently created tree (llama-quantize refuses too)
        # Not tempfile.mkstemp: its 0600 mode would make the model unreadable to other users and tools;
        # os.open with 0666 lets the user's umask decide, as for any file they create.
        self.tmp_path = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial"
        try:
            fd = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as exc:
            raise self._failure(exc) from None
        self._fh = os.fdopen(fd, "wb")
        try:
            self._write(header)
        except BaseException:
            self._discard()
            raise
        return self

    def write_tensor(self, name: str, data: np.ndarray) -> None:
        """The bytes of the next tensor in declaration order (any dtype; its raw bytes are written)."""
        if self._next >= len(self._names) or self._names[self._next] != name:
            expected = self._names[self._next] if self._next < len(self._names) else "none"
            raise GGUFWriteError(f"tensor '{name}' written out of order (next expected: {expected})")
        offset, nbytes = self._placed[self._next]
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data)
        raw = data.reshape(-1).view(np.uint8)
        if raw.nbytes != nbytes:
            raise GGUFWriteError(f"tensor '{name}': {raw.nbytes} bytes given, its declared type and shape need {nbytes}")
        self._write(bytes(offset - self._written))
        self._write(memoryview(raw))
        self._written = offset + nbytes
        self._next += 1

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._discard()
            return
        try:
            if self._next != len(self._names):
                raise GGUFWriteError(f"tensor '{self._names[self._next]}' was never written")
            # Pad the file to the alignment, as gguf-py does, so the last tensor ends on a boundary too.
            self._write(bytes(_align(self._written, self._writer.alignment) - self._written))
            try:
                self._fh.flush()
                os.fsync(self._fh.fileno())
                self._fh.close()
                os.replace(self.tmp_path, self._writer.path)
            except OSError as exc:
                raise self._failure(exc) from None
        except BaseException:
            self._discard()
            raise

    def _write(self, data) -> None:
        try:
            self._fh.write(data)
        except OSError as exc:
            raise self._failure(exc) from None

    def _failure(self, exc: OSError) -> Exception:
        """The error to raise for a failed write, naming the final path (never the temporary one). A full
        disk is InsufficientDiskSpace with the bytes the file needs and those free once the partial file is
        removed; the partial file is removed here, before measuring."""
        path = self._writer.path
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return type(exc)(exc.errno, exc.strerror, str(path))
        self._discard()
        needed = self._writer.file_size()
        try:
            free = f", {shutil.disk_usage(path.parent).free:,} are free"
        except OSError:
            free = ""
        return InsufficientDiskSpace(
            f"{os_error_message(exc, path)} (the file needs {needed:,} bytes{free}); nothing was written"
        )

    def _discard(self) -> None:
        """Close and remove the temporary file (safe to call twice)."""
        try:
            if self._fh is not None:
                self._fh.close()
        except OSError:
            pass  # a close that fails to flush on a full disk: the file is removed anyway
        finally:
            try:
                os.unlink(self.tmp_path)
            except FileNotFoundError:
                pass


def check_new_output(output_path: Path, force: bool, error=ValueError) -> None:
    """Refuse, before anything is read (raising `error` with one line): an output that is a directory, an
    existing file without `force`, or one in a directory that does not exist (never created: as
    llama-quantize)."""
    if output_path.is_dir():
        raise error(f"{output_path} is a directory; give the output file's name")
    if output_path.exists() and not force:
        raise error(f"{output_path} already exists (use --force to overwrite it)")
    require_directory(output_path.parent)


def require_directory(directory: Path) -> None:
    """The output's directory must exist (as a directory): writing into a mistyped path is an error."""
    if not directory.is_dir():
        if directory.exists():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory))
        raise missing_directory(directory)


def _nbytes(ggml_type: str, shape: tuple[int, ...]) -> int:
    info = GGML_TYPES_BY_NAME[ggml_type]
    return int(np.prod(shape, dtype=object)) // info.block_size * info.type_size


def _type_name(name: str, ggml_type) -> str:
    ggml_type = ggml_type.upper() if isinstance(ggml_type, str) else GGML_TYPES[int(ggml_type)].name
    if ggml_type not in GGML_TYPES_BY_NAME:
        raise GGUFWriteError(f"tensor '{name}': unknown ggml type {ggml_type}")
    return ggml_type


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _value(vtype: ValueType, elem: Optional[ValueType], value) -> bytes:
    if vtype == ValueType.STRING:
        return _string(str(value))
    if vtype == ValueType.ARRAY:
        return _array(elem, value)
    if vtype == ValueType.BOOL:
        return struct.pack("<?", bool(value))
    return np.array(value, dtype=SCALAR_DTYPES[vtype]).tobytes()


def _array(elem: ValueType, values) -> bytes:
    out = bytearray(struct.pack("<IQ", elem, len(values)))
    if elem == ValueType.STRING:
        for v in values:
            out += _string(v)
    elif elem == ValueType.ARRAY:
        for v in values:
            out += _array(_infer_element_type(v), v)
    elif elem == ValueType.BOOL:
        out += np.asarray(values, dtype=bool).astype(np.uint8).tobytes()
    else:
        out += np.asarray(values, dtype=SCALAR_DTYPES[elem]).tobytes()
    return bytes(out)
