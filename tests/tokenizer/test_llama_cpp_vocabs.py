"""llama.cpp's own tokenizer test suite: every case of its models/ggml-vocab-<name>.gguf.inp tokenized with that
vocabulary must give the ids of the matching .out line. The files come from llama-cpp-python's sdist
(tests/conftest.py: llama_cpp_vocab_dir); the cases are read and tokenized as llama.cpp's
tests/test-tokenizer-0.cpp does: no BOS/EOS (add_special false), special tokens not parsed.
"""

from __future__ import annotations

import pytest

from localllm.gguf import GGUFReader
from localllm.tokenizer import Tokenizer

# The vocabularies of llama-cpp-python 0.3.36 that come with cases (four more come without: aquila, baichuan,
# gpt-neox, nomic-bert-moe), one per tokenizer model and pre-tokenizer llama.cpp tests.
VOCABS = ["bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
          "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]
SEPARATOR = "\n__ggml_vocab_test__\n"


def read_cases(inp: str, out: str) -> list[tuple[str, list[int]]]:
    """(text, ids) pairs: the .inp texts are separated by SEPARATOR lines (the text after the last one, empty,
    is no case, as test-tokenizer-0's loop ends there); the .out file has one line of ids per text."""
    texts = inp.split(SEPARATOR)
    if texts[-1] == "":
        texts.pop()
    lines = out.split("\n")[: len(texts)]
    assert len(lines) == len(texts), "the .inp and .out files have different numbers of cases"
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines)]


@pytest.mark.parametrize("name", VOCABS)
def test_vocab_matches_llama_cpp(llama_cpp_vocab_dir, name):
    path = llama_cpp_vocab_dir / f"ggml-vocab-{name}.gguf"
    # newline="": the cases hold "\r" and "\r\n" that must reach the tokenizer unchanged
    with open(f"{path}.inp", encoding="utf-8", newline="") as f:
        inp = f.read()
    with open(f"{path}.out", encoding="utf-8") as f:
        out = f.read()
    cases = read_cases(inp, out)
    assert len(cases) >= 46
    with GGUFReader(path) as reader:
        tokenizer = Tokenizer.from_metadata(reader.metadata)
    failed = [(text, ids, got) for text, ids in cases
              if (got := tokenizer.encode(text, add_bos=False, add_eos=False, parse_special=False)) != ids]
    assert not failed, f"{len(failed)} of {len(cases)} cases differ; the first: " + "; ".join(
        f"{text[:40]!r}: {got[:12]} instead of {ids[:12]}" for text, ids, got in failed[:3])
