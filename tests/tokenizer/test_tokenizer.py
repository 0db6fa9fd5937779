"""Tokenizers against independent oracles.

- Gemma 3 (SentencePiece-style): llama.cpp's own prompt ids (reference.json), and HF `tokenizers`
  configured from the same vocabulary: a BPE model whose merges are every pair of vocabulary pieces
  that joins into a vocabulary token, ranked by that token's score (how transformers converts a
  SentencePiece BPE model), byte fallback on, spaces replaced by "▁", user-defined tokens added as
  non-normalized added tokens (llama.cpp matches them in the raw text first, as HF does).
- Byte-level BPE: vocabularies trained here with HF's BPE trainer, pre-tokenized by each `pre`'s regex;
  our encoder reads only the exported tokens and merges and must give HF's ids.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from conftest import REFERENCE_DIR
from localllm.gguf import GGUFReader
from localllm.tokenizer import StreamDecoder, Tokenizer, TokenizerError
from localllm.tokenizer.bpe import BYTE_TO_CHAR, PRE_NAMES

TEXTS = [
    "The capital of France is Paris.",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "Grüße aus Köln! Ça va? ñandú, Straße, Ångström",
    "Привет, как дела? Добро пожаловать.",
    "東京は日本の首都です。北京欢迎你！서울은 한국의 수도입니다.",
    "مرحبا بالعالم، كيف حالك؟ שלום עולם",
    "हिन्दी में लिखा हुआ वाक्य। ภาษาไทยง่ายนิดเดียว",
    "emoji 🙂🚀 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 skin 👍🏽 and ✨",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; } // C++ && ||",
    "numbers 1234567890 3.14159 1e-10 0x1F -42 1,000,000",
    "contractions: don't, I'll, we've, she's, they'd, I'M, YOU'RE",
    "mixed  \t  whitespace \u00a0 nbsp \u3000 ideographic space",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad> literal specials",
    "a" * 50 + " " + "ab" * 30,
    "",
    " ",
    "\n",
]


# -- Gemma (SentencePiece-style) ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_meta(gemma_path):
    with GGUFReader(gemma_path) as reader:
        return dict(reader.metadata)


@pytest.fixture(scope="module")
def gemma(gemma_meta):
    return Tokenizer.from_metadata(gemma_meta)


def test_gemma_prompt_ids_equal_llamacpp(gemma):
    reference = json.loads((REFERENCE_DIR / "gemma-3-270m" / "reference.json").read_text())
    for prompt in reference["prompts"].values():
        assert gemma.encode(prompt["prompt"]) == prompt["prompt_ids"]
        assert gemma.decode(prompt["greedy_ids"]) == prompt["greedy_text"]


def hf_from_spm(meta) -> HFTokenizer:
    tokens = meta["tokenizer.ggml.tokens"]
    scores = meta["tokenizer.ggml.scores"]
    types = meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    merges = []
    for i, token in enumerate(tokens):
        if types[i] != 1 or len(token) < 2:
            continue
        for k in range(1, len(token)):
            a, b = token[:k], token[k:]
            if a in vocab and b in vocab:
                merges.append((-float(scores[i]), vocab[a], vocab[b], a, b))
    merges.sort()
    model = models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], byte_fallback=True, unk_token="<unk>", fuse_unk=False)
    hf = HFTokenizer(model)
    hf.normalizer = normalizers.Replace(" ", "▁")
    user_defined = [AddedToken(tokens[i], normalized=False, special=False) for i in np.flatnonzero(types == 4)]
    control = [AddedToken(tokens[i], normalized=False, special=True) for i in np.flatnonzero(types == 3) if tokens[i]]
    hf.add_tokens(user_defined)
    hf.add_special_tokens(control)
    return hf


@pytest.fixture(scope="module")
def gemma_hf(gemma_meta):
    return hf_from_spm(gemma_meta)


@pytest.mark.parametrize("text", TEXTS)
def test_gemma_ids_equal_hf_tokenizers(gemma, gemma_hf, text):
    ours = gemma.encode(text, add_bos=False, parse_special=True)
    theirs = gemma_hf.encode(text, add_special_tokens=False).ids
    assert ours == theirs
    assert gemma.decode(ours, special=True) == text


def test_gemma_specials_only_when_parsing(gemma):
    text = "<start_of_turn>user"
    parsed = gemma.encode(text, add_bos=False, parse_special=True)
    literal = gemma.encode(text, add_bos=False, parse_special=False)
    assert parsed[0] == gemma.token_to_id["<start_of_turn>"]
    assert gemma.token_to_id["<start_of_turn>"] not in literal and len(literal) > 2
    assert gemma.token_to_id["<end_of_turn>"] in gemma.eog_ids and gemma.eos_id in gemma.eog_ids


def test_stream_decoder_never_splits_a_character(gemma):
    text = "héllo 世界 👨‍👩‍👧 ok"
    ids = [gemma.token_to_id[f"<0x{b:02X}>"] for b in text.encode()]  # one byte per token
    stream = StreamDecoder(gemma)
    pieces = [stream.feed(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    for p in pieces:
        p.encode("utf-8")  # each piece is whole characters


def test_stream_decoder_flushes_invalid_bytes_as_replacement(gemma):
    stream = StreamDecoder(gemma)
    assert stream.feed(gemma.token_to_id["<0xE4>"]) == ""
    assert stream.flush() == "\ufffd"


def test_decode_rejects_ids_outside_the_vocabulary(gemma):
    with pytest.raises(TokenizerError):
        gemma.decode([gemma.vocab_size])


def test_vocab_only_metadata_is_enough(gemma_meta):
    keys = {k: v for k, v in gemma_meta.items() if k.startswith("tokenizer.")}
    tok = Tokenizer.from_metadata(keys)
    assert tok.encode("Hello world") == [2, 9259, 1902]


def test_bad_vocabularies_are_refused():
    with pytest.raises(TokenizerError, match="not supported"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "wordpiece-x", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(TokenizerError, match="pre-tokenizer"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.merges": [], "tokenizer.ggml.pre": "nope"})
    with pytest.raises(TokenizerError, match="entries"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.scores": [0.0]})


# Every `tokenizer.ggml.pre` value llama.cpp knows: the tokenizer_pre string comparisons in llama_vocab::impl::load,
# src/llama-vocab.cpp of the llama.cpp that llama-cpp-python 0.3.36 vendors.
LLAMA_CPP_PRE_NAMES = [
    "a.x-4.0", "afmoe", "bailingmoe", "bailingmoe2", "bloom", "chameleon", "chatglm-bpe", "codeshell", "cohere2moe",
    "command-r", "dbrx", "deepseek-coder", "deepseek-llm", "deepseek-r1-qwen", "deepseek-v3", "default", "exaone",
    "exaone-moe", "exaone4", "f2llmv2", "falcon", "falcon-h1", "falcon3", "gemma4", "gigachat", "glm4", "glm5",
    "gpt-2", "gpt-4o", "gpt3-finnish", "granite-docling", "granite-embed-multi-311m", "granite-embed-multi-97m",
    "grok-2", "hunyuan", "hunyuan-dense", "hy_v4", "jais", "jais-2", "jina-de", "jina-es", "jina-v1-en",
    "jina-v2-code", "jina-v2-de", "jina-v2-es", "jina-v5-nano", "joyai-llm", "kanana2", "kimi-k2", "kormo", "laguna",
    "lfm2", "llada-moe", "llama-bpe", "llama-v3", "llama3", "llama4", "megrez", "mellum", "mellum2", "midm-2.0",
    "minerva-7b", "minicpm5", "minimax-m2", "modern-bert", "mpt", "olmo", "phi-2", "pixtral", "poro-chat", "qwen2",
    "qwen35", "refact", "roberta-bpe", "sarvam-moe", "seed-coder", "smaug-bpe", "smollm", "solar-open", "spark2_5",
    "stablelm2", "starcoder", "superbpe", "talkie", "tekken", "tiny_aya", "trillion", "ufakzeka", "viking",
    "whitespace", "youtu",
]
# ... and every `tokenizer.ggml.model` (the tokenizer_model comparisons there).
LLAMA_CPP_MODELS = ["bert", "gemma4", "gpt2", "hybriddna", "llama", "no_vocab", "none", "plamo2", "rwkv", "t5", "test",
                    "whitespace"]


def test_every_llama_cpp_pre_tokenizer_is_supported_or_refused_clearly():
    tokens = ["a", "b", "ab", " ", "Ġ", "▁", "<0x0A>", "\n"]
    supported = []
    for pre in LLAMA_CPP_PRE_NAMES:
        meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["a b"],
                "tokenizer.ggml.pre": pre}
        try:
            tok = Tokenizer.from_metadata(meta)
        except TokenizerError as e:
            assert f"pre-tokenizer {pre!r} is not supported" in str(e)
            continue
        supported.append(pre)
        assert tok.encode("ab\nab", add_bos=False)[0] == 2  # each expression compiles and splits
    assert set(PRE_NAMES) <= set(LLAMA_CPP_PRE_NAMES)  # no name of our own making
    assert set(supported) == set(PRE_NAMES)


@pytest.mark.parametrize("model", LLAMA_CPP_MODELS)
def test_every_llama_cpp_tokenizer_model_is_supported_or_refused_clearly(model):
    tokens = ["a", "b", "ab", "▁", "▁ab"]  # "▁": SentencePiece-style models write word starts with it
    meta = {"tokenizer.ggml.model": model, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["a b", "▁ ab"]}
    try:
        tok = Tokenizer.from_metadata(meta)
    except TokenizerError as e:
        assert f"tokenizer model {model!r} is not supported" in str(e)
        return
    assert tok.decode(tok.encode("ab", add_bos=False, add_eos=False)).strip() == "ab"


# -- byte-level BPE ------------------------------------------------------------------------------------------

CORPUS = TEXTS * 3 + [
    "The quick brown fox jumps over the lazy dog. " * 5,
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\nprint(x.sum())\n" * 3,
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor. " * 4,
    "数据 科学 和 机器 学习 是 有趣的。 " * 4 + "Данные и обучение. " * 4,
    "2024-01-15 12:34:56 INFO request id=12345 took 678ms status=200\n" * 4,
]
# `pre` value -> the regex HF must split with (the same expression llama.cpp uses for that name)
PRE_REGEX = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "gpt-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_bpe(pre: str) -> HFTokenizer:
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_REGEX[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    hf.train_from_iterator(CORPUS, trainer)
    return hf


def metadata_from_hf(hf: HFTokenizer, pre: str) -> dict:
    state = json.loads(hf.to_str())
    vocab = state["model"]["vocab"]
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    types = np.array([3 if t in SPECIALS else 1 for t in tokens], dtype=np.int32)
    return {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": vocab["<|endoftext|>"], "tokenizer.ggml.add_bos_token": False,
    }


@pytest.fixture(scope="module", params=sorted(PRE_REGEX))
def bpe_pair(request):
    hf = train_bpe(request.param)
    return request.param, hf, Tokenizer.from_metadata(metadata_from_hf(hf, request.param))


@pytest.mark.parametrize("text", TEXTS)
def test_bpe_ids_equal_hf_tokenizers(bpe_pair, text):
    pre, hf, ours = bpe_pair
    expected = hf.encode(text, add_special_tokens=False).ids
    assert ours.encode(text, parse_special=True) == expected
    assert ours.decode(expected, special=True) == text


def test_bpe_byte_alphabet_is_gpt2s():
    assert len(set(BYTE_TO_CHAR.values())) == 256
    assert BYTE_TO_CHAR[ord(" ")] == "Ġ" and BYTE_TO_CHAR[ord("\n")] == "Ċ" and BYTE_TO_CHAR[ord("A")] == "A"
