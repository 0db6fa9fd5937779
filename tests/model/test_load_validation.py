"""Valid-looking files with wrong-typed or out-of-range metadata: refused at load with a GGUFError that
names the key, on one line (issue 25, point 6). Before the checked accessors these gave ValueError
("invalid literal for int()"), TypeError ("unhashable type: 'numpy.ndarray'"), ZeroDivisionError
(head_count 0), or loaded and failed later (a BYTE token that is not <0xXX>, when decoded).
"""

from __future__ import annotations

import numpy as np
import pytest

import localllm
from localllm.cli.app import main
from localllm.errors import GGUFError
from localllm.gguf import GGUFReader, GGUFWriter, ValueType
from localllm.gguf.metadata import Metadata
from localllm.tokenizer import Tokenizer
from tiny_models import write_tiny_model

U32, I32, F32, STR, BOOL = ValueType.UINT32, ValueType.INT32, ValueType.FLOAT32, ValueType.STRING, ValueType.BOOL
DELETE = object()


def rewrite(src, dst, changes: dict) -> str:
    """Copy the GGUF `src` to `dst` with metadata `changes`: key -> (value, value type[, element type]),
    or DELETE."""
    with GGUFReader(src) as reader:
        w = GGUFWriter(dst)
        w.copy_metadata(reader, skip=list(changes))
        for key, change in changes.items():
            if change is not DELETE:
                w.add(key, *change)
        for info in reader.tensors.values():
            w.add_tensor(info.name, reader.tensor_bytes(info.name), info.ggml_type.name, shape=info.shape)
        w.write()
    return str(dst)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("v") / "llama.gguf", "llama", "F32")


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("v") / "gemma.gguf", "gemma3", "Q8_0")


N_TOKENS = 384  # tiny_models.N_VOCAB

# (key, new value and its type(s), what the message must say)
BAD_VALUES = [
    ("llama.attention.head_count", (0, U32), "at least 1"),  # was ZeroDivisionError
    ("llama.attention.head_count", ("four", STR), "must be an integer"),  # was ValueError
    ("llama.attention.head_count_kv", (3, U32), "not a multiple"),
    ("llama.block_count", (2.0, F32), "must be an integer"),
    ("llama.block_count", (1 << 40, ValueType.UINT64), "at most"),
    ("llama.embedding_length", (-256, I32), "at least 1"),
    ("llama.feed_forward_length", DELETE, "missing"),
    ("llama.attention.key_length", (np.array([64, 64], np.float32), ValueType.ARRAY), "must be an integer"),
    ("llama.attention.layer_norm_rms_epsilon", ("1e-6", STR), "must be a number"),
    ("llama.attention.layer_norm_rms_epsilon", (float("nan"), F32), "finite"),
    ("llama.attention.layer_norm_rms_epsilon", (0.0, F32), "greater than 0"),
    ("llama.rope.freq_base", (np.array([1.0, 2.0], np.float32), ValueType.ARRAY), "must be a number"),
    ("llama.rope.freq_base", (-1.0, F32), "greater than 0"),
    ("llama.rope.scaling.type", (7, U32), "must be a string"),
    ("llama.rope.scaling.type", ("sideways", STR), "must be one of"),
    ("llama.rope.scaling.factor", ("2", STR), "must be a number"),
    ("llama.context_length", (0, U32), "at least 1"),
    ("llama.context_length", (True, BOOL), "must be an integer"),
    ("tokenizer.ggml.model", (3, U32), "must be a string"),
    ("tokenizer.ggml.tokens", (np.arange(N_TOKENS, dtype=np.int32), ValueType.ARRAY), "array of strings"),
    ("tokenizer.ggml.tokens", ([np.array([1, 2], np.int32)] * N_TOKENS, ValueType.ARRAY, ValueType.ARRAY), "array of strings"),
    ("tokenizer.ggml.pre", (np.array([1], np.int32), ValueType.ARRAY), "must be a string"),  # was unhashable ndarray
    ("tokenizer.ggml.token_type", (["1"] * N_TOKENS, ValueType.ARRAY), "array of integers"),
    ("tokenizer.ggml.token_type", (np.full(N_TOKENS, 99, np.int32), ValueType.ARRAY), "above the maximum"),
    ("tokenizer.ggml.scores", (["0.5"] * N_TOKENS, ValueType.ARRAY), "array of numbers"),
    ("tokenizer.ggml.scores", (np.full(N_TOKENS, np.nan, np.float32), ValueType.ARRAY), "NaN"),
    ("tokenizer.ggml.bos_token_id", ("2", STR), "must be an integer"),
    ("tokenizer.ggml.eos_token_id", (100_000, U32), "outside the 384-token vocabulary"),
    ("tokenizer.ggml.add_bos_token", ("yes", STR), "must be a boolean"),
    ("tokenizer.chat_template", (5, U32), "must be a string"),
]


@pytest.mark.parametrize("key, change, says", BAD_VALUES, ids=[f"{k}={i}" for i, (k, _, _) in enumerate(BAD_VALUES)])
def test_bad_metadata_is_a_gguf_error_naming_the_key(tmp_path, tiny_llama, key, change, says):
    path = rewrite(tiny_llama, tmp_path / "bad.gguf", {key: change})
    with pytest.raises(GGUFError) as caught:
        localllm.load(path, n_ctx=64, threads=1)
    message = str(caught.value)
    assert says in message and len(message.splitlines()) == 1, message
    assert f"'{key}'" in message or key.rsplit(".", 1)[-1] in message, message


def test_gemma_sliding_window_is_checked(tmp_path, tiny_gemma):
    path = rewrite(tiny_gemma, tmp_path / "bad.gguf", {"gemma3.attention.sliding_window": ("5", STR)})
    with pytest.raises(GGUFError, match="gemma3.attention.sliding_window.*must be an integer"):
        localllm.load(path, n_ctx=64, threads=1)


def test_a_byte_token_that_is_not_hex_is_refused_at_load(tmp_path, tiny_llama):
    with GGUFReader(tiny_llama) as reader:
        tokens = list(reader.metadata["tokenizer.ggml.tokens"])
    assert tokens[4] == "<0x00>"
    tokens[4] = "zz"  # still typed BYTE: decoding it used to raise ValueError (int('zz', 16))
    path = rewrite(tiny_llama, tmp_path / "bad.gguf", {"tokenizer.ggml.tokens": (tokens, ValueType.ARRAY)})
    with pytest.raises(GGUFError, match="token 4 has type BYTE"):
        localllm.load(path, n_ctx=64, threads=1)


def test_per_layer_head_counts_still_load(tmp_path, tiny_llama):
    """Files that store head counts per layer (an integer array) keep loading, as before."""
    path = rewrite(tiny_llama, tmp_path / "ok.gguf", {"llama.attention.head_count_kv": (np.array([2, 2], np.int32), ValueType.ARRAY)})
    model = localllm.load(path, n_ctx=64, threads=1)
    assert model.decoder.hp.n_head_kv == 2


def test_the_cli_says_one_line(tmp_path, tiny_llama, capsys):
    path = rewrite(tiny_llama, tmp_path / "bad.gguf", {"llama.attention.head_count": (0, U32)})
    code = main(["run", path, "hello", "-n", "1"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: ") and "unexpected" not in err and "llama.attention.head_count" in err


def test_control_characters_in_a_quoted_key_stay_on_one_line(tmp_path):
    meta = Metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.pre\n\x1b[31m": 1}, tmp_path / "x")
    with pytest.raises(GGUFError) as caught:
        meta.get_str("tokenizer.ggml.pre\n\x1b[31m")
    assert "\n" not in str(caught.value) and "\x1b" not in str(caught.value)
    assert "\\n\\x1b[31m" in str(caught.value)


def test_plain_mappings_are_checked_too():
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.scores": [0.0, "x"]}
    with pytest.raises(GGUFError, match="tokenizer.ggml.scores.*array of numbers"):
        Tokenizer.from_metadata(meta)


@pytest.mark.parametrize("key, change", [
    ("llama.attention.head_count", ("four", STR)),  # was: unexpected ValueError: invalid literal for int()
    ("general.file_type", (np.array([1], np.int32), ValueType.ARRAY)),  # was: unexpected TypeError: unhashable
])
def test_show_names_the_bad_key_on_one_line(tmp_path, tiny_llama, capsys, key, change):
    path = rewrite(tiny_llama, tmp_path / "bad.gguf", {key: change})
    code = main(["show", path])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "unexpected" not in err
    assert f"metadata key '{key}'" in err


def test_perplexity_checks_the_trained_context_as_load_does(tmp_path, tiny_llama, capsys):
    path = rewrite(tiny_llama, tmp_path / "bad.gguf", {"llama.context_length": ("long", STR)})
    (tmp_path / "t.txt").write_text("some text to measure " * 20)
    code = main(["perplexity", path, "--file", str(tmp_path / "t.txt"), "--ctx", "64"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "unexpected" not in err  # was: ValueError from int()
    assert "metadata key 'llama.context_length': must be an integer" in err
