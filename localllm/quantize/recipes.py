"""Which ggml type each tensor gets, for each file type: llama.cpp's recipes (`src/llama-quant.cpp`,
`llama_tensor_get_type`) for the same names, as data plus a few small functions.

The rules, in the order llama.cpp applies them to one tensor:
1. Tensors that are never quantized keep their input type: fewer than 2 dimensions (norms, biases),
   names not ending in "weight", `*_norm.weight`, MoE routers (`ffn_gate_inp`) and a few small
   architecture-specific tensors (NEVER_QUANTIZED).
2. `--token-embedding-type` / `--output-tensor-type` apply as given.
3. File types whose default is not a quantized type (F32, F16, BF16): every other tensor gets it.
4. Otherwise (unless `--pure`) the mix: output.weight, and token_embd.weight when the model has no
   output.weight (tied embeddings), get Q6_K (Q8_0 when the file type is Q8_0, when the row length is
   not a multiple of the default type's block, or for Falcon); attn_v and ffn_down get more bits in some
   layers (`use_more_bits`: the first and last eighth and every third layer between); see `_mix`.
   MXFP4_MOE: the experts (3-D tensors) MXFP4, the output and every other matrix Q8_0.
5. Rows that do not split into the chosen type's blocks fall back (FALLBACK: Q4_K -> Q5_0 ...), and to
   F16 when even the fallback does not fit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from ..errors import LocalLLMError
from ..gguf.constants import GGML_TYPES_BY_NAME


class QuantizeError(LocalLLMError):
    """A quantization that cannot be done as asked (type, tensor shape, requantization, output path)."""


@dataclass(frozen=True)
class FileType:
    name: str  # llama-quantize's name for it
    ftype: int  # llama.cpp's LLAMA_FTYPE number, stored as general.file_type
    default: str  # the ggml type of every tensor the mix does not single out


FILE_TYPES: dict[str, FileType] = {
    ft.name: ft
    for ft in (
        FileType("F32", 0, "F32"),
        FileType("F16", 1, "F16"),
        FileType("BF16", 32, "BF16"),
        FileType("Q8_0", 7, "Q8_0"),
        FileType("Q4_0", 2, "Q4_0"),
        FileType("Q4_1", 3, "Q4_1"),
        FileType("Q5_0", 8, "Q5_0"),
        FileType("Q5_1", 9, "Q5_1"),
        FileType("Q2_K", 10, "Q2_K"),
        FileType("Q3_K_S", 11, "Q3_K"),
        FileType("Q3_K_M", 12, "Q3_K"),
        FileType("Q3_K_L", 13, "Q3_K"),
        FileType("Q4_K_S", 14, "Q4_K"),
        FileType("Q4_K_M", 15, "Q4_K"),
        FileType("Q5_K_S", 16, "Q5_K"),
        FileType("Q5_K_M", 17, "Q5_K"),
        FileType("Q6_K", 18, "Q6_K"),
        FileType("IQ4_NL", 25, "IQ4_NL"),
        FileType("IQ4_XS", 30, "IQ4_XS"),
        FileType("MXFP4_MOE", 38, "MXFP4"),  # experts MXFP4, every other matrix Q8_0 (gpt-oss's own mix)
    )
}
UNQUANTIZED = ("F32", "F16", "BF16")

# Substrings of tensor names llama.cpp never quantizes (beyond 1-D tensors and *_norm.weight).
NEVER_QUANTIZED = (
    "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj", "position_embd.weight",
    "token_types.weight", "ssm_conv1d", "shortconv.conv.weight", "attn_rel_b.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
)

# Type for rows that do not split into the chosen type's blocks (llama.cpp's tensor_type_fallback).
FALLBACK = {"IQ4_XS": "IQ4_NL", "Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


@dataclass(frozen=True)
class ModelShape:
    """The hyperparameters the recipes look at."""

    arch: str
    n_layer: int
    n_head: int = 1
    n_head_kv: int = 1
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        # llama.cpp's LLM_TYPE_70B, the only model size its recipes test: 80-layer llama with GQA
        return self.arch == "llama" and self.n_layer == 80 and self.n_head != self.n_head_kv


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    ggml_type: str  # type in the input file


def category(name: str) -> str:
    """llama.cpp's tensor_get_category: output, token_embd, attn_v (also fused qkv / kv_b), attn_k,
    attn_q, attn_output, ffn_up, ffn_gate, ffn_down or other."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in (
        ("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"), ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down"),
    ):
        if part in name:
            return cat
    return "other"


def n_dims(shape: Sequence[int]) -> int:
    """ggml_n_dims: dimensions up to the last one larger than 1."""
    dims = len(shape)
    while dims > 1 and shape[dims - 1] == 1:
        dims -= 1
    return dims


def allows_quantization(spec: TensorSpec) -> bool:
    name = spec.name
    return (
        n_dims(spec.shape) >= 2
        and name.endswith("weight")
        and "_norm.weight" not in name
        and not any(part in name for part in NEVER_QUANTIZED)
    )


def use_more_bits(i_layer: int, n_layer: int) -> bool:
    """The layers llama.cpp gives extra bits: first and last eighth, and every third one in between."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def block_size(ggml_type: str) -> int:
    return GGML_TYPES_BY_NAME[ggml_type].block_size


def fits(row_length: int, ggml_type: str) -> bool:
    return row_length % block_size(ggml_type) == 0


class _Counters:
    """llama.cpp's per-run counters: attn_v tensors seen so far (i_attention_wv) and of all (n_attention_wv),
    ffn_down tensors seen so far (i_ffn_down)."""

    def __init__(self, tensors: Sequence[TensorSpec]):
        self.n_attn_v = sum(category(t.name) == "attn_v" for t in tensors)
        self.i_attn_v = 0
        self.i_ffn_down = 0


def _layer_of(name: str, counter: int, model: ModelShape) -> int:
    """The layer an ffn tensor belongs to: the running counter, or (MoE, where expert tensors are not in
    layer order) the number in its name."""
    if model.n_expert <= 1:
        return counter
    match = re.match(r"blk\.(\d+)\.", name)
    if not match or int(match.group(1)) >= model.n_layer:
        raise QuantizeError(f"cannot tell the layer of tensor {name}")
    return int(match.group(1))


def _output_type(ft: FileType, spec: TensorSpec, model: ModelShape, output_type: Optional[str]) -> str:
    if output_type:
        return output_type
    if ft.name == "MXFP4_MOE" or model.arch == "falcon" or not fits(spec.shape[0], ft.default):
        return "Q8_0"
    return ft.default if ft.default == "Q8_0" else "Q6_K"


def _attn_v_type(ft: FileType, new: str, model: ModelShape, c: _Counters) -> str:
    name, i = ft.name, c.i_attn_v
    if name == "Q2_K":
        new = "Q4_K" if model.n_gqa >= 4 else "Q3_K"
    elif name == "Q3_K_M":
        new = "Q5_K" if i < 2 else "Q4_K"
    elif name == "Q3_K_L":
        new = "Q5_K"
    elif name in ("IQ4_NL", "IQ4_XS") and model.n_gqa >= 4:
        new = "Q5_K"
    elif name in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, c.n_attn_v):
        new = "Q6_K"
    elif name == "Q4_K_S" and i < 4:
        new = "Q5_K"
    if model.is_70b and new in ("Q3_K", "Q4_K"):
        new = "Q5_K"  # 8 heads share attn_v there: more bits for little size
    if model.n_expert == 8:
        new = "Q8_0"
    c.i_attn_v += 1
    return new


def _ffn_down_type(ft: FileType, new: str, spec: TensorSpec, model: ModelShape, c: _Counters) -> str:
    name, n = ft.name, model.n_layer
    i = _layer_of(spec.name, c.i_ffn_down, model)
    falcon = model.arch == "falcon"
    if name == "Q2_K":
        new = "Q3_K"
    elif name == "Q3_K_M":
        new = "Q5_K" if i < n // 16 else "Q4_K" if not falcon or use_more_bits(i, n) else "Q3_K"
    elif name == "Q3_K_L":
        new = "Q4_K" if falcon else "Q5_K"
    elif name == "Q4_K_M":
        if falcon:
            new = "Q6_K" if i < n // 16 else "Q5_K" if use_more_bits(i, n) else "Q4_K"
        elif use_more_bits(i, n):
            new = "Q6_K"
    elif i < n // 8 and name in ("IQ4_NL", "IQ4_XS"):  # llama.cpp: only without an importance matrix
        new = "Q5_K"
    elif name == "Q5_K_M" and use_more_bits(i, n):
        new = "Q6_K"
    elif name == "Q4_K_S" and not falcon and i < n // 8:
        new = "Q5_K"
    c.i_ffn_down += 1
    return new


def _attn_output_type(ft: FileType, new: str, model: ModelShape) -> str:
    name = ft.name
    if model.arch == "falcon":
        return "Q4_K" if name == "Q3_K_L" else new
    if model.n_expert == 8:
        moe_q5 = ("Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ4_XS")
        return "Q5_K" if name in moe_q5 else new
    return {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K"}.get(name, new)


def _mix(ft: FileType, spec: TensorSpec, model: ModelShape, c: _Counters, tied: bool, output_type: Optional[str]) -> str:
    """llama_tensor_get_type_impl for the file types localllm writes."""
    cat = category(spec.name)
    new = ft.default
    if cat == "output" or (tied and cat == "token_embd"):
        return _output_type(ft, spec, model, output_type)
    if ft.name == "MXFP4_MOE":  # the expert tensors (3-D) MXFP4, every other matrix Q8_0
        return "MXFP4" if len(spec.shape) > 2 and spec.shape[2] > 1 else "Q8_0"
    if cat == "attn_v":
        return _attn_v_type(ft, new, model, c)
    if cat == "attn_k" and model.n_expert == 8:
        return "Q8_0"
    if cat == "ffn_down":
        return _ffn_down_type(ft, new, spec, model, c)
    if cat == "attn_output":
        return _attn_output_type(ft, new, model)
    return new


def _fallback(spec: TensorSpec, chosen: str) -> str:
    if fits(spec.shape[0], chosen):
        return chosen
    if chosen not in FALLBACK:
        raise QuantizeError(
            f"tensor {spec.name}: rows of {spec.shape[0]} values do not split into {chosen} blocks of"
            f" {block_size(chosen)}, and llama.cpp defines no fallback for {chosen}"
        )
    fallback = FALLBACK[chosen]
    return fallback if fits(spec.shape[0], fallback) else "F16"


def choose_types(
    tensors: Sequence[TensorSpec],
    file_type: str,
    model: ModelShape,
    *,
    output_type: Optional[str] = None,
    token_embedding_type: Optional[str] = None,
    pure: bool = False,
) -> list[str]:
    """The ggml type of each tensor in the output file, in order (llama.cpp's llama_tensor_get_type)."""
    ft = FILE_TYPES[file_type]
    counters = _Counters(tensors)
    tied = not any(category(t.name) == "output" for t in tensors)
    chosen = []
    for spec in tensors:
        cat = category(spec.name)
        if not allows_quantization(spec):
            new = spec.ggml_type
        elif token_embedding_type and cat == "token_embd":
            new = token_embedding_type
        elif output_type and cat == "output":
            new = output_type
        elif ft.default in UNQUANTIZED:
            new = ft.default
        else:
            new = ft.default if pure else _mix(ft, spec, model, counters, tied, output_type)
            new = _fallback(spec, new)
        chosen.append(new)
    return chosen
