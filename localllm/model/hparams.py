"""Hyperparameters every decoder-only architecture shares, read from `<arch>.*` GGUF keys.

Every value is type- and range-checked here through the metadata's checked accessors
(localllm/gguf/metadata.py): a wrong-typed or out-of-range key is a GGUFError naming it, at load,
before anything is sized or divided by it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GGUFError

# Upper bounds far above any real model (Llama 3.1 405B: 126 layers, 16,384 wide, 53,248 feed-forward,
# 128 heads) that keep a hostile header from sizing loops and buffers: the tensor shapes are checked
# against these values only later, when the weights are bound.
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20  # embedding and feed-forward lengths, head dimension
MAX_HEADS = 4096
MAX_CONTEXT = (1 << 31) - 1  # positions are int32
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # llama.cpp's names


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

    @classmethod
    def from_reader(cls, reader, n_vocab: int) -> "HParams":
        meta, key = reader.metadata, reader.arch_key

        def count(suffix: str, high: int, default=...):
            # Some files store head counts (and other sizes) per layer; every architecture here uses one value.
            if default is ...:
                return meta.get_int(key(suffix), min=1, max=high, per_layer=True)
            return meta.get_int(key(suffix), default, min=1, max=high, per_layer=True)

        n_embd = count("embedding_length", MAX_WIDTH)
        n_head = count("attention.head_count", MAX_HEADS)
        head_dim = count("attention.key_length", MAX_WIDTH, default=max(1, n_embd // n_head))
        params = cls(
            n_vocab=n_vocab,
            n_embd=n_embd,
            n_layer=count("block_count", MAX_LAYERS),
            n_head=n_head,
            n_head_kv=count("attention.head_count_kv", MAX_HEADS, default=n_head),
            head_dim=head_dim,
            n_ff=count("feed_forward_length", MAX_WIDTH),
            n_rot=count("rope.dimension_count", MAX_WIDTH, default=head_dim),
            eps=meta.get_float(key("attention.layer_norm_rms_epsilon"), above=0.0, below=1.0),
            rope_base=meta.get_float(key("rope.freq_base"), 10000.0, above=0.0),
            rope_freq_scale=_rope_freq_scale(meta, key),
            context_length=meta.get_int(key("context_length"), min=1, max=MAX_CONTEXT),
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


def _rope_freq_scale(meta, key) -> float:
    """RoPE frequency scale: 1/factor for linear scaling, else 1 (YaRN and LongRoPE are not applied)."""
    factor = meta.get_float(key("rope.scaling.factor"), None, above=0.0)
    scaling = meta.get_str(key("rope.scaling.type"), "linear" if factor else "none", choices=ROPE_SCALING_TYPES)
    return 1.0 / factor if factor and scaling == "linear" else 1.0
