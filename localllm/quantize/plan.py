"""The quantization plan: each tensor's output type and size, the output metadata, the file size.

Built from the input file's header alone (no tensor data is read), so `--dry-run` and the real run share
it: the streaming writer lays the output header out from the plan before the first tensor is converted.
"""

from __future__ import annotations

import re

from collections import Counter
from dataclasses import dataclass
from typing import Optional

from .. import quant
from ..errors import UnsupportedArchitecture, UnsupportedQuantType
from ..gguf import GGUFReader, GGUFWriter
from ..model.hparams import read_count
from ..gguf.constants import GGML_TYPES_BY_NAME, ValueType
from ..model.archs import ARCHITECTURES
from .recipes import FILE_TYPES, UNQUANTIZED, ModelShape, QuantizeError, TensorSpec, choose_types, fits

QUANTIZATION_VERSION = 2  # ggml's GGML_QNT_VERSION, stored as general.quantization_version
# Keys of split files; the output is always one file (llama.cpp drops them too).
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]  # ggml order
    src_type: str
    dst_type: str
    src_bytes: int
    dst_bytes: int

    @property
    def converts(self) -> bool:
        return self.src_type != self.dst_type

    @property
    def requantizes(self) -> bool:
        """Converting from an already-quantized type (llama.cpp: `--allow-requantize`)."""
        return self.converts and self.src_type not in UNQUANTIZED


@dataclass
class QuantizePlan:
    file_type: str
    tensors: list[TensorPlan]
    writer: GGUFWriter  # metadata set and every tensor declared; its path is the output's

    @property
    def output_size(self) -> int:
        return self.writer.file_size()

    @property
    def input_tensor_bytes(self) -> int:
        return sum(t.src_bytes for t in self.tensors)

    @property
    def output_tensor_bytes(self) -> int:
        return sum(t.dst_bytes for t in self.tensors)

    @property
    def n_weights(self) -> int:
        total = 0
        for t in self.tensors:
            n = 1
            for d in t.shape:
                n *= d
            total += n
        return total

    def by_type(self) -> dict[str, tuple[int, int]]:
        """Output type -> (tensor count, bytes), largest share first: the dry-run table."""
        counts, sizes = Counter(), Counter()
        for t in self.tensors:
            counts[t.dst_type] += 1
            sizes[t.dst_type] += t.dst_bytes
        return {name: (counts[name], sizes[name]) for name, _ in sizes.most_common()}


def resolve_file_type(name: str) -> str:
    key = name.upper()
    if key not in FILE_TYPES:
        raise QuantizeError(f"unknown quantization type {name!r} (choose from: {', '.join(FILE_TYPES)})")
    return key


def resolve_tensor_type(name: Optional[str], option: str) -> Optional[str]:
    """A ggml type given to --output-tensor-type / --token-embedding-type, checked to be one we can write."""
    if name is None:
        return None
    key = name.upper()
    if key not in GGML_TYPES_BY_NAME or key == "Q8_K" or not quant.is_supported(key) or quant.get(key).quantize is None:
        writable = [n for n in quant.supported_names() if n != "Q8_K" and quant.get(n).quantize is not None]
        raise QuantizeError(f"{option}: cannot write tensors of type {name!r} (choose from: {', '.join(writable)})")
    return key


def model_shape(reader: GGUFReader) -> ModelShape:
    """The hyperparameters the recipes need; UnsupportedArchitecture for one localllm cannot run."""
    meta = reader.metadata
    arch = meta.get_str("general.architecture", None)
    if arch not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"{reader.path}: cannot quantize architecture {arch!r} (supported: {', '.join(sorted(ARCHITECTURES))})"
        )

    # Checked as at load (model/hparams.py), n_head defaulting to 1: the recipes only need the counts.
    n_head = read_count(reader, "n_head", 1)
    return ModelShape(arch, read_count(reader, "n_layer"), n_head, read_count(reader, "n_head_kv", n_head),
                      read_count(reader, "n_expert", 0))


def _llama_order(tensor) -> tuple:
    """llama-quantize's tensor order (its loader's weight_name_comparer): by the layer of a `blk.N.` name
    (other tensors, layer -1, first), then by name. Files written in that order keep it; others (our tiny
    mixture-of-experts files: token_embd before output_norm, each layer's tensors as the module lists
    them) come out as llama-quantize writes them."""
    match = re.match(r"blk\.(\d+)\.", tensor.name)
    return (int(match.group(1)) if match else -1, tensor.name.encode())


def make_plan(
    reader: GGUFReader,
    output_path,
    file_type: str,
    *,
    output_type: Optional[str] = None,
    token_embedding_type: Optional[str] = None,
    pure: bool = False,
    allow_requantize: bool = False,
) -> QuantizePlan:
    """Every tensor's output type (llama.cpp's recipe for `file_type`), checked, and the output header."""
    file_type = resolve_file_type(file_type)
    output_type = resolve_tensor_type(output_type, "--output-tensor-type")
    token_embedding_type = resolve_tensor_type(token_embedding_type, "--token-embedding-type")
    model = model_shape(reader)
    specs = [TensorSpec(t.name, tuple(t.shape), t.ggml_type.name) for t in sorted(reader.tensors.values(), key=_llama_order)]
    types = choose_types(
        specs, file_type, model, output_type=output_type, token_embedding_type=token_embedding_type, pure=pure
    )
    writer = GGUFWriter(output_path)
    writer.copy_metadata(reader, skip=SPLIT_KEYS)
    writer.add("general.quantization_version", QUANTIZATION_VERSION, ValueType.UINT32)
    writer.add("general.file_type", FILE_TYPES[file_type].ftype, ValueType.UINT32)
    tensors = []
    for spec, dst in zip(specs, types):
        _check_convertible(spec, dst, allow_requantize)
        dst_bytes = writer.declare_tensor(spec.name, dst, spec.shape)
        src_bytes = reader.tensors[spec.name].nbytes
        tensors.append(TensorPlan(spec.name, spec.shape, spec.ggml_type, dst, src_bytes, dst_bytes))
    return QuantizePlan(file_type, tensors, writer)


def _check_convertible(spec: TensorSpec, dst: str, allow_requantize: bool) -> None:
    if spec.ggml_type == dst:
        return  # copied as is
    if not fits(spec.shape[0], dst):
        raise QuantizeError(f"tensor {spec.name}: rows of {spec.shape[0]} values do not split into {dst} blocks")
    for name, role in ((spec.ggml_type, "read"), (dst, "write")):
        if not quant.is_supported(name) or (role == "write" and quant.get(name).quantize is None):
            raise UnsupportedQuantType(f"tensor {spec.name}: localllm cannot {role} type {name}")
    if spec.ggml_type not in UNQUANTIZED and not allow_requantize:
        raise QuantizeError(
            f"tensor {spec.name} is already quantized ({spec.ggml_type}); requantizing loses quality,"
            " pass --allow-requantize to do it anyway"
        )
