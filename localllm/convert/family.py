"""What every Hugging Face decoder family shares on its way to GGUF: tensor names, the common
hyperparameter keys, RoPE scaling, and the registry `config["architectures"][0]` -> family.

Facts follow llama.cpp's converter (convert_hf_to_gguf.py, `TextModel.set_gguf_parameters` and the
per-model classes): the keys it writes, with the same value types, and the same tensor names. A family
module (llama.py, qwen.py, gemma3.py) adds its own keys and tensor transforms.
"""

from __future__ import annotations

import re
from typing import Any, Iterator, Optional

import numpy as np

from ..gguf.constants import ValueType
from .errors import ConversionError

U32, F32, STR = ValueType.UINT32, ValueType.FLOAT32, ValueType.STRING

# Prefixes HF wraps the text model in (multimodal checkpoints: old and new transformers layouts).
_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")
# Tensors with no GGUF counterpart: RoPE tables are recomputed by the engine; vision parts are not ours.
_SKIP = re.compile(r"(rotary_emb\.inv_freq$|^(model\.)?(vision_tower|multi_modal_projector|vision_model)\.)")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")

# HF names inside a decoder layer -> GGUF names inside blk.N (the llama/qwen layout).
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_NAMES = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}


class Family:
    """One HF model family. Subclasses set ARCH, HF_ARCHITECTURES, ACTIVATIONS and override the hooks."""

    ARCH = ""
    HF_ARCHITECTURES: tuple[str, ...] = ()
    ACTIVATIONS: tuple[str, ...] = ("silu",)
    LAYER_NAMES = LAYER_NAMES
    # Whether a tokenizer.model (SentencePiece) is preferred over a byte-level tokenizer.json.
    PREFERS_SPM = True
    TIED_DEFAULT = False  # transformers' default for tie_word_embeddings in this family's config

    def __init__(self, config: dict):
        # Multimodal configs keep the text model's settings under text_config (llama.cpp lifts them too).
        self.config = {**config, **config.get("text_config", {})}
        self.check()

    # -- config access -----------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        value = self.config.get(key)
        return default if value is None else value

    def need(self, key: str) -> Any:
        value = self.config.get(key)
        if value is None:
            raise ConversionError(f"config.json: '{key}' is missing (a {self.ARCH} model needs it)")
        return value

    @property
    def n_head(self) -> int:
        return int(self.need("num_attention_heads"))

    @property
    def n_head_kv(self) -> int:
        return int(self.get("num_key_value_heads", self.n_head))

    @property
    def head_dim(self) -> int:
        return int(self.get("head_dim", int(self.need("hidden_size")) // self.n_head))

    def rope_params(self) -> dict:
        """RoPE settings: `rope_scaling` (transformers 4.x) or `rope_parameters` (5.x, per layer type)."""
        params = self.config.get("rope_parameters") or self.config.get("rope_scaling") or {}
        return params.get("full_attention", params) if isinstance(params, dict) else {}

    def rope_theta(self, default: float = 10000.0) -> float:
        return float(self.config.get("rope_theta") or self.rope_params().get("rope_theta") or default)

    # -- checks -----------------------------------------------------------------------------------
    def check(self) -> None:
        """Refuse settings the engine would silently run differently from the original model."""
        act = self.config.get("hidden_act") or self.config.get("hidden_activation")
        if act is not None and act not in self.ACTIVATIONS:
            raise ConversionError(f"config.json: hidden_act {act!r} is not supported for {self.ARCH} (expected {', '.join(self.ACTIVATIONS)})")
        kind = self.rope_type()
        if kind not in self.ROPE_TYPES:
            raise ConversionError(f"config.json: RoPE scaling type {kind!r} is not supported for {self.ARCH} (supported: {', '.join(self.ROPE_TYPES)})")
        for flag in ("attention_bias", "mlp_bias"):
            if self.config.get(flag) and not self.allows_bias(flag):
                raise ConversionError(f"config.json: {flag} = true is not supported for {self.ARCH}")

    ROPE_TYPES: tuple[str, ...] = ("default", "linear")

    def rope_type(self) -> str:
        params = self.rope_params()
        return str(params.get("rope_type", params.get("type", "default")) or "default").lower()

    def allows_bias(self, flag: str) -> bool:
        return False

    # -- metadata -----------------------------------------------------------------------------------
    def metadata(self) -> list[tuple[str, Any, ValueType]]:
        """`{arch}.*` keys as llama.cpp's TextModel.set_gguf_parameters writes them."""
        a = self.ARCH
        out = [
            (f"{a}.block_count", int(self.need("num_hidden_layers")), U32),
            (f"{a}.context_length", int(self.need("max_position_embeddings")), U32),
            (f"{a}.embedding_length", int(self.need("hidden_size")), U32),
            (f"{a}.feed_forward_length", int(self.need("intermediate_size")), U32),
            (f"{a}.attention.head_count", self.n_head, U32),
            (f"{a}.attention.head_count_kv", self.n_head_kv, U32),
            (f"{a}.rope.freq_base", self.rope_theta(), F32),
            (f"{a}.attention.layer_norm_rms_epsilon", float(self.need("rms_norm_eps")), F32),
        ]
        if self.config.get("head_dim") is not None:
            out += [(f"{a}.attention.key_length", self.head_dim, U32), (f"{a}.attention.value_length", self.head_dim, U32)]
        if self.rope_type() == "linear":
            out += [(f"{a}.rope.scaling.type", "linear", STR), (f"{a}.rope.scaling.factor", float(self.rope_params()["factor"]), F32)]
        return out

    # -- tensors ------------------------------------------------------------------------------------
    def tensor_name(self, hf_name: str) -> Optional[str]:
        """GGUF name of an HF tensor; None for tensors llama.cpp drops too. Unknown names are an error."""
        if _SKIP.search(hf_name):
            return None
        if hf_name in ("lm_head.weight", "language_model.lm_head.weight"):
            # A tied checkpoint may still carry lm_head (a copy of embed_tokens): the engine ties instead.
            return None if self.get("tie_word_embeddings", self.TIED_DEFAULT) else "output.weight"
        name = hf_name
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        if name in GLOBAL_NAMES:
            return GLOBAL_NAMES[name]
        match = _LAYER.match(name)
        if match and match.group(2) in self.LAYER_NAMES:
            return f"blk.{match.group(1)}.{self.LAYER_NAMES[match.group(2)]}"
        raise ConversionError(f"tensor '{hf_name}' has no GGUF counterpart for {self.ARCH} (unsupported model variant?)")

    def transform(self, gguf_name: str, data: np.ndarray) -> np.ndarray:
        """Change a tensor's values from HF to GGUF conventions (float32 in, float32 out)."""
        return data

    def extra_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """Tensors the GGUF file has that the checkpoint does not (llama3 RoPE factors)."""
        return iter(())

    def vocab_size(self, n_tokenizer: int, config_vocab_size) -> int:
        """Length of the GGUF token list: config.json's vocab_size (the embedding rows; ids the tokenizer
        lacks become [PAD<i>] tokens, as in llama.cpp), else the tokenizer's own size."""
        return int(config_vocab_size) if config_vocab_size else n_tokenizer

    def vocab_rows(self, n_tokens: int, n_rows: int) -> int:
        """Rows of token_embd to keep for a vocabulary of n_tokens (default: all rows)."""
        return n_rows


def permute_for_normal_rope(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder the rows of each head of a Q or K projection [n_head * head_dim, ...] so that RoPE on
    adjacent pairs (x[2i], x[2i+1]) computes what HF's rotate_half computes on (x[i], x[i + head_dim/2]).

    Within a head, row r of the first half and row r of the second half become rows 2r and 2r+1
    (llama.cpp's converter `permute`). Biases ([n_head * head_dim]) are permuted the same way."""
    rows = weight.shape[0]
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen",
    "Qwen3ForCausalLM": "qwen",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
}


def family_for(config: dict) -> Family:
    import importlib

    archs = config.get("architectures") or []
    hf_arch = archs[0] if archs else None
    if hf_arch not in _FAMILIES:
        raise ConversionError(
            f"config.json: architecture {hf_arch!r} is not supported (supported: {', '.join(sorted(_FAMILIES))})"
        )
    module = importlib.import_module(f"{__package__}.{_FAMILIES[hf_arch]}")
    for cls in module.FAMILIES:
        if hf_arch in cls.HF_ARCHITECTURES:
            return cls(config)
    raise AssertionError(hf_arch)  # the table and the modules disagree
