"""Fuzzing the whole load path (issue 25, point 8): a tiny valid model written by our writer, its header
bytes flipped, cut or grown, or its metadata values replaced by values of other types and ranges, then
`localllm.load` and, when it loads, one forward step. Every outcome is a loaded model that computes, or a
typed LocalLLMError (GGUFError, TensorError, TokenizerError ...) whose message is one line.

Derandomized and bounded (max_examples) so that CI runs the same cases every time: measured 3.4 s for
the three tests with the kernels cached, 7.6 s from empty Numba and kernel caches (2-core machine).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import localllm
from localllm.errors import LocalLLMError
from localllm.gguf import GGUFReader, GGUFWriter, ValueType

N_EMBD, N_HEAD, N_KV, HEAD_DIM, N_FF, N_LAYER = 32, 2, 1, 16, 64, 1
FUZZ = settings(
    max_examples=400, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _write_model(path: Path) -> None:
    """A one-layer llama with a 300-token SentencePiece vocabulary (the 256 byte tokens included)."""
    rng = np.random.default_rng(0)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [f"\u2581w{i}" for i in range(41)]
    types = [2, 3, 3] + [6] * 256 + [1] * 41
    w = GGUFWriter(path)
    w.add("general.architecture", "llama")
    w.add("general.name", "fuzz")
    for key, value in {
        "context_length": 64, "embedding_length": N_EMBD, "block_count": N_LAYER, "feed_forward_length": N_FF,
        "attention.head_count": N_HEAD, "attention.head_count_kv": N_KV, "attention.key_length": HEAD_DIM,
        "rope.dimension_count": HEAD_DIM,
    }.items():
        w.add(f"llama.{key}", value, ValueType.UINT32)
    w.add("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add("llama.rope.freq_base", 10000.0)
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.scores", np.linspace(0, -1, len(tokens), dtype=np.float32))
    w.add("tokenizer.ggml.token_type", np.array(types, np.int32))
    w.add("tokenizer.ggml.bos_token_id", 1, ValueType.UINT32)
    w.add("tokenizer.ggml.eos_token_id", 2, ValueType.UINT32)
    w.add("tokenizer.ggml.unknown_token_id", 0, ValueType.UINT32)
    w.add("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}")

    def matrix(name, n_in, n_out):
        w.add_tensor(name, rng.normal(0, 0.1, (n_out, n_in)).astype(np.float32))

    def vector(name, n):
        w.add_tensor(name, (1 + rng.normal(0, 0.1, n)).astype(np.float32))

    matrix("token_embd.weight", N_EMBD, len(tokens))
    vector("output_norm.weight", N_EMBD)
    matrix("output.weight", N_EMBD, len(tokens))
    for il in range(N_LAYER):
        p = f"blk.{il}."
        vector(p + "attn_norm.weight", N_EMBD)
        matrix(p + "attn_q.weight", N_EMBD, N_HEAD * HEAD_DIM)
        matrix(p + "attn_k.weight", N_EMBD, N_KV * HEAD_DIM)
        matrix(p + "attn_v.weight", N_EMBD, N_KV * HEAD_DIM)
        matrix(p + "attn_output.weight", N_HEAD * HEAD_DIM, N_EMBD)
        vector(p + "ffn_norm.weight", N_EMBD)
        matrix(p + "ffn_gate.weight", N_EMBD, N_FF)
        matrix(p + "ffn_up.weight", N_EMBD, N_FF)
        matrix(p + "ffn_down.weight", N_FF, N_EMBD)
    w.write()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(path, file bytes, header length, metadata with value types) of the valid model."""
    path = tmp_path_factory.mktemp("fuzz") / "base.gguf"
    _write_model(path)
    with GGUFReader(path) as reader:
        header_len = reader.data_offset
        meta = {key: (value, *reader.value_types[key]) for key, value in reader.metadata.items()}
        tensors = {i.name: (reader.tensor_bytes(i.name).copy(), i.ggml_type.name, i.shape) for i in reader.tensors.values()}
    return path, path.read_bytes(), header_len, meta, tensors


def _outcome(path) -> str:
    """'loaded' or 'refused'; anything else (an untyped exception, a multi-line message) fails the test."""
    try:
        model = localllm.load(path, n_ctx=16, threads=1)
    except LocalLLMError as exc:
        message = str(exc)
        assert message and len(message.splitlines()) == 1 and "\n" not in message, repr(message)
        return "refused"
    try:
        ids = model.tokenize("w1 w2")
        logits = model.logits(ids[:2] or [0])
        assert logits.shape == (len(ids[:2] or [0]), model.decoder.hp.n_vocab)
        model.chat_template  # the template text compiles or raises TemplateError (a LocalLLMError)
    except LocalLLMError as exc:
        assert len(str(exc).splitlines()) == 1, repr(str(exc))
    finally:
        model.close()
    return "loaded"


def test_the_unmutated_model_loads_and_computes(base):
    assert _outcome(base[0]) == "loaded"


# -- bytes of the header ---------------------------------------------------------------------------------


@st.composite
def mutated_bytes(draw, blob: bytes, header_len: int) -> bytes:
    data = bytearray(blob)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        pos = draw(st.integers(0, header_len - 1))
        if kind == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[pos] = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF, draw(st.integers(0, 255))]))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[pos : pos + draw(st.integers(1, 16))]
    if draw(st.integers(0, 4)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@FUZZ
@given(data=st.data())
def test_mutated_header_bytes_load_or_raise_a_one_line_typed_error(base, data):
    path, blob, header_len, _, _ = base
    mutated = data.draw(mutated_bytes(blob, header_len))
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "m.gguf"
        target.write_bytes(mutated)
        _outcome(target)


# -- metadata values ---------------------------------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(["", "llama", "gpt2", "\n\x1b[31m", "-1", "nan"])
_INTS = st.sampled_from([0, 1, -1, 2, 3, 16, 17, 64, 300, 2**31 - 1, 2**32 - 1, 2**40, -(2**63)])
_FLOATS = st.sampled_from([0.0, -0.0, 1e-5, -1.0, 1.0, 1e30, math.nan, math.inf, -math.inf])
# (value, value type, element type)
_VALUES = st.one_of(
    _INTS.map(lambda v: (v, ValueType.INT64 if v < 0 else ValueType.UINT64, None)),
    _INTS.filter(lambda v: 0 <= v < 2**32).map(lambda v: (v, ValueType.UINT32, None)),
    _FLOATS.map(lambda v: (v, ValueType.FLOAT32, None)),
    st.booleans().map(lambda v: (v, ValueType.BOOL, None)),
    _TEXT.map(lambda v: (v, ValueType.STRING, None)),
    st.lists(_INTS.filter(lambda v: -(2**31) <= v < 2**31), max_size=400).map(
        lambda v: (np.array(v, np.int32), ValueType.ARRAY, ValueType.INT32)),
    st.lists(_FLOATS, max_size=400).map(lambda v: (np.array(v, np.float32), ValueType.ARRAY, ValueType.FLOAT32)),
    st.lists(_TEXT, max_size=300).map(lambda v: (v, ValueType.ARRAY, ValueType.STRING)),
    st.just(([np.array([1, 2], np.int32)] * 3, ValueType.ARRAY, ValueType.ARRAY)),
    st.just(None),  # the key removed
)


def _rewrite(path: Path, meta: dict, tensors: dict, changes: dict) -> None:
    w = GGUFWriter(path)
    for key, (value, vtype, elem) in meta.items():
        if key in changes:
            if changes[key] is None:
                continue
            value, vtype, elem = changes[key]
        w.add(key, value, vtype, elem)
    for name, (data, ggml_type, shape) in tensors.items():
        w.add_tensor(name, data, ggml_type, shape=shape)
    w.write()


@FUZZ
@given(data=st.data())
def test_metadata_of_wrong_types_and_ranges_loads_or_raises_a_one_line_typed_error(base, data):
    _, _, _, meta, tensors = base
    keys = sorted(k for k in meta if k != "general.alignment")
    chosen = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True))
    changes = {key: data.draw(_VALUES) for key in chosen}
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "m.gguf"
        _rewrite(target, meta, tensors, changes)
        _outcome(target)
