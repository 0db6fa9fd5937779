"""Hyperparameters every decoder-only architecture shares, read from `<arch>.*` GGUF keys: the one reader
of them (load's HParams, the quantize plan's model shape and `localllm show`'s summary all read here).

Every value is type- and range-checked here through the metadata's checked accessors
(localllm/gguf/metadata.py): a wrong-typed or out-of-range key is a GGUFError naming it, at load,
before anything is sized or divided by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..errors import GGUFError
from ..gguf.metadata import REQUIRED
from .rope import RopeScaling

# Upper bounds far above any real model (Llama 3.1 405B: 126 layers, 16,384 wide, 53,248 feed-forward,
# 128 heads) that keep a hostile header from sizing loops and buffers: the tensor shapes are checked
# against these values only later, when the weights are bound.
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20  # embedding and feed-forward lengths, head dimension
MAX_HEADS = 4096
MAX_CONTEXT = (1 << 31) - 1  # positions are int32


@dataclass(frozen=True)
class CountKey:
    """An integer `<arch>.<suffix>` key and the range load accepts; `per_layer`: an integer array (some
    files store head counts per layer) counts as its largest entry."""

    suffix: str
    low: int
    high: Optional[int]  # None: no upper bound
    per_layer: bool = True


# The integer hyperparameter keys, by HParams field name, with the range load accepts. Read checked by
# HParams (load) and the quantize plan, leniently by `localllm show` (model/info.py). (archs/gemma3.py
# reads sliding_window with this range, api.trained_context and perplexity context_length with min 1,
# themselves.)
COUNT_KEYS = {
    "n_embd": CountKey("embedding_length", 1, MAX_WIDTH),
    "n_layer": CountKey("block_count", 1, MAX_LAYERS),
    "n_head": CountKey("attention.head_count", 1, MAX_HEADS),
    "n_head_kv": CountKey("attention.head_count_kv", 1, MAX_HEADS),
    "head_dim": CountKey("attention.key_length", 1, MAX_WIDTH),
    "n_ff": CountKey("feed_forward_length", 1, MAX_WIDTH),
    "n_rot": CountKey("rope.dimension_count", 1, MAX_WIDTH),
    "context_length": CountKey("context_length", 1, MAX_CONTEXT, per_layer=False),
    "n_expert": CountKey("expert_count", 0, MAX_HEADS),  # mixture of experts (0: none); the heads' bound
    "sliding_window": CountKey("attention.sliding_window", 0, None, per_layer=False),  # 0: none
}
ROPE_BASE_KEY = "rope.freq_base"


def read_count(reader, name: str, default=REQUIRED) -> int:
    """The integer hyperparameter `name` (a COUNT_KEYS field) as load checks it: a GGUFError naming the key
    when it is missing (without `default`), wrong-typed or out of range."""
    spec = COUNT_KEYS[name]
    return reader.metadata.get_int(reader.arch_key(spec.suffix), default, min=spec.low, max=spec.high,
                                   per_layer=spec.per_layer)


def read_eps(reader) -> float:
    """The norms' epsilon: `attention.layer_norm_rms_epsilon` (RMS norm), or for an architecture with
    LayerNorm instead (BERT) `attention.layer_norm_epsilon`; a file must have one of them."""
    meta, key = reader.metadata, reader.arch_key
    rms = key("attention.layer_norm_rms_epsilon")
    if rms not in meta and key("attention.layer_norm_epsilon") in meta:
        return meta.get_float(key("attention.layer_norm_epsilon"), above=0.0, below=1.0)
    return meta.get_float(rms, above=0.0, below=1.0)


def trunk_layers(reader) -> int:
    """The layers a forward pass runs: `block_count` less the multi-token-prediction layers that follow them
    (`nextn_predict_layers`, llama.cpp's n_layer_nextn: Qwen3.5's files carry one, which llama.cpp runs only
    as a draft model)."""
    total = read_count(reader, "n_layer")
    return total - reader.metadata.get_int(reader.arch_key("nextn_predict_layers"), 0, min=0, max=total - 1)


def peek_count(reader, name: str) -> Optional[int]:
    """The integer hyperparameter `name` as the file states it, for display of a file that may not load:
    None when absent, any integer >= 0, a per-layer array as its largest entry; only a wrong type (or a
    negative value) is the GGUFError that load would raise, naming the key."""
    return reader.metadata.get_int(reader.arch_key(COUNT_KEYS[name].suffix), None, min=0, per_layer=True)


def summary(reader) -> dict[str, Any]:
    """The hyperparameters `localllm show` prints (keys documented in docs/cli.md), read leniently
    (peek_count): null when absent, so that a file that cannot load is still described."""
    n_head = peek_count(reader, "n_head")
    n_embd = peek_count(reader, "n_embd")
    head_dim = peek_count(reader, "head_dim")
    if head_dim is None and n_head:
        head_dim = n_embd // n_head if n_embd else None
    return {
        "context_length": peek_count(reader, "context_length"),
        "n_layers": peek_count(reader, "n_layer"),
        "n_embd": n_embd,
        "n_ff": peek_count(reader, "n_ff"),
        "n_head": n_head,
        "n_head_kv": peek_count(reader, "n_head_kv") or n_head,
        "head_dim": head_dim,
        "sliding_window": peek_count(reader, "sliding_window"),
        "rope_freq_base": reader.metadata.get_float(reader.arch_key(ROPE_BASE_KEY), None),
    }


@dataclass
class HParams:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_rot: int
    eps: float
    rope_base: float
    rope_freq_scale: float
    context_length: int
    rope_scaling: RopeScaling

    @classmethod
    def from_reader(cls, reader, n_vocab: int) -> "HParams":
        meta, key = reader.metadata, reader.arch_key
        n_embd = read_count(reader, "n_embd")
        n_head = read_count(reader, "n_head")
        head_dim = read_count(reader, "head_dim", max(1, n_embd // n_head))
        context_length = read_count(reader, "context_length")
        scaling = RopeScaling.from_reader(reader, context_length)
        params = cls(
            n_vocab=n_vocab,
            n_embd=n_embd,
            n_layer=trunk_layers(reader),
            n_head=n_head,
            n_head_kv=read_count(reader, "n_head_kv", n_head),
            head_dim=head_dim,
            n_ff=read_count(reader, "n_ff"),
            n_rot=read_count(reader, "n_rot", head_dim),
            eps=read_eps(reader),
            rope_base=meta.get_float(key(ROPE_BASE_KEY), 10000.0, above=0.0),
            rope_freq_scale=scaling.freq_scale,
            context_length=context_length,
            rope_scaling=scaling,
        )
        params.validate(reader.path)
        return params

    def validate(self, path) -> None:
        """The relations between values (each value's own range is checked as it is read)."""
        checks = [
            (self.n_head > 0 and self.n_head_kv > 0, "head counts must be positive"),
            (self.n_head % self.n_head_kv == 0, f"head_count {self.n_head} is not a multiple of head_count_kv {self.n_head_kv}"),
            (0 < self.n_rot <= self.head_dim and self.n_rot % 2 == 0, f"rope dimension {self.n_rot} invalid for head dim {self.head_dim}"),
            (self.n_layer > 0 and self.n_embd > 0 and self.n_ff > 0, "sizes must be positive"),
            (self.context_length > 0, "context_length must be positive"),
        ]
        for ok, problem in checks:
            if not ok:
                raise GGUFError(path, "hyperparameters", None, problem)
