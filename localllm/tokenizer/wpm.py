"""WordPiece (`tokenizer.ggml.model = "bert"`: BERT-style embedding models), as llama.cpp's WPM tokenizer.

The text is cut into words: whitespace ends a word; NUL, U+FFFD and control/format characters are dropped;
each punctuation character, ASCII symbol and CJK ideograph is a word of its own. With `lowercase` (the GGUF
key tokenizer.ggml.normalizer.lowercase, default on) characters are lowercased by Unicode's one-to-one mapping;
with `strip_accents` (default: as lowercase) each is first replaced by the first code point of its NFD form
and combining marks are dropped. Each word, prefixed with "▁" (the converter writes BERT's word-initial pieces
with "▁" and its "##" continuation pieces bare), is cut greedily into the longest vocabulary tokens from the
left; a word with a position no token matches becomes the unknown token as a whole.
"""

from __future__ import annotations

import unicodedata

from .spm import SPACE

# llama.cpp's whitespace set (Unicode White_Space), not str.isspace, which adds U+001C..U+001F.
_WHITESPACE = frozenset(map(chr, [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028,
                                  0x2029, 0x202F, 0x205F, 0x3000]))
# BERT's "Chinese character" blocks, as llama.cpp has them (0x2B920 where HF's code says so, not 0x2B820).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# What a character does to the word being built.
_BREAK, _DROP, _ALONE, _APPEND = range(4)


class WPMModel:
    def __init__(self, token_to_id: dict, unk_id, lowercase: bool = True, strip_accents: bool | None = None):
        self.token_to_id = token_to_id
        self.unk_id = unk_id
        self.lowercase = lowercase
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self.max_len = max(map(len, token_to_id))  # in characters: no longer substring can be a token
        self._chars: dict[str, tuple[int, str]] = {}  # character -> (what it does, its normalized text)
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for word in self._words(text):
            ids = self._cache.get(word)
            if ids is None:
                ids = self._encode_word(SPACE + word)
                if len(self._cache) < 100_000:
                    self._cache[word] = ids
            out.extend(ids)
        return out

    def _words(self, text: str) -> list[str]:
        words, word = [], []
        chars = self._chars
        for c in text:
            kind, norm = chars.get(c) or chars.setdefault(c, self._classify(c))
            if kind == _APPEND:
                word.append(norm)
            elif kind != _DROP:
                if word:
                    words.append("".join(word))
                    word = []
                if kind == _ALONE:
                    words.append(norm)
        if word:
            words.append("".join(word))
        return words

    def _classify(self, c: str) -> tuple[int, str]:
        if self.strip_accents:
            c = unicodedata.normalize("NFD", c)[0]
        if c in _WHITESPACE:
            return _BREAK, ""
        category = unicodedata.category(c)
        # Cn (unassigned) is not a control character in llama.cpp's tables: kept.
        if c in "\0\ufffd" or category in ("Cc", "Cf", "Co", "Cs") or self.strip_accents and category[0] == "M":
            return _DROP, ""
        norm = c.lower()[0] if self.lowercase else c  # [0]: the one-to-one mapping (U+0130 -> "i", not "i̇")
        cp = ord(c)
        if category[0] == "P" or cp < 0x7F and category[0] == "S" or any(lo <= cp <= hi for lo, hi in _CJK_RANGES):
            return _ALONE, norm
        return _APPEND, norm

    def _encode_word(self, word: str) -> list[int]:
        out: list[int] = []
        i, n = 0, len(word)
        while i < n:
            for j in range(min(n, i + self.max_len), i, -1):
                token = self.token_to_id.get(word[i:j])
                if token is not None:
                    out.append(token)
                    i = j
                    break
            else:  # some position starts no token: the whole word is unknown
                if self.unk_id is None:
                    from .vocab import TokenizerError  # here, not at the top: vocab imports this module

                    raise TokenizerError(f"no token matches in the word {word[1:]!r} and the vocabulary has no unknown token")
                return [self.unk_id]
        return out
