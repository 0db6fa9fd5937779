"""Tokenizers built from GGUF metadata: SentencePiece-style and byte-level BPE, plus a streaming decoder."""

from .stream import StreamDecoder
from .vocab import Tokenizer, TokenizerError

__all__ = ["StreamDecoder", "Tokenizer", "TokenizerError"]
