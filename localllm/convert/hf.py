"""Hugging Face model directory -> GGUF file, one tensor at a time.

    convert_checkpoint("Qwen2.5-0.5B-Instruct/", "qwen.gguf", out_type="F16")

What is written is what llama.cpp's convert_hf_to_gguf.py writes for the family (see family.py and the
family modules): the same metadata keys and types, tensor names and value conventions, tokenizer and
chat template. Matrices are stored in `out_type`; vectors (norms, biases, RoPE factors) in F32, as
llama.cpp does. The GGUF header is written first (types and shapes are known from the safetensors
headers); then each tensor is read, transformed and written through the writer's stream before the next
is read, so the memory held is about one tensor (the largest, token_embd, in float32), not the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..gguf import GGUFWriter
from ..gguf.writer import check_new_output
from ..gguf.constants import ValueType
from .checkpoint import Checkpoint
from .errors import ConversionError
from .family import Family, family_for
from .vocab import vocab_metadata

OUT_TYPES = {"F32": 0, "F16": 1, "BF16": 32}  # -> general.file_type (llama_ftype ALL_F32, MOSTLY_F16, MOSTLY_BF16)
QUANTIZATION_VERSION = 2

Progress = Callable[[str, int, int], None]  # (GGUF tensor name, index, count)


def convert_checkpoint(model_dir, output_path, out_type: str = "F32", progress: Optional[Progress] = None,
                       force: bool = False) -> Path:
    """Convert a Hugging Face model directory (config.json, *.safetensors, tokenizer files) to a GGUF
    file at `output_path` (written under a temporary name, renamed when complete). Returns the path.
    An existing `output_path` is replaced only with `force` (as quantize)."""
    out_type = out_type.upper()
    if out_type not in OUT_TYPES:
        raise ConversionError(f"output type {out_type!r} is not supported (choose from {', '.join(OUT_TYPES)})")
    check_new_output(Path(output_path), force, ConversionError)  # before anything is read
    ckpt = Checkpoint(Path(model_dir))
    family = family_for(ckpt.config)
    vocab = vocab_metadata(ckpt.dir, family, family.config.get("vocab_size"))
    output_path = Path(output_path)
    writer = GGUFWriter(output_path)
    _write_metadata(writer, ckpt, family, vocab, out_type)
    plan = _tensor_plan(ckpt, family, vocab.n_tokens, out_type)
    _check_complete(family, [entry.name for entry in plan])
    for entry in plan:
        writer.declare_tensor(entry.name, entry.ggml_type, entry.shape)
    # The header goes first; then each tensor is read, converted and written before the next is read.
    with writer.stream() as out:
        for index, entry in enumerate(plan):
            if progress is not None:
                progress(entry.name, index, len(plan))
            out.write_tensor(entry.name, _stored(entry.read(), entry.ggml_type))
    return output_path


def _write_metadata(writer: GGUFWriter, ckpt: Checkpoint, family: Family, vocab, out_type: str) -> None:
    writer.add("general.architecture", family.ARCH, ValueType.STRING)
    writer.add("general.name", ckpt.dir.resolve().name, ValueType.STRING)
    for key, value, vtype in family.metadata():
        writer.add(key, value, vtype)
    writer.add("general.file_type", OUT_TYPES[out_type], ValueType.UINT32)
    writer.add("general.quantization_version", QUANTIZATION_VERSION, ValueType.UINT32)
    for key, value, vtype, elem in vocab.entries:
        writer.add(key, value, vtype, elem)


@dataclass
class _Planned:
    name: str  # GGUF name
    ggml_type: str
    shape: tuple[int, ...]  # ggml order (row length first)
    read: Callable[[], np.ndarray]  # float32 values in GGUF conventions, NumPy order


def _tensor_plan(ckpt: Checkpoint, family: Family, n_tokens: int, out_type: str) -> list[_Planned]:
    """Every GGUF tensor with its type and shape (known from the checkpoint's header, before any data is
    read), in checkpoint order, then the extras. Matrices in out_type, vectors in F32 (as llama.cpp)."""
    plan: list[_Planned] = []
    seen: dict[str, str] = {}
    for hf_name in ckpt.names():
        gguf_name = family.tensor_name(hf_name)
        if gguf_name is None:
            continue
        if gguf_name in seen:
            raise ConversionError(f"tensors '{seen[gguf_name]}' and '{hf_name}' both map to '{gguf_name}'")
        seen[gguf_name] = hf_name
        shape = ckpt.shape(hf_name)
        read = lambda h=hf_name, g=gguf_name: family.transform(g, ckpt.read(h))  # noqa: E731
        if gguf_name == "token_embd.weight":
            rows = family.vocab_rows(n_tokens, shape[0])
            if rows != n_tokens:
                raise ConversionError(f"embed_tokens has {shape[0]} rows but the vocabulary has {n_tokens} tokens")
            shape = (rows, *shape[1:])
            read = lambda h=hf_name, g=gguf_name, r=rows: family.transform(g, ckpt.read(h)[:r])  # noqa: E731
        plan.append(_Planned(gguf_name, out_type if len(shape) >= 2 else "F32", tuple(reversed(shape)), read))
    for gguf_name, data in family.extra_tensors():
        plan.append(_Planned(gguf_name, "F32", tuple(reversed(data.shape)), lambda d=data: d))
    return plan


def _check_complete(family: Family, names: list[str]) -> None:
    """Every layer has its attention and feed-forward weights (a missing shard shows up here, not at load)."""
    present = set(names)
    missing = [n for n in ("token_embd.weight", "output_norm.weight") if n not in present]
    for il in range(int(family.need("num_hidden_layers"))):
        for part in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            if f"blk.{il}.{part}.weight" not in present:
                missing.append(f"blk.{il}.{part}.weight")
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ConversionError(f"the checkpoint lacks {', '.join(missing[:5])}{more}")


def _stored(data: np.ndarray, ggml_type: str) -> np.ndarray:
    """float32 values -> the array whose bytes the file holds for `ggml_type`."""
    if ggml_type == "F32":
        return data.astype(np.float32, copy=False)
    if ggml_type == "F16":
        return data.astype(np.float16)
    return f32_to_bf16_bits(data)


def f32_to_bf16_bits(data: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even; NaN stays a quiet NaN
    (the rounding gguf-py and ggml use)."""
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = ((bits.astype(np.uint64) + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(nan, ((bits >> 16) | 64).astype(np.uint16), rounded)

