"""Embeddings: a text's final hidden states pooled into one vector, as llama.cpp computes them.

The model runs the text from position 0 (an encoder's attention sees the whole text, a decoder's is causal)
and gives every token's final hidden state (Decoder.hidden_states: after the output norm, before the output
projection). The pooling is the file's `<arch>.pooling_type` (llama.cpp's enum): 1 mean over the tokens,
2 CLS (the first token), 3 last (the last token: Qwen3-Embedding and other decoders trained as
embedders). A file without one (a plain decoder, pooling 0 "none", for which llama.cpp returns a vector per
token) is pooled by its last token, as Ollama does for such a model (its runner takes the last token's
state when llama.cpp pools nothing): the only position that has seen the whole text in a causal model.
4 "rank" (rerankers' classification heads) is refused. The vectors are L2-normalised by default (llama.cpp's
embd_normalize 2, Ollama's and OpenAI's vectors): the sum of squares in float64, each value divided by the
root, a zero vector left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from .errors import ContextOverflow, LocalLLMError

POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
POOLINGS = ("mean", "cls", "last")  # what embed computes
MIN_CACHE = 64  # positions of the first cache embed allocates (grown to the longest input)


class EmbeddingError(LocalLLMError):
    """An input or a model that embed cannot handle (bad token ids, an unsupported pooling)."""


@dataclass
class Embeddings:
    vectors: np.ndarray  # float32 [inputs, n_embd]
    token_counts: list[int]  # tokens each input ran as (after truncation)
    pooling: str

    @property
    def total_tokens(self) -> int:
        return sum(self.token_counts)


def file_pooling(reader) -> str:
    """The pooling the file states (`<arch>.pooling_type`), "none" without one."""
    value = reader.metadata.get_int(reader.arch_key("pooling_type"), 0, min=0)
    if value not in POOLING_TYPES:
        reader.metadata.fail(reader.arch_key("pooling_type"), f"is {value}, not a pooling type llama.cpp knows (0-4)")
    return POOLING_TYPES[value]


def resolve_pooling(reader, asked: Optional[str] = None) -> str:
    """The pooling embed uses: `asked` (mean, cls, last) or the file's; "none" pools the last token."""
    pooling = asked or file_pooling(reader)
    if pooling == "none":
        pooling = "last"
    if pooling not in POOLINGS:
        raise EmbeddingError(f"pooling {pooling!r} is not supported (supported: {', '.join(POOLINGS)})"
                             + ("; this file is a reranker" if pooling == "rank" else ""))
    return pooling


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """float32 [n_embd] from the hidden states [T, n_embd] of one input."""
    if pooling == "mean":
        return hidden.astype(np.float64).mean(axis=0).astype(np.float32)
    return hidden[0 if pooling == "cls" else -1].copy()


def normalize(vector: np.ndarray) -> np.ndarray:
    """vector / its L2 norm (the sum of squares in float64); a zero vector unchanged."""
    norm = np.sqrt(np.sum(vector.astype(np.float64) ** 2))
    return (vector / norm).astype(np.float32) if norm > 0 else vector.astype(np.float32)


Input = Union[str, Sequence[int]]


def input_tokens(model, inputs: Union[Input, Sequence[Input]], truncate: bool) -> list[list[int]]:
    """Each input's token ids: a text tokenized as a prompt is (BOS, and for BERT [CLS] ... [SEP], as the
    vocabulary says), token ids checked against the vocabulary. Empty inputs are refused; an input longer
    than the context is cut to it with `truncate`, else ContextOverflow."""
    if isinstance(inputs, str) or (len(inputs) and isinstance(inputs[0], (int, np.integer))):
        inputs = [inputs]
    if not len(inputs):
        raise EmbeddingError("no input to embed")
    n_vocab = model.decoder.hp.n_vocab
    out = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            ids = model.tokenize(item)
        else:
            ids = [int(t) for t in item]
            bad = [t for t in ids if not 0 <= t < n_vocab]
            if bad:
                raise EmbeddingError(f"input {i}: token id {bad[0]} is outside the {n_vocab}-token vocabulary")
        if not ids:
            raise EmbeddingError(f"input {i} is empty: it has no tokens to embed")
        if len(ids) > model.n_ctx:
            if not truncate:
                raise ContextOverflow(len(ids), model.n_ctx, f"input {i}")
            ids = ids[: model.n_ctx]
        out.append(ids)
    return out


def check_dimensions(model, dimensions: Optional[int]) -> Optional[int]:
    """`dimensions` if the model's vectors can be cut to it (1..n_embd), else an EmbeddingError."""
    n_embd = model.decoder.hp.n_embd
    if dimensions is not None and not 1 <= dimensions <= n_embd:
        raise EmbeddingError(f"dimensions must be between 1 and the model's {n_embd}, not {dimensions}")
    return dimensions


def embed_tokens(model, ids: list[int], pooling: str, normalize_vector: bool = True,
                 dimensions: Optional[int] = None) -> np.ndarray:
    """float32 [n_embd] (or [dimensions]) of one input's token ids: its hidden states on the model's
    embedding cache, pooled, cut to the first `dimensions` values (Matryoshka-trained models keep their
    meaning in the leading ones), then normalised."""
    hidden = model.decoder.hidden_states(np.asarray(ids, dtype=np.int32), model.embedding_cache(len(ids)))
    vector = pool(hidden, pooling)[:dimensions]
    return normalize(vector) if normalize_vector else vector


def embed(model, inputs, *, normalize_vectors: bool = True, pooling: Optional[str] = None,
          truncate: bool = False, dimensions: Optional[int] = None) -> Embeddings:
    """Model.embeddings: see there."""
    pooling = resolve_pooling(model.reader, pooling)
    dimensions = check_dimensions(model, dimensions)
    token_lists = input_tokens(model, inputs, truncate)
    vectors = np.stack([embed_tokens(model, ids, pooling, normalize_vectors, dimensions) for ids in token_lists])
    return Embeddings(vectors, [len(ids) for ids in token_lists], pooling)
