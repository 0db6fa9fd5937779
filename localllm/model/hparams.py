"""Hyperparameters every decoder-only architecture shares, read from `<arch>.*` GGUF keys."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GGUFError


def _scalar(value):
    # Some files store per-layer arrays for head counts; all our architectures use one value.
    if hasattr(value, "__len__") and not isinstance(value, str):
        return int(max(value))
    return value


def require(reader, suffix: str):
    value = reader.arch_get(suffix)
    if value is None:
        raise GGUFError(reader.path, f"metadata key '{reader.architecture}.{suffix}'", None, "missing")
    return _scalar(value)


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
        n_embd = int(require(reader, "embedding_length"))
        n_head = int(require(reader, "attention.head_count"))
        n_head_kv = int(_scalar(reader.arch_get("attention.head_count_kv", n_head)))
        head_dim = int(_scalar(reader.arch_get("attention.key_length", n_embd // n_head)))
        rope_factor = reader.arch_get("rope.scaling.factor")
        scaling_type = reader.arch_get("rope.scaling.type", "linear" if rope_factor else "none")
        freq_scale = 1.0 / float(rope_factor) if rope_factor and scaling_type == "linear" else 1.0
        eps = reader.arch_get("attention.layer_norm_rms_epsilon")
        if eps is None:
            raise GGUFError(reader.path, f"metadata key '{reader.architecture}.attention.layer_norm_rms_epsilon'", None, "missing")
        params = cls(
            n_vocab=n_vocab,
            n_embd=n_embd,
            n_layer=int(require(reader, "block_count")),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=int(require(reader, "feed_forward_length")),
            n_rot=int(_scalar(reader.arch_get("rope.dimension_count", head_dim))),
            eps=float(eps),
            rope_base=float(reader.arch_get("rope.freq_base", 10000.0)),
            rope_freq_scale=freq_scale,
            context_length=int(require(reader, "context_length")),
        )
        params.validate(reader.path)
        return params

    def validate(self, path) -> None:
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
