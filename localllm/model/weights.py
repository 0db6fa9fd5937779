"""Binding a model's tensors: every one checked for presence, shape and type before any kernel runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..backends.base import Backend, Weight
from ..errors import TensorError


@dataclass(frozen=True)
class TensorSpec:
    """A tensor an architecture needs: name, ggml shape (ne0 first), whether it may be absent,
    and whether it is a small float vector used directly by the host (norm weights, biases)."""

    name: str
    shape: tuple[int, ...]
    optional: bool = False
    vector: bool = False
    # A part of a fused tensor in the file (Phi-3's attn_qkv, its gate-and-up ffn_up): the file's tensor,
    # its shape, and the first row (output feature) of this part. The part is a view of those rows.
    fused: Optional[str] = None
    fused_shape: tuple[int, ...] = ()
    first_row: int = 0
    # Rows interleaved in groups instead (Qwen3.5's attn_q: each head's query rows, then its gate rows):
    # (group, width) takes, of every `group` consecutive rows, the `width` from first_row on (a copy)
    row_groups: tuple = ()
    gathered: bool = False  # only rows are read (Weight.gathered): an embedding table, not the output too

    @property
    def file_name(self) -> str:
        return self.fused or self.name

    @property
    def file_shape(self) -> tuple[int, ...]:
        return self.fused_shape if self.fused else self.shape


class BoundWeights:
    """name -> Weight (matrices, on the backend) or float32 ndarray (vectors). Absent optionals are None."""

    def __init__(self, entries: dict):
        self._entries = entries

    def __getitem__(self, name: str):
        return self._entries[name]

    def get(self, name: str):
        return self._entries.get(name)

    def __contains__(self, name: str) -> bool:
        return self._entries.get(name) is not None

    def __len__(self) -> int:
        return sum(1 for v in self._entries.values() if v is not None)


def bind_weights(reader, specs: list[TensorSpec], backend: Backend) -> BoundWeights:
    """Validate every spec against the file, then upload; raises TensorError naming the tensor."""
    entries: dict = {}
    for spec in specs:
        name = spec.file_name
        info = reader.tensors.get(name)
        if info is None:
            if spec.optional:
                entries[spec.name] = None
                continue
            raise TensorError(f"{reader.path}: tensor '{name}' is missing (the architecture needs it)")
        if tuple(info.shape) != tuple(spec.file_shape):
            raise TensorError(
                f"{reader.path}: tensor '{name}' has shape {list(info.shape)}, expected {list(spec.file_shape)}"
            )
        qtype = info.ggml_type.name
        rows = slice(spec.first_row, spec.first_row + int(np.prod(spec.shape[1:], dtype=np.int64)))
        if spec.vector:
            if qtype not in ("F32", "F16", "BF16"):
                raise TensorError(f"{reader.path}: tensor '{name}' is {qtype}; a float type is expected")
            vector = _vector(reader, name, qtype)
            entries[spec.name] = vector[spec.first_row : spec.first_row + spec.shape[0]] if spec.fused else vector
            continue
        if not backend.supports(qtype):
            raise TensorError(
                f"{reader.path}: tensor '{name}' has type {qtype}, which the {backend.name} backend does not support"
            )
        data = reader.tensor_bytes(name)
        if spec.row_groups:
            group, width = spec.row_groups
            grouped = data.reshape(-1, group, data.shape[-1])[:, spec.first_row : spec.first_row + width]
            data = np.ascontiguousarray(grouped.reshape(-1, data.shape[-1]))
            data.flags.writeable = False  # as the mapping is (kernels are compiled for read-only weights)
        elif spec.fused:
            data = data[rows]
        entries[spec.name] = backend.upload(Weight(spec.name, qtype, tuple(spec.shape), data, spec.gathered))
    return BoundWeights(entries)


def _vector(reader, name: str, qtype: str) -> np.ndarray:
    data = reader.tensor_array(name)
    if qtype == "BF16":
        return (data.astype(np.uint32) << 16).view(np.float32).reshape(-1)
    return np.ascontiguousarray(data, dtype=np.float32).reshape(-1)
