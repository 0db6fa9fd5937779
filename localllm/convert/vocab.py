"""The tokenizer of a Hugging Face model directory as GGUF `tokenizer.*` metadata.

Two vocabularies, chosen as llama.cpp's converter chooses them:
- "gpt2" (byte-level BPE) from tokenizer.json: tokens in id order, token types, merges, and the
  pre-tokenizer name `tokenizer.ggml.pre`;
- "llama" (SentencePiece) from tokenizer.model when the family prefers it (Gemma, Llama 2), read by
  `spm_model.read_pieces` (a small protobuf parse; see there why not the sentencepiece package).
Special token ids, add_bos/add_eos and the chat template come from tokenizer_config.json, then
config.json, the way gguf-py's SpecialVocab reads them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..gguf.constants import ValueType
from .checkpoint import read_json
from .errors import ConversionError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
U32, BOOL, STR, ARR = ValueType.UINT32, ValueType.BOOL, ValueType.STRING, ValueType.ARRAY

# llama.cpp identifies a BPE pre-tokenizer by hashing the ids its tokenizer gives for this text
# (convert_hf_to_gguf.py, get_vocab_base_pre): sha256 of str(list of ids).
CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n"
    "\U0001f680 (normal) \U0001f636\u200d\U0001f32b\ufe0f (multiple emojis concatenated) \u2705 "
    "\U0001f999\U0001f999 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "\u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785\U0001f601 "
    "?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e ------======= "
    "\u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? "
    "'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
# Hashes from llama.cpp's table, for the pre-tokenizers our tokenizer implements.
KNOWN_HASHES = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Meta-Llama-3-8B
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen1.5 / Qwen2 / Qwen2.5
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",
    "049ecf7629871e3041641907f3de7c733e4dbfdc736f57d882ba0b0845599754": "deepseek-llm",
    "347715f544604f9118bb75ed199f68779f423cabb20db6de6f31b908d04d7821": "deepseek-coder",
    "8aeee3860c56296a157a1fe2fad249ec40aa59b1bb5709f4ade11c4e6fe652ed": "falcon",
    "9d032fcbd5501f4a38150912590928bfb36091efb5df11b8e2124b0390e3fb1e": "falcon3",
    "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166": "mpt",
    "35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34": "starcoder",
    "32d85c31273f8019248f2559fed492d929ea28b17e51d81d3bb36fff23ca72b3": "stablelm2",
    "6221ad2852e85ce96f791f476e0b390cf9b474c9e3d1362f53a24a06dc8220ff": "refact",
    "9c2227e4dd922002fb81bde4fc02b0483ca4f12911410dee2255e4987644e3f8": "command-r",
    "a8594e3edff7c29c003940395316294b2c623e09894deebbc65f33f1515df79e": "dbrx",
}
# When the hash is unknown (a fine-tune's or a test's own vocabulary): the Split regex of the
# tokenizer.json pre-tokenizer names the set. These are the expressions Llama 3 and Qwen2 ship.
_LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
KNOWN_SPLITS = {_LLAMA3_SPLIT: "llama-bpe", _QWEN2_SPLIT: "qwen2"}


@dataclass
class VocabMetadata:
    entries: list[tuple[str, Any, ValueType, Optional[ValueType]]] = field(default_factory=list)
    n_tokens: int = 0

    def add(self, key: str, value, vtype: ValueType, elem: Optional[ValueType] = None) -> None:
        self.entries.append((key, value, vtype, elem))


def looks_special(text: str) -> bool:
    """Added tokens llama.cpp marks CONTROL even when tokenizer.json does not call them special."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>")) or (text.startswith("<unused") and text.endswith(">")))


def vocab_metadata(model_dir: Path, family, config_vocab_size: Optional[int]) -> VocabMetadata:
    model_dir = Path(model_dir)
    tok_json = model_dir / "tokenizer.json"
    spm = model_dir / "tokenizer.model"
    if spm.is_file() and (family.PREFERS_SPM or not tok_json.is_file()):
        meta = _spm_vocab(model_dir, spm, config_vocab_size, family)
    elif tok_json.is_file():
        meta = _bpe_vocab(model_dir, read_json(tok_json), config_vocab_size, family)
    else:
        raise ConversionError(f"{model_dir}: no tokenizer.json or tokenizer.model")
    _special_tokens(model_dir, meta)
    return meta


# -- byte-level BPE ---------------------------------------------------------------------------------
def _bpe_vocab(model_dir: Path, tj: dict, config_vocab_size: Optional[int], family) -> VocabMetadata:
    model = tj.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or (tj.get("decoder") or {}).get("type") != "ByteLevel":
        raise ConversionError(f"{model_dir / 'tokenizer.json'}: not a byte-level BPE tokenizer, and no tokenizer.model to read instead")
    id_to_text: dict[int, str] = {int(i): t for t, i in model.get("vocab", {}).items()}
    added = {int(a["id"]): a for a in tj.get("added_tokens") or []}
    for i, a in added.items():
        id_to_text[i] = a["content"]
    n_seen = max(id_to_text) + 1
    n_tokens = family.vocab_size(n_seen, config_vocab_size)
    if n_seen > n_tokens:
        raise ConversionError(f"tokenizer.json has ids up to {n_seen - 1}, config.json vocab_size is {n_tokens}")
    tokens, types = [], []
    for i in range(n_tokens):
        if i not in id_to_text:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            text = id_to_text[i]
            if added[i].get("special") or looks_special(text):
                types.append(CONTROL)
            else:
                text = text.replace("\u2581", " ")  # llama.cpp matches user-defined tokens pre-normalized
                types.append(USER_DEFINED)
            tokens.append(text)
        else:
            tokens.append(id_to_text[i])
            types.append(NORMAL)
    meta = VocabMetadata(n_tokens=n_tokens)
    meta.add("tokenizer.ggml.model", "gpt2", STR)
    meta.add("tokenizer.ggml.pre", pre_tokenizer_name(model_dir / "tokenizer.json", tj), STR)
    meta.add("tokenizer.ggml.tokens", tokens, ARR, STR)
    meta.add("tokenizer.ggml.token_type", types, ARR, ValueType.INT32)
    meta.add("tokenizer.ggml.merges", _merges(model.get("merges") or []), ARR, STR)
    return meta


def _merges(merges: list) -> list[str]:
    """Merges as "left right" strings; the pair-list format (transformers >= 4.45) is joined the way
    gguf-py joins it, a space inside a part written as U+0120 (the byte-level space)."""
    if merges and isinstance(merges[0], list):
        return [" ".join(part.replace(" ", "\u0120") for part in pair) for pair in merges]
    return [str(m) for m in merges]


def pre_tokenizer_name(path: Path, tj: dict) -> str:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(path)).encode(CHECK_TEXT).ids
    digest = hashlib.sha256(str(list(ids)).encode()).hexdigest()
    if digest in KNOWN_HASHES:
        return KNOWN_HASHES[digest]
    pre = tj.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    for step in steps:
        if step.get("type") == "Split":
            pattern = (step.get("pattern") or {}).get("Regex")
            if pattern in KNOWN_SPLITS:
                return KNOWN_SPLITS[pattern]
    if [s.get("type") for s in steps] == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    raise ConversionError(f"{path}: unknown BPE pre-tokenizer (hash {digest[:12]}…); supported: llama-bpe, qwen2, gpt-2 and llama.cpp's known hashes")


# -- SentencePiece --------------------------------------------------------------------------------------
def _spm_vocab(model_dir: Path, path: Path, config_vocab_size: Optional[int], family) -> VocabMetadata:
    from .spm_model import read_model

    pieces, add_dummy_prefix = read_model(path)
    tokens = [p.text for p in pieces]
    scores = [p.score for p in pieces]
    # llama.cpp's _create_vocab_sentencepiece: unknown/control/unused/byte keep their type, everything
    # else (user-defined pieces included) starts NORMAL and is refined by added_tokens_decoder below.
    types = [p.kind if p.kind in (UNKNOWN, CONTROL, UNUSED, BYTE) else NORMAL for p in pieces]
    config = _tokenizer_config(model_dir)
    for key, entry in (config.get("added_tokens_decoder") or {}).items():
        i, text = int(key), entry.get("content", "")
        while len(tokens) <= i:
            tokens.append(f"[PAD{len(tokens)}]")
            scores.append(-1000.0)
            types.append(UNUSED)
        if types[i] == UNUSED and i < len(pieces):
            continue
        if entry.get("special") or looks_special(text):
            types[i] = CONTROL
        else:
            text = text.replace("\u2581", " ")
            types[i] = USER_DEFINED
        tokens[i], scores[i] = text, -1000.0
    n_tokens = family.vocab_size(len(tokens), config_vocab_size)
    while len(tokens) < n_tokens:
        tokens.append(f"[PAD{len(tokens)}]")
        scores.append(-1000.0)
        types.append(UNUSED)
    meta = VocabMetadata(n_tokens=len(tokens))
    meta.add("tokenizer.ggml.model", "llama", STR)
    meta.add("tokenizer.ggml.pre", "default", STR)
    meta.add("tokenizer.ggml.tokens", tokens, ARR, STR)
    meta.add("tokenizer.ggml.scores", scores, ARR, ValueType.FLOAT32)
    meta.add("tokenizer.ggml.token_type", types, ARR, ValueType.INT32)
    meta.add("tokenizer.ggml.add_space_prefix", bool(add_dummy_prefix) and family.ARCH != "gemma3", BOOL)
    return meta


# -- special tokens, flags, chat template ----------------------------------------------------------------
def _tokenizer_config(model_dir: Path) -> dict:
    path = model_dir / "tokenizer_config.json"
    return read_json(path) if path.is_file() else {}


_SPECIAL_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "pad": "padding_token_id"}


def _special_tokens(model_dir: Path, meta: VocabMetadata) -> None:
    config = _tokenizer_config(model_dir)
    tok_json = model_dir / "tokenizer.json"
    added = (read_json(tok_json).get("added_tokens") or []) if tok_json.is_file() else []
    tokens = next(value for key, value, _, _ in meta.entries if key == "tokenizer.ggml.tokens")
    token_ids = {text: i for i, text in reversed(list(enumerate(tokens)))}
    ids: dict[str, int] = {}
    flags: dict[str, bool] = {}
    if tok_json.is_file():
        flags.update(_post_processor_flags(read_json(tok_json), config))
    for kind in _SPECIAL_KEYS:
        entry = config.get(f"{kind}_token")
        content = entry.get("content") if isinstance(entry, dict) else entry
        if isinstance(content, str):
            found = next((a["id"] for a in added if a.get("content") == content), None)
            if found is None:  # no tokenizer.json (SentencePiece only): the piece itself
                found = token_ids.get(content)
            if isinstance(found, int) and found < meta.n_tokens:
                ids.setdefault(kind, found)
        if isinstance(config.get(f"add_{kind}_token"), bool):
            flags[kind] = config[f"add_{kind}_token"]
    model_config = read_json(model_dir / "config.json")
    for kind in _SPECIAL_KEYS:
        value = model_config.get(f"{kind}_token_id", (model_config.get("text_config") or {}).get(f"{kind}_token_id"))
        if isinstance(value, int) and 0 <= value < meta.n_tokens:
            ids.setdefault(kind, value)
    for kind, value in ids.items():
        meta.add(f"tokenizer.ggml.{_SPECIAL_KEYS[kind]}", value, U32)
    for kind in ("bos", "eos"):
        if kind in flags:
            meta.add(f"tokenizer.ggml.add_{kind}_token", flags[kind], BOOL)
    _chat_templates(model_dir, config, meta)


def _post_processor_flags(tj: dict, config: dict) -> dict[str, bool]:
    """add_bos/add_eos from a TemplateProcessing post-processor (its single-sequence template starts
    with BOS / ends with EOS), as gguf-py reads it; tokenizer_config.json's add_*_token overrides."""
    flags: dict[str, bool] = {}
    post = tj.get("post_processor") or {}
    for proc in post.get("processors", [post]):
        if proc.get("type") != "TemplateProcessing":
            continue
        single = proc.get("single") or []
        if len(single) > 1:
            first = (single[0].get("SpecialToken") or {}).get("id")
            last = (single[-1].get("SpecialToken") or {}).get("id")
            bos, eos = (_content(config.get("bos_token")), _content(config.get("eos_token")))
            if first:
                flags["bos"] = first == bos or bos is None
            if last:
                flags["eos"] = last == eos or eos is None
    return flags


def _content(entry) -> Optional[str]:
    return entry.get("content") if isinstance(entry, dict) else entry


def _chat_templates(model_dir: Path, config: dict, meta: VocabMetadata) -> None:
    template = config.get("chat_template")
    if template is None and (model_dir / "chat_template.jinja").is_file():
        template = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None and (model_dir / "chat_template.json").is_file():
        template = read_json(model_dir / "chat_template.json").get("chat_template")
    if isinstance(template, str):
        meta.add("tokenizer.chat_template", template, STR)
    elif isinstance(template, list):  # named templates: "default" is the chat template, others by name
        for entry in template:
            name, text = entry.get("name"), entry.get("template")
            if isinstance(name, str) and isinstance(text, str):
                key = "tokenizer.chat_template" if name == "default" else f"tokenizer.chat_template.{name}"
                meta.add(key, text, STR)
