"""The vocabulary from GGUF metadata and the `Tokenizer` the engine uses.

Metadata read: tokenizer.ggml.{model, pre, tokens, scores, token_type, merges, bos/eos/unknown/padding/
eot/eom/seperator_token_id, add_bos_token, add_eos_token, add_space_prefix, normalizer.lowercase,
normalizer.strip_accents}. Behaviour follows llama.cpp (llama-vocab.cpp): control, user-defined and unknown
tokens are matched in the text first (longest first; control and unknown ones only when special tokens are
parsed), then each remaining fragment is tokenized by the model: SentencePiece-style "llama", byte-level BPE
"gpt2", WordPiece "bert", or Gemma 4's BPE over SentencePiece-style pieces "gemma4".
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional

import numpy as np

from ..errors import LocalLLMError
from ..gguf.metadata import Metadata
from .bpe import ADD_BOS, CHAR_TO_BYTE, PRE_NAMES, BPEModel
from .spm import SPACE, spm_encode
from .wpm import WPMModel

# tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# Token texts llama.cpp treats as end of generation besides the EOS/EOT/EOM ids.
EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
             "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>"}
SUPPORTED_MODELS = ("llama", "gpt2", "bert", "gemma4")
# Models whose pieces are SentencePiece-style: "▁" for a space, BYTE tokens written <0xXX>.
_SPM_PIECES = ("llama", "bert", "gemma4")
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class TokenizerError(LocalLLMError):
    """A vocabulary that cannot be used, or ids that are not in it."""


class Tokenizer:
    def __init__(self, model: str, tokens: list[str], types: list[int], scores=None, merges=None, pre: Optional[str] = None,
                 bos_id=None, eos_id=None, unk_id=None, eot_id=None, eom_id=None,
                 add_bos: Optional[bool] = None, add_eos: bool = False, add_space_prefix: Optional[bool] = None,
                 lowercase: bool = True, strip_accents: Optional[bool] = None):
        if model not in SUPPORTED_MODELS:
            raise TokenizerError(f"tokenizer model {model!r} is not supported (supported: {', '.join(SUPPORTED_MODELS)})")
        self.model, self.tokens, self.types, self.pre = model, tokens, types, pre
        self.vocab_size = len(tokens)
        self.token_to_id: dict[str, int] = {}
        for i, text in enumerate(tokens):
            self.token_to_id.setdefault(text, i)
        self.bos_id, self.eos_id, self.unk_id = bos_id, eos_id, unk_id
        for name, value in (("bos", bos_id), ("eos", eos_id), ("unknown", unk_id), ("eot", eot_id), ("eom", eom_id)):
            if value is not None and not 0 <= value < self.vocab_size:
                raise TokenizerError(f"{name} token id {value} is outside the {self.vocab_size}-token vocabulary")
        self.add_bos = (model in ("llama", "bert")) if add_bos is None else add_bos
        self.add_eos = add_eos
        self.eog_ids = frozenset(
            {i for i in (eos_id, eot_id, eom_id) if i is not None}
            | {self.token_to_id[t] for t in EOG_TEXTS if t in self.token_to_id}
        )
        # Matched in the text before tokenizing, longest first (stable for equal lengths).
        self._specials = sorted(
            (i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED, UNKNOWN) and tokens[i]),
            key=lambda i: -len(tokens[i]),
        )
        self._pieces_cache: dict[int, bytes] = {}
        self._bpe = self._wpm = None
        self.add_space_prefix = False
        if model == "llama":
            self.scores = scores if scores is not None else [0.0] * self.vocab_size
            self.add_space_prefix = True if add_space_prefix is None else add_space_prefix
            self._byte_ids = [self.token_to_id.get(f"<0x{b:02X}>") for b in range(256)]
        elif model == "bert":
            self._wpm = WPMModel(self.token_to_id, unk_id, lowercase, strip_accents)
        else:
            if model == "gemma4":
                pre = "gemma4"  # llama.cpp sets it for this model, whatever the file says
            if (pre or "default") not in PRE_NAMES:
                raise TokenizerError(
                    f"BPE pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(PRE_NAMES))})"
                )
            if merges is None:
                raise TokenizerError(f"a {model} (BPE) vocabulary needs tokenizer.ggml.merges")
            self._bpe = BPEModel(self.token_to_id, list(merges), pre or "default")

    # -- construction ---------------------------------------------------------------------------------------
    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """The tokenizer of a file's metadata (a GGUFReader's `metadata`, or a plain mapping). Every
        tokenizer.* value used, the chat template text included, is type- and range-checked here: a
        wrong one is a GGUFError naming its key."""
        meta = Metadata.of(meta)
        model = meta.get_str("tokenizer.ggml.model", None)
        if model is None:
            raise TokenizerError("the file has no vocabulary (tokenizer.ggml.model is missing)")
        tokens = meta.get_array("tokenizer.ggml.tokens", "str", None)
        if not tokens:
            raise TokenizerError("tokenizer.ggml.tokens is missing or empty")
        n = len(tokens)
        type_array = meta.get_array("tokenizer.ggml.token_type", "int", None, min=0, max=BYTE)
        types = [NORMAL] * n if type_array is None else type_array.tolist()
        scores = meta.get_array("tokenizer.ggml.scores", "float", None)
        if scores is not None:
            scores = scores.tolist()
        for key, values in (("token_type", types), ("scores", scores)):
            if values is not None and len(values) != n:
                raise TokenizerError(f"tokenizer.ggml.{key} has {len(values)} entries for {n} tokens")
        if model == "llama" and type_array is not None:
            _check_byte_tokens(meta, tokens, type_array)
        meta.get_str("tokenizer.chat_template", None)  # rendered later (chat/); its type is checked at load

        def token_id(key):
            # Negative and 0xFFFFFFFF mean "none" (llama.cpp writes -1 as uint32); others must be in the vocabulary.
            value = meta.get_int(f"tokenizer.ggml.{key}", None)
            if value is None or value < 0 or value == 0xFFFFFFFF:
                return None
            if value >= n:
                meta.fail(f"tokenizer.ggml.{key}", f"token id {value} is outside the {n}-token vocabulary")
            return value

        def flag(key):
            return meta.get_bool(f"tokenizer.ggml.{key}", None)

        pre = "gemma4" if model == "gemma4" else meta.get_str("tokenizer.ggml.pre", None)
        merges = meta.get_array("tokenizer.ggml.merges", "str", None)
        add_bos, add_eos = flag("add_bos_token"), bool(flag("add_eos_token"))
        if model in ("gpt2", "gemma4"):
            if add_bos is None:
                add_bos = pre in ADD_BOS  # llama.cpp's default: on for Llama 3
            if PRE_NAMES.get(pre) == "gemma4":
                add_bos = True  # llama.cpp overrides the file's false for Gemma 4 (its PR 21500)
        bos_id, eos_id, unk_id = token_id("bos_token_id"), token_id("eos_token_id"), token_id("unknown_token_id")
        if model == "bert":
            # llama.cpp frames a BERT text as [CLS] ... [SEP] whenever it adds special tokens: CLS is its BOS
            # (default id 101), SEP (tokenizer.ggml.seperator_token_id, sic; default 102) stands here as EOS.
            bos_id = 101 if bos_id is None and n > 101 else bos_id
            eos_id = token_id("seperator_token_id")
            eos_id = 102 if eos_id is None and n > 102 else eos_id
            unk_id = 100 if unk_id is None and n > 100 else unk_id
            add_bos = add_eos = True
        lowercase = flag("normalizer.lowercase")
        return cls(
            model, tokens, types, scores=scores, merges=merges, pre=pre,
            bos_id=bos_id, eos_id=eos_id, unk_id=unk_id, eot_id=token_id("eot_token_id"), eom_id=token_id("eom_token_id"),
            add_bos=add_bos, add_eos=add_eos, add_space_prefix=flag("add_space_prefix"),
            lowercase=lowercase is not False, strip_accents=flag("normalizer.strip_accents"),
        )

    # -- encoding --------------------------------------------------------------------------------------------
    def encode(self, text: str, add_bos: Optional[bool] = None, add_eos: Optional[bool] = None, parse_special: bool = False) -> list[int]:
        add_bos = self.add_bos if add_bos is None else add_bos
        add_eos = self.add_eos if add_eos is None else add_eos
        out: list[int] = []
        if add_bos:
            if self.bos_id is None:
                raise TokenizerError("this vocabulary has no BOS token")
            out.append(self.bos_id)
        prev_special = True
        for fragment in self._partition(text, parse_special):
            if isinstance(fragment, int):
                out.append(fragment)
                prev_special = True
                continue
            if self._bpe is not None:
                out.extend(self._bpe.encode(fragment))
            elif self._wpm is not None:
                out.extend(self._wpm.encode(fragment))
            else:
                if self.add_space_prefix and prev_special:
                    fragment = " " + fragment
                out.extend(spm_encode(fragment.replace(" ", SPACE), self.token_to_id, self.scores, self._byte_ids, self.unk_id))
            prev_special = False
        if add_eos:
            if self.eos_id is None:
                raise TokenizerError("this vocabulary has no EOS token")
            out.append(self.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list:
        """Split text into raw strings and special-token ids, as llama.cpp's tokenizer_st_partition."""
        fragments: list = [text] if text else []
        for token_id in self._specials:
            if not parse_special and self.types[token_id] != USER_DEFINED:
                continue
            needle = self.tokens[token_id]
            if not any(isinstance(f, str) and needle in f for f in fragments):
                continue
            split: list = []
            for f in fragments:
                if not isinstance(f, str) or needle not in f:
                    split.append(f)
                    continue
                parts = f.split(needle)
                for k, part in enumerate(parts):
                    if k:
                        split.append(token_id)
                    if part:
                        split.append(part)
            fragments = split
        return fragments

    # -- decoding -----------------------------------------------------------------------------------------
    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """The bytes a token stands for. Control tokens give their text when `special`, else nothing."""
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"token id {token_id} is outside the {self.vocab_size}-token vocabulary")
        kind = self.types[token_id]
        if kind == CONTROL:
            return self.tokens[token_id].encode("utf-8") if special else b""
        if kind == USER_DEFINED or kind == UNKNOWN and self.model != "llama":
            return self.tokens[token_id].encode("utf-8")
        cached = self._pieces_cache.get(token_id)
        if cached is not None:
            return cached
        text = self.tokens[token_id]
        if self.model in _SPM_PIECES:
            if kind == BYTE:
                piece = bytes([int(text[3:5], 16)])
            elif kind == UNKNOWN:
                piece = "\u2585".encode("utf-8")
            else:
                piece = text.replace(SPACE, " ").encode("utf-8")
        else:
            piece = bytes(CHAR_TO_BYTE[c] for c in text if c in CHAR_TO_BYTE) if kind != BYTE else text.encode("utf-8")
        self._pieces_cache[token_id] = piece
        return piece

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of `ids`; control tokens (BOS, <end_of_turn>, ...) are left out unless `special`, as
        llama.cpp's detokenizer does by default."""
        return b"".join(self.token_to_piece(int(i), special=special) for i in ids).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"Tokenizer({self.model}, {self.vocab_size} tokens, pre={self.pre!r})"


def _check_byte_tokens(meta: Metadata, tokens: list[str], types: np.ndarray) -> None:
    """A SentencePiece vocabulary's BYTE tokens must read <0xXX> (token_to_piece decodes the two hex digits)."""
    for i in np.flatnonzero(types == BYTE).tolist():
        if not _BYTE_TOKEN.fullmatch(tokens[i]):
            meta.fail("tokenizer.ggml.tokens", f"token {i} has type BYTE but reads {tokens[i][:20]!r}, not <0xXX>")
