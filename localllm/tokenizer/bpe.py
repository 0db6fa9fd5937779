"""BPE: byte-level (`tokenizer.ggml.model = "gpt2"`: Llama 3, Qwen2/3, GPT-2 style vocabularies) and
SentencePiece-style (`"gemma4"`).

The text is cut into words by the pre-tokenizer regexes named by `tokenizer.ggml.pre` (llama.cpp's
table, llama-vocab.cpp: several names share one set; a set with several expressions applies them in
turn, each splitting the pieces the previous left, keeping the text between matches as pieces too).
A byte-level set maps each word's bytes to GPT-2's printable characters; an SPM-style one (Gemma 4)
keeps the characters, spaces already escaped to "▁". Then adjacent symbols are merged by merge rank
(lowest first, leftmost on ties) until no ranked pair is left.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import regex

from .spm import SPACE

# llama.cpp rewrites the case-insensitive contraction group (?i:'s|'t|...) in explicit classes.
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# Qwen 3.5: Qwen2's, with combining marks (\p{M}) kept inside words.
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek LLM's letter class, written with escapes: llama.cpp's source holds the characters themselves, and
# several of them (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A) have canonical equivalents that an editor
# normalizing to NFC silently swaps in, which turns "\u1f5f-\u1f7d" into an inverted, invalid range.
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)
_DEEPSEEK_LLM_PUNCT = "!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002"
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"


@dataclass(frozen=True)
class PreTokenizer:
    expressions: tuple[str, ...]
    byte_level: bool = True  # GPT-2's byte-to-character map; False: raw UTF-8 symbols, <0xXX> byte fallback
    whole_newlines: bool = False  # a run of newlines that is a token is that token (llama.cpp's Gemma 4 fix, PR 21343)


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
    "llama3": PreTokenizer((_LLAMA3,)),
    "qwen2": PreTokenizer((_QWEN2,)),
    "qwen35": PreTokenizer((_QWEN35,)),
    "gpt2": PreTokenizer((_GPT2,)),
    "deepseek-llm": PreTokenizer(("[\r\n]", r"\s?[" + _DEEPSEEK_LLM_LETTERS + "]+", r"\s?[" + _DEEPSEEK_LLM_PUNCT + "]+",
                                  r"\s+$", _CJK, r"\p{N}+")),
    "deepseek-coder": PreTokenizer(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")),
    "starcoder": PreTokenizer((r"\p{N}", _GPT2)),
    # SentencePiece-style BPE: no word splitting beyond newline runs (a merge never crosses a newline).
    "gemma4": PreTokenizer((r"[^\n]+|\n+",), byte_level=False, whole_newlines=True),
    "sarvam-moe": PreTokenizer((r"[^\n]+|\n+",), byte_level=False),
}
# `tokenizer.ggml.pre` value -> pre-tokenizer set: llama.cpp's name mapping (llama_vocab::impl::load), for the
# names whose expressions are the same as a set above. The others it knows (tests/tokenizer/test_tokenizer.py lists
# them all) use expressions or hand-written splitters we do not have, and are refused.
PRE_NAMES: dict[str, str] = {
    "default": "default",
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano", "dbrx", "smaug-bpe", "chatglm-bpe", "glm4", "glm5"), "llama3"),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open",
                     "grok-2"), "qwen2"),
    "qwen35": "qwen35",
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                     "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "exaone4", "mpt", "olmo",
                     "jais", "trillion", "granite-docling"), "gpt2"),
    "deepseek-llm": "deepseek-llm",
    "deepseek-coder": "deepseek-coder",
    "falcon": "falcon",
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
                    "starcoder"),
    "gemma4": "gemma4", "granite-embed-multi-311m": "gemma4",
    "sarvam-moe": "sarvam-moe",
}
# Names whose words skip merging when the whole word is a token (llama.cpp's ignore_merges) ...
IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                 "jina-v5-nano", "glm4", "glm5"}
# ... and those that add BOS when the file does not say.
ADD_BOS = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"}


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
    def __init__(self, token_to_id: dict, merges: list[str], pre_name: str):
        self.token_to_id = token_to_id
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            cut = merge.find(" ", 1)  # from 1, as llama.cpp: a pair's left side may itself be a space
            if cut > 0:
                self.ranks.setdefault((merge[:cut], merge[cut + 1 :]), rank)
        pre = PRE_TOKENIZERS[PRE_NAMES[pre_name]]
        self.expressions = [regex.compile(e) for e in pre.expressions]
        self.byte_level, self.whole_newlines = pre.byte_level, pre.whole_newlines
        self.ignore_merges = pre_name in IGNORE_MERGES
        self._byte_ids = [token_to_id.get(f"<0x{b:02X}>") for b in range(256)]
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        if not self.byte_level:
            text = text.replace(" ", SPACE)  # SentencePiece's escape: its pieces have "▁" for a space
        for word in split_words(text, self.expressions):
            ids = self._cache.get(word)
            if ids is None:
                if self.byte_level:
                    ids = self._encode_word("".join(BYTE_TO_CHAR[b] for b in word.encode("utf-8")))
                elif self.whole_newlines and word[0] == "\n" and word in self.token_to_id:  # all newlines
                    ids = [self.token_to_id[word]]
                else:
                    ids = self._encode_word(word)
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
            elif self.byte_level:  # as llama.cpp: fall back to the single characters (bytes) that are tokens
                out.extend(self.token_to_id[c] for c in symbols[i] if c in self.token_to_id)
            else:  # to the <0xXX> tokens of its bytes, those that exist
                out.extend(t for t in map(self._byte_ids.__getitem__, symbols[i].encode("utf-8")) if t is not None)
            i = nxt[i]
        return out
