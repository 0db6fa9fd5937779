"""A Hugging Face checkpoint directory: config.json and its safetensors shards, read one tensor at a time.

Tensors are read through the `safetensors` package (framework "numpy"). NumPy has no bfloat16, so a
BF16 tensor is read as its raw 16-bit words from the file (offsets from the safetensors header, memory
mapped) and widened to float32 exactly: a bfloat16 is the top half of a float32.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import ConversionError

# safetensors dtype -> numpy dtype of the values as stored
_NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh)
    except json.JSONDecodeError as exc:
        raise ConversionError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(value, dict):
        raise ConversionError(f"{path}: expected a JSON object")
    return value


def bf16_to_f32(words: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bit patterns -> float32 (exact)."""
    return (words.astype(np.uint32) << 16).view(np.float32)


class Checkpoint:
    """The tensors of a model directory: name -> (shard, dtype, shape), read on demand."""

    def __init__(self, model_dir: Path):
        self.dir = Path(model_dir)
        if not self.dir.is_dir():
            raise ConversionError(f"{self.dir}: not a directory (expected a Hugging Face model directory)")
        config_path = self.dir / "config.json"
        if not config_path.is_file():
            raise ConversionError(f"{self.dir}: no config.json (not a Hugging Face model directory)")
        self.config = read_json(config_path)
        self.shards = self._shard_paths()
        self.index: dict[str, tuple[Path, str, tuple[int, ...]]] = {}
        for shard in self.shards:
            for name, (dtype, shape) in _shard_entries(shard).items():
                if name in self.index:
                    raise ConversionError(f"{shard}: tensor '{name}' also appears in {self.index[name][0].name}")
                self.index[name] = (shard, dtype, shape)

    def _shard_paths(self) -> list[Path]:
        index_file = self.dir / "model.safetensors.index.json"
        if index_file.is_file():
            weight_map = read_json(index_file).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ConversionError(f"{index_file}: no weight_map")
            names = sorted(set(weight_map.values()))
            missing = [n for n in names if not (self.dir / n).is_file()]
            if missing:
                raise ConversionError(f"{self.dir}: shard(s) named in the index are missing: {', '.join(missing)}")
            return [self.dir / n for n in names]
        shards = sorted(self.dir.glob("*.safetensors"))
        if not shards:
            raise ConversionError(f"{self.dir}: no *.safetensors files (only safetensors checkpoints are supported)")
        return shards

    def names(self) -> list[str]:
        return list(self.index)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.index[name][2]

    def dtype(self, name: str) -> str:
        return self.index[name][1]

    def read(self, name: str) -> np.ndarray:
        """One tensor as float32 (the only copy of it in memory while it is converted)."""
        shard, dtype, shape = self.index[name]
        if dtype == "BF16":
            return bf16_to_f32(_raw_words(shard, name, shape)).reshape(shape)
        if dtype not in _NUMPY_DTYPES:
            raise ConversionError(f"{shard.name}: tensor '{name}' has dtype {dtype}; F32, F16, BF16 are supported")
        from safetensors import safe_open

        with safe_open(str(shard), framework="numpy") as fh:
            return np.asarray(fh.get_tensor(name), dtype=np.float32).reshape(shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)


def _shard_entries(shard: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    from safetensors import safe_open

    try:
        with safe_open(str(shard), framework="numpy") as fh:
            out = {}
            for name in fh.keys():
                view = fh.get_slice(name)
                out[name] = (str(view.get_dtype()), tuple(int(d) for d in view.get_shape()))
            return out
    except Exception as exc:  # the package raises its own error types for malformed files
        raise ConversionError(f"{shard}: not a readable safetensors file ({exc})") from None


def _raw_words(shard: Path, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor's 16-bit words, memory-mapped. The safetensors layout: u64 header length, JSON header
    (name -> dtype, shape, data_offsets relative to the end of the header), then the data."""
    with open(shard, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(header_len))
    begin, end = header[name]["data_offsets"]
    count = int(np.prod(shape, dtype=np.int64))
    if end - begin != 2 * count:
        raise ConversionError(f"{shard.name}: tensor '{name}' holds {end - begin} bytes, shape {list(shape)} needs {2 * count}")
    return np.memmap(shard, dtype="<u2", mode="r", offset=8 + header_len + begin, shape=(count,))
