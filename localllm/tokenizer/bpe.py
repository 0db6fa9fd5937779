"""Byte-level BPE (`tokenizer.ggml.model = "gpt2"`: Llama 3, Qwen2/3, GPT-2 style vocabularies).

The text is cut into words by the pre-tokenizer regexes named by `tokenizer.ggml.pre` (llama.cpp's
table, llama-vocab.cpp: several names share one set; a set with several expressions applies them in
turn, each splitting the pieces the previous left, keeping the text between matches as pieces too).
Each word's bytes are mapped to GPT-2's printable characters, then adjacent symbols are merged by merge
rank (lowest first, leftmost on ties) until no ranked pair is left.
"""

from __future__ import annotations

import heapq

import regex

# llama.cpp rewrites the case-insensitive contraction group (?i:'s|'t|...) in explicit classes.
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ"
    "\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_CJK = "[一-龥ࠀ-一가-퟿]+"

# pre-tokenizer set -> expressions applied in turn
PRE_TOKENIZERS: dict[str, list[str]] = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
    "llama3": [_LLAMA3],
    "qwen2": [_QWEN2],
    "gpt2": [_GPT2],
    "deepseek-llm": ["[\r\n]", r"\s?[" + _DEEPSEEK_LLM_LETTERS + "]+", r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", _CJK, r"\p{N}+"],
    "deepseek-coder": ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"],
    "starcoder": [r"\p{N}", _GPT2],
}
# `tokenizer.ggml.pre` value -> pre-tokenizer set (llama.cpp's name mapping, for the names we support)
PRE_NAMES: dict[str, str] = {
    "default": "default",
    "llama3": "llama3", "llama-v3": "llama3", "llama-bpe": "llama3", "falcon3": "llama3", "pixtral": "llama3",
    "dbrx": "llama3", "smaug-bpe": "llama3",
    "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2", "stablelm2": "qwen2",
    "gpt-2": "gpt2", "phi-2": "gpt2", "mpt": "gpt2", "olmo": "gpt2", "jais": "gpt2", "jina-es": "gpt2", "jina-de": "gpt2",
    "deepseek-llm": "deepseek-llm",
    "deepseek-coder": "deepseek-coder",
    "falcon": "falcon",
    "starcoder": "starcoder", "refact": "starcoder", "command-r": "starcoder", "smollm": "starcoder",
    "codeshell": "starcoder", "exaone": "starcoder",
}
# Sets whose words skip merging when the whole word is a token (llama.cpp's ignore_merges).
IGNORE_MERGES = {"llama3"}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (printable Latin-1 bytes map to
    themselves, the rest to code points from 256 up, in byte order)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def split_words(text: str, expressions: list) -> list[str]:
    """Apply each compiled expression in turn; matches and the gaps between them both become pieces."""
    pieces = [text]
    for pattern in expressions:
        out = []
        for piece in pieces:
            pos = 0
            for m in pattern.finditer(piece):
                if m.start() > pos:
                    out.append(piece[pos : m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                pos = m.end()
            if pos < len(piece):
                out.append(piece[pos:])
        pieces = out
    return pieces


class BPEModel:
    def __init__(self, token_to_id: dict, merges: list[str], pre_set: str):
        self.token_to_id = token_to_id
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            left, sep, right = merge.partition(" ")
            if sep:
                self.ranks.setdefault((left, right), rank)
        self.expressions = [regex.compile(e) for e in PRE_TOKENIZERS[pre_set]]
        self.ignore_merges = pre_set in IGNORE_MERGES
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for word in split_words(text, self.expressions):
            ids = self._cache.get(word)
            if ids is None:
                ids = self._encode_word("".join(BYTE_TO_CHAR[b] for b in word.encode("utf-8")))
                if len(self._cache) < 100_000:
                    self._cache[word] = ids
            out.extend(ids)
        return out

    def _encode_word(self, word: str) -> list[int]:
        if self.ignore_merges and word in self.token_to_id:
            return [self.token_to_id[word]]
        symbols = list(word)
        n = len(symbols)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap: list = []
        ranks = self.ranks

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            rank = ranks.get((symbols[left], symbols[right]))
            if rank is not None:
                heapq.heappush(heap, (rank, left, right, symbols[left] + symbols[right]))

        for i in range(1, n):
            push(i - 1, i)
        while heap:
            _, left, right, joined = heapq.heappop(heap)
            if not symbols[left] or not symbols[right] or symbols[left] + symbols[right] != joined:
                continue
            symbols[left] = joined
            symbols[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            push(prev[left], left)
            push(left, nxt[left])
        out = []
        i = 0
        while i != -1:
            token = self.token_to_id.get(symbols[i])
            if token is not None:
                out.append(token)
            else:  # as llama.cpp: fall back to the single characters that are tokens
                out.extend(self.token_to_id[c] for c in symbols[i] if c in self.token_to_id)
            i = nxt[i]
        return out
