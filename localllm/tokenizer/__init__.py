"""Tokenizers built from GGUF metadata: SentencePiece-style, BPE (byte-level and Gemma 4's) and WordPiece, plus a
streaming decoder."""

from .stream import StreamDecoder
from .vocab import Tokenizer, TokenizerError

__all__ = ["StreamDecoder", "Tokenizer", "TokenizerError"]
