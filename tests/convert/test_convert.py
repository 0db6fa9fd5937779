"""Hugging Face checkpoint -> GGUF conversion.

Each test writes a tiny random checkpoint the way transformers lays one out (config.json, safetensors
with HF tensor names, a byte-level BPE tokenizer.json trained with the `tokenizers` library,
tokenizer_config.json with a chat template), converts it, loads it with `localllm.load` and compares
the engine's logits with a float64 forward pass written here in HF conventions on the ORIGINAL weights:
rotate_half RoPE on un-permuted Q/K, Gemma's (1 + w) norms, HF's llama3 inv_freq rule. None of it
uses the converter, so a wrong permutation or norm offset in the converter shows up as a mismatch.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import localllm
from localllm.convert import ConversionError, convert_checkpoint
from localllm.gguf import GGUFReader

LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024 and we've got 12345 apples!",
    "A tiny model reads tiny texts; the converter writes what llama.cpp writes.",
    "Hello world, hello tokens: merges, vocab, pre-tokenizers and special tokens.",
] * 20
SAMPLE = "The lazy fox's 2024 apples: hello world!"
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"

FAMILIES = {
    # name: (HF architecture, specials, bos, eos, split regex, add_bos)
    "llama": ("LlamaForCausalLM", ["<|begin_of_text|>", "<|end_of_text|>"], "<|begin_of_text|>", "<|end_of_text|>", LLAMA3_SPLIT, True),
    "qwen2": ("Qwen2ForCausalLM", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", QWEN2_SPLIT, False),
    "qwen3": ("Qwen3ForCausalLM", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", QWEN2_SPLIT, False),
    "gemma3": ("Gemma3ForCausalLM", ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>", LLAMA3_SPLIT, True),
}
HIDDEN, N_HEAD, N_KV, FF = 64, 4, 2, 96
VOCAB_TRAIN = 300


# -- the checkpoint ------------------------------------------------------------------------------------
def build_tokenizer(family: str) -> Tokenizer:
    _, specials, bos, _, split, add_bos = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_TRAIN, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    if add_bos:
        bos_id = tok.token_to_id(bos)
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])
    return tok


def config_for(family: str, n_vocab: int, **extra) -> dict:
    arch = FAMILIES[family][0]
    cfg = {
        "architectures": [arch], "model_type": family, "hidden_size": HIDDEN, "intermediate_size": FF,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_KV, "num_hidden_layers": 2,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": n_vocab,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
    }
    if family == "llama":
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 64}
    if family == "qwen2":
        cfg.update(tie_word_embeddings=True)
    if family == "qwen3":
        cfg.update(head_dim=32, attention_bias=False)  # head_dim != hidden / heads, as in real Qwen3
    if family == "gemma3":
        cfg.update(num_hidden_layers=6, head_dim=16, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=16,
                   sliding_window=4, sliding_window_pattern=6, rope_theta=1_000_000.0, rope_local_base_freq=10000.0,
                   rope_scaling={"rope_type": "linear", "factor": 8.0}, final_logit_softcapping=None,
                   attn_logit_softcapping=None, tie_word_embeddings=True)
        cfg.pop("hidden_act")
    cfg.update(extra)
    return cfg


def hf_weights(cfg: dict, family: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights with HF names and shapes ([out, in] for Linear)."""
    rng = np.random.default_rng(seed)
    e, n_layer = cfg["hidden_size"], cfg["num_hidden_layers"]
    d = cfg.get("head_dim", e // cfg["num_attention_heads"])
    q_out, kv_out = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    gemma = family == "gemma3"

    def norm(n):  # Gemma stores w with the model computing (1 + w): values near 0; others near 1
        return (rng.normal(0, 0.2, n) + (0.0 if gemma else 1.0)).astype(np.float32)

    def mat(o, i, std=0.15):
        return rng.normal(0, std, (o, i)).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(cfg["vocab_size"] + (8 if gemma else 0), e, 0.05 if gemma else 0.5),
         "model.norm.weight": norm(e)}
    if not cfg.get("tie_word_embeddings"):
        w["lm_head.weight"] = mat(cfg["vocab_size"], e, 0.2)
    for il in range(n_layer):
        p = f"model.layers.{il}."
        w[p + "input_layernorm.weight"] = norm(e)
        w[p + "self_attn.q_proj.weight"] = mat(q_out, e)
        w[p + "self_attn.k_proj.weight"] = mat(kv_out, e)
        w[p + "self_attn.v_proj.weight"] = mat(kv_out, e)
        w[p + "self_attn.o_proj.weight"] = mat(e, q_out)
        w[p + "post_attention_layernorm.weight"] = norm(e)
        w[p + "mlp.gate_proj.weight"] = mat(cfg["intermediate_size"], e)
        w[p + "mlp.up_proj.weight"] = mat(cfg["intermediate_size"], e)
        w[p + "mlp.down_proj.weight"] = mat(e, cfg["intermediate_size"])
        if family == "qwen2":
            for name, n in (("q", q_out), ("k", kv_out), ("v", kv_out)):
                w[p + f"self_attn.{name}_proj.bias"] = rng.normal(0, 0.5, n).astype(np.float32)
        if family in ("qwen3", "gemma3"):
            w[p + "self_attn.q_norm.weight"] = norm(d)
            w[p + "self_attn.k_norm.weight"] = norm(d)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = norm(e)
            w[p + "post_feedforward_layernorm.weight"] = norm(e)
    w["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.zeros(d // 2, np.float32)  # dropped, as llama.cpp does
    return w


def save_bf16(path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file with BF16 tensors, laid out by hand (NumPy and safetensors.numpy have no bf16)."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        words = (arr.astype(np.float32).view(np.uint32) >> 16).astype("<u2")  # truncation: exact bf16 values
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [offset, offset + words.nbytes]}
        blobs.append(words.tobytes())
        offset += words.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def bf16_round(arr: np.ndarray) -> np.ndarray:
    return ((arr.astype(np.float32).view(np.uint32) >> 16) << 16).view(np.float32)


def write_checkpoint(root, family: str, bf16: bool = False, n_tok: int | None = None, **cfg_extra):
    """A model directory; returns (path, config, weights as the model computes with them, HF tokenizer).
    `n_tok`: the size of a tokenizer the caller puts in place of the BPE one."""
    tok = build_tokenizer(family)
    n_tok = n_tok or tok.get_vocab_size()
    n_vocab = n_tok if family == "gemma3" else n_tok + 12  # llama/qwen: padded vocab rows, as Qwen ships
    cfg = config_for(family, n_vocab, **cfg_extra)
    weights = hf_weights(cfg, family)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg))
    tok.save(str(root / "tokenizer.json"))
    _, _, bos, eos, _, add_bos = FAMILIES[family]
    tc = {"eos_token": eos, "chat_template": TEMPLATE, "add_bos_token": add_bos}
    if bos:
        tc["bos_token"] = bos
    (root / "tokenizer_config.json").write_text(json.dumps(tc))
    if bf16:
        save_bf16(root / "model.safetensors", weights)
        weights = {k: bf16_round(v) for k, v in weights.items()}
    else:  # two shards and an index, as large checkpoints come
        names = sorted(weights)
        half = {"a": names[: len(names) // 2], "b": names[len(names) // 2:]}
        index = {}
        for part, keys in half.items():
            fname = f"model-0000{'1' if part == 'a' else '2'}-of-00002.safetensors"
            save_file({k: weights[k] for k in keys}, str(root / fname))
            index.update({k: fname for k in keys})
        (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    return root, cfg, weights, tok


# -- the float64 reference in HF conventions ---------------------------------------------------------------
def hf_inv_freq(cfg: dict, d: int, base: float, scaling: dict | None) -> np.ndarray:
    inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if not scaling:
        return inv
    if scaling["rope_type"] == "linear":
        return inv / scaling["factor"]
    # transformers' _compute_llama3_parameters
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    out = np.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
    return np.where(medium, smoothed, out)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def hf_rope(x, positions, inv):
    ang = positions[:, None] * inv[None, :]
    emb = np.concatenate([ang, ang], axis=-1)[:, None, :]
    return x * np.cos(emb) + rotate_half(x) * np.sin(emb)


def hf_forward(cfg: dict, family: str, w: dict, tokens) -> np.ndarray:
    w = {k: v.astype(np.float64) for k, v in w.items()}
    gemma = family == "gemma3"
    e, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim", e // nh)
    eps = cfg["rms_norm_eps"]

    def norm(x, weight):
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return y * (1.0 + weight) if gemma else y * weight

    t = len(tokens)
    pos = np.arange(t, dtype=np.float64)
    x = w["model.embed_tokens.weight"][np.asarray(tokens)]
    if gemma:
        x = x * math.sqrt(e)
    for il in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{il}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        if family == "qwen2":
            q, k, v = (a + w[p + f"self_attn.{n}_proj.bias"] for a, n in zip((q, k, v), "qkv"))
        q, k, v = q.reshape(t, nh, d), k.reshape(t, nkv, d), v.reshape(t, nkv, d)
        if family in ("qwen3", "gemma3"):
            q, k = norm(q, w[p + "self_attn.q_norm.weight"]), norm(k, w[p + "self_attn.k_norm.weight"])
        sliding = gemma and (il + 1) % cfg["sliding_window_pattern"] != 0
        if sliding:
            inv = hf_inv_freq(cfg, d, cfg["rope_local_base_freq"], None)
        else:
            inv = hf_inv_freq(cfg, d, cfg["rope_theta"], cfg.get("rope_scaling"))
        q, k = hf_rope(q, pos, inv), hf_rope(k, pos, inv)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        scale = cfg["query_pre_attn_scalar"] ** -0.5 if gemma else d ** -0.5
        scores = np.einsum("qhd,khd->hqk", q, k) * scale
        qi, ki = np.arange(t)[:, None], np.arange(t)[None, :]
        allowed = ki <= qi
        if sliding:
            allowed &= ki > qi - cfg["sliding_window"]
        scores = np.where(allowed[None], scores, -np.inf)
        prob = np.exp(scores - scores.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", prob, v).reshape(t, nh * d) @ w[p + "self_attn.o_proj.weight"].T
        if gemma:
            attn = norm(attn, w[p + "post_attention_layernorm.weight"])
            x = x + attn
            h = norm(x, w[p + "pre_feedforward_layernorm.weight"])
        else:
            x = x + attn
            h = norm(x, w[p + "post_attention_layernorm.weight"])
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        if gemma:
            act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
        else:
            act = g / (1 + np.exp(-g))
        f = (act * u) @ w[p + "mlp.down_proj.weight"].T
        x = x + (norm(f, w[p + "post_feedforward_layernorm.weight"]) if gemma else f)
    x = norm(x, w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


def engine_logits(path, tokens) -> np.ndarray:
    with localllm.load(path, n_ctx=64, threads=1) as model:
        return model.logits(tokens)


def assert_close(got: np.ndarray, want: np.ndarray, rel: float) -> None:
    n = min(got.shape[1], want.shape[1])  # gemma: the reference still has the rows the converter drops
    err = np.abs(got[:, :n] - want[:, :n]).max() / want.std()
    assert err < rel, f"max |engine - reference| = {err:.2e} x std(logits)"


# -- tests ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma3"])
def test_converted_logits_match_hf_reference(tmp_path, family):
    root, cfg, weights, tok = write_checkpoint(tmp_path / family, family)
    out = convert_checkpoint(root, tmp_path / f"{family}.gguf")
    tokens = tok.encode(SAMPLE).ids[:12]
    assert len(tokens) == 12  # past gemma's 4-token window, so a global layer sees more than local ones
    want = hf_forward(cfg, family, weights, tokens)
    got = engine_logits(out, tokens)
    assert got.shape == (12, cfg["vocab_size"] if family != "gemma3" else tok.get_vocab_size())
    # The engine keeps K/V in float16 (as llama.cpp): ~1e-3 relative; a wrong convention is O(1).
    assert_close(got, want, 2e-2)
    n = got.shape[1]
    assert np.array_equal(got.argmax(-1), want[:, :n].argmax(-1))


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_tokenizer_and_metadata_as_llama_cpp_writes_them(tmp_path, family):
    root, cfg, _, tok = write_checkpoint(tmp_path / family, family)
    out = convert_checkpoint(root, tmp_path / "m.gguf")
    arch = "gemma3" if family == "gemma3" else family
    with GGUFReader(out) as r:
        md = r.metadata
        assert md["general.architecture"] == arch
        assert md["general.file_type"] == 0
        assert md[f"{arch}.block_count"] == cfg["num_hidden_layers"]
        assert md[f"{arch}.embedding_length"] == HIDDEN and md[f"{arch}.feed_forward_length"] == FF
        assert md[f"{arch}.attention.head_count"] == N_HEAD and md[f"{arch}.attention.head_count_kv"] == N_KV
        assert md[f"{arch}.context_length"] == 128
        assert md[f"{arch}.rope.freq_base"] == cfg["rope_theta"]
        assert md["tokenizer.ggml.model"] == "gpt2"
        assert md["tokenizer.ggml.pre"] == ("qwen2" if family == "qwen2" else "llama-bpe")
        assert md["tokenizer.chat_template"] == TEMPLATE
        _, _, bos, eos, _, add_bos = FAMILIES[family]
        assert md["tokenizer.ggml.eos_token_id"] == tok.token_to_id(eos)
        if bos:
            assert md["tokenizer.ggml.bos_token_id"] == tok.token_to_id(bos)
        assert md["tokenizer.ggml.add_bos_token"] is add_bos
        tokens = md["tokenizer.ggml.tokens"]
        types = md["tokenizer.ggml.token_type"]
        n_tok = tok.get_vocab_size()
        assert tokens[:n_tok] == [tok.id_to_token(i) for i in range(n_tok)]
        assert all(types[tok.token_to_id(s)] == 3 for s in FAMILIES[family][1])  # CONTROL
        if family != "gemma3":  # padded to config vocab_size with unused [PAD<i>] tokens, as llama.cpp does
            assert tokens[n_tok:] == [f"[PAD{i}]" for i in range(n_tok, cfg["vocab_size"])]
            assert set(types[n_tok:]) == {5}
        if family == "llama":
            assert md["llama.rope.dimension_count"] == HIDDEN // N_HEAD
            assert "rope_freqs.weight" in r.tensors
        if family == "gemma3":
            assert md["gemma3.attention.sliding_window"] == 4
            assert md["gemma3.attention.key_length"] == 16
            assert md["gemma3.rope.scaling.type"] == "linear" and md["gemma3.rope.scaling.factor"] == 8.0
            assert r.tensors["token_embd.weight"].shape[1] == n_tok  # rows past the tokenizer dropped
        tied = cfg.get("tie_word_embeddings")
        assert ("output.weight" in r.tensors) is (not tied)
    # The GGUF vocabulary tokenizes like the HF tokenizer it came from (merges, pre-tokenizer, BOS).
    with localllm.load(out, n_ctx=32) as model:
        for text in (SAMPLE, "  spaces\n\nand 1234567 digits, it's ünïcödé 🦙"):
            assert model.tokenize(text) == tok.encode(text).ids


def test_qwen3_head_dim_written(tmp_path):
    root, *_ = write_checkpoint(tmp_path / "q3", "qwen3")
    with GGUFReader(convert_checkpoint(root, tmp_path / "q3.gguf")) as r:
        assert r.metadata["qwen3.attention.key_length"] == 32
        assert r.tensors["blk.0.attn_q.weight"].shape == (HIDDEN, N_HEAD * 32)
        assert r.tensors["blk.1.attn_k_norm.weight"].shape == (32,)


def test_without_qk_permutation_llama_logits_do_not_match(tmp_path, monkeypatch):
    """Negative control: the comparison above detects a converter that skips llama's Q/K permutation."""
    from localllm.convert import llama

    root, cfg, weights, tok = write_checkpoint(tmp_path / "llama", "llama")
    monkeypatch.setattr(llama.LlamaFamily, "transform", lambda self, name, data: data)
    out = convert_checkpoint(root, tmp_path / "bad.gguf")
    tokens = tok.encode(SAMPLE).ids[:12]
    want = hf_forward(cfg, "llama", weights, tokens)
    got = engine_logits(out, tokens)
    err = np.abs(got - want).max() / want.std()
    assert err > 0.2


def test_without_norm_offset_gemma_logits_do_not_match(tmp_path, monkeypatch):
    from localllm.convert import gemma3

    root, cfg, weights, tok = write_checkpoint(tmp_path / "g", "gemma3")
    monkeypatch.setattr(gemma3.Gemma3Family, "transform", lambda self, name, data: data)
    out = convert_checkpoint(root, tmp_path / "bad.gguf")
    tokens = tok.encode(SAMPLE).ids[:12]
    want = hf_forward(cfg, "gemma3", weights, tokens)
    got = engine_logits(out, tokens)
    err = np.abs(got - want[:, : got.shape[1]]).max() / want.std()
    assert err > 0.2


@pytest.mark.parametrize("out_type,matrix_type", [("F16", "F16"), ("BF16", "BF16")])
def test_half_precision_outputs(tmp_path, out_type, matrix_type):
    root, cfg, weights, tok = write_checkpoint(tmp_path / "q", "qwen2")
    out = convert_checkpoint(root, tmp_path / "half.gguf", out_type=out_type)
    with GGUFReader(out) as r:
        types = {name: t.ggml_type.name for name, t in r.tensors.items()}
        assert r.metadata["general.file_type"] == {"F16": 1, "BF16": 32}[out_type]
    assert types["blk.0.attn_q.weight"] == matrix_type and types["token_embd.weight"] == matrix_type
    assert types["blk.0.attn_norm.weight"] == "F32" and types["blk.0.attn_q.bias"] == "F32"
    tokens = tok.encode(SAMPLE).ids[:12]
    assert_close(engine_logits(out, tokens), hf_forward(cfg, "qwen2", weights, tokens), 6e-2)


def test_bf16_safetensors_input(tmp_path):
    root, cfg, weights, tok = write_checkpoint(tmp_path / "b", "llama", bf16=True)
    out = convert_checkpoint(root, tmp_path / "b.gguf", out_type="BF16")
    tokens = tok.encode(SAMPLE).ids[:12]
    # bf16 -> bf16 is bit-exact; the reference runs on the same (bf16-valued) weights
    assert_close(engine_logits(out, tokens), hf_forward(cfg, "llama", weights, tokens), 2e-2)
    with GGUFReader(out) as r:
        raw = np.asarray(r.tensor_array("blk.0.attn_v.weight")).view(np.uint16).reshape(-1)
    want = (weights["model.layers.0.self_attn.v_proj.weight"].view(np.uint32) >> 16).astype(np.uint16).reshape(-1)
    assert np.array_equal(raw, want)  # V is not permuted: the stored bits are the checkpoint's


@pytest.mark.parametrize("change,message", [
    ({"architectures": ["BertModel"]}, "not supported"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
])
def test_unsupported_configs_are_refused(tmp_path, change, message):
    root, *_ = write_checkpoint(tmp_path / "m", "llama", **change)
    with pytest.raises(ConversionError, match=message):
        convert_checkpoint(root, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no spill or partial file left behind


def test_gemma3_settings_the_engine_does_not_have_are_refused(tmp_path):
    root, *_ = write_checkpoint(tmp_path / "g", "gemma3", sliding_window_pattern=4)
    with pytest.raises(ConversionError, match="sliding_window_pattern"):
        convert_checkpoint(root, tmp_path / "x.gguf")


def test_missing_pieces_are_reported(tmp_path):
    with pytest.raises(ConversionError, match="config.json"):
        convert_checkpoint(tmp_path, tmp_path / "x.gguf")
    root, *_ = write_checkpoint(tmp_path / "m", "qwen2")
    (root / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ConversionError, match="missing"):
        convert_checkpoint(root, tmp_path / "x.gguf")
    with pytest.raises(ConversionError, match="output type"):
        convert_checkpoint(root, tmp_path / "x.gguf", out_type="Q4_K")


def train_sentencepiece(vocab_size: int = 340, dummy_prefix: bool = False) -> bytes:
    """A BPE SentencePiece model laid out like Gemma's (pad 0, eos 1, bos 2, unk 3, byte fallback; Gemma 3
    has no dummy prefix, Llama 2 has one)."""
    import io

    import sentencepiece

    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=out, vocab_size=vocab_size, model_type="bpe", byte_fallback=True,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
        add_dummy_prefix=dummy_prefix, normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        minloglevel=2,
    )
    return out.getvalue()


@pytest.mark.parametrize("family", ["gemma3", "llama"])
def test_sentencepiece_tokenizer_model(tmp_path, family):
    """Gemma 3 / Llama 2 with only tokenizer.model: the protobuf is read without the sentencepiece
    package; the GGUF vocabulary must tokenize as sentencepiece itself does (Llama 2's dummy-prefix space
    included), and the logits still match."""
    import sentencepiece

    llama = family == "llama"
    proto = train_sentencepiece(dummy_prefix=llama)
    sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
    extra = {"rope_scaling": None} if llama else {}
    # ids from config.json (as llama.cpp reads them); Gemma's eos_token_id is a list there, so its EOS id
    # comes from tokenizer_config.json's eos_token, found among the pieces
    ids = {"bos_token_id": 2, "eos_token_id": [1, 5] if not llama else 1, "pad_token_id": 0}
    root, cfg, weights, _ = write_checkpoint(tmp_path / "g", family, n_tok=sp.vocab_size(), **extra, **ids)
    (root / "tokenizer.json").unlink()
    (root / "tokenizer.model").write_bytes(proto)
    tc = json.loads((root / "tokenizer_config.json").read_text())
    tc.update(bos_token="<s>", eos_token="</s>")
    tc["added_tokens_decoder"] = {"4": {"content": "<start_of_turn>", "special": True}, "5": {"content": "<end_of_turn>", "special": True}}
    (root / "tokenizer_config.json").write_text(json.dumps(tc))
    out = convert_checkpoint(root, tmp_path / "g.gguf")
    n = sp.vocab_size()
    with GGUFReader(out) as r:
        md = r.metadata
        assert md["tokenizer.ggml.model"] == "llama" and md["tokenizer.ggml.add_space_prefix"] is llama
        assert md["tokenizer.ggml.tokens"][:n] == [sp.id_to_piece(i) for i in range(n)]
        assert np.allclose(md["tokenizer.ggml.scores"][6:n], [sp.get_score(i) for i in range(6, n)])
        types = md["tokenizer.ggml.token_type"]
        assert [types[i] for i in range(6)] == [3, 3, 3, 2, 3, 3]  # pad, eos, bos control; unk; turn markers
        assert set(types[6:262]) == {6} and set(types[262:n]) == {1}  # byte pieces, then normal pieces
        assert set(types[n:]) <= {5}  # llama: padded to config.json's vocab_size with unused tokens
        assert (md["tokenizer.ggml.bos_token_id"], md["tokenizer.ggml.eos_token_id"], md["tokenizer.ggml.padding_token_id"]) == (2, 1, 0)
    texts = [SAMPLE, "hello  world\n\nthe fox 31415 ünïcödé 🦙"]
    with localllm.load(out, n_ctx=64) as model:
        for text in texts:
            assert model.tokenize(text) == [2] + sp.encode(text)
        tokens = model.tokenize(SAMPLE)[:12]
        assert_close(model.logits(tokens), hf_forward(cfg, family, weights, tokens), 2e-2)


def test_cli_convert(tmp_path, capsys):
    from localllm.cli.app import main

    root, *_ = write_checkpoint(tmp_path / "q", "qwen3")
    assert main(["convert", str(root), str(tmp_path / "q.gguf"), "--outtype", "f16"]) == 0
    assert "wrote" in capsys.readouterr().out
    with GGUFReader(tmp_path / "q.gguf") as r:
        assert r.tensors["blk.0.ffn_up.weight"].ggml_type.name == "F16"
    assert main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_quantize_straight_from_a_checkpoint_directory(tmp_path, capsys):
    """`localllm quantize DIR OUT --int8` converts and quantizes in one step (like mlx_lm.convert -q):
    the matrices come out Q8_0, the temporary F32 file is gone, and the logits stay near the HF reference
    (Q8_0 rounds weights and activations to 8 bits: measured ~0.1 x std on this random model; a wrong
    conversion is O(1), see the negative controls above)."""
    from localllm.cli.app import main

    root, cfg, weights, tok = write_checkpoint(tmp_path / "llama", "llama")
    out = tmp_path / "out" / "llama-q8_0.gguf"
    out.parent.mkdir()
    assert main(["quantize", str(root), str(out), "--int8"]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.parent.iterdir()) == ["llama-q8_0.gguf"]
    with GGUFReader(out) as r:
        assert r.tensors["blk.0.attn_q.weight"].ggml_type.name == "Q8_0"
        assert r.tensors["blk.0.attn_norm.weight"].ggml_type.name == "F32"
    tokens = tok.encode(SAMPLE).ids[:12]
    assert_close(engine_logits(out, tokens), hf_forward(cfg, "llama", weights, tokens), 0.3)


def test_cli_convert_refuses_to_overwrite_without_force(tmp_path, capsys):
    """convert used to replace an existing OUTPUT silently; now, as quantize, only with --force."""
    from localllm.cli.app import main

    root, *_ = write_checkpoint(tmp_path / "q", "qwen3")
    out = tmp_path / "q.gguf"
    out.write_bytes(b"keep me")
    assert main(["convert", str(root), str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--force" in err and len(err.strip().splitlines()) == 1
    assert out.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q", "q.gguf"]  # no partial file either
    assert main(["convert", str(root), str(out), "--force"]) == 0
    with GGUFReader(out) as r:
        assert r.architecture == "qwen3"


def test_cli_convert_into_a_missing_directory_is_an_error(tmp_path, capsys):
    from localllm.cli.app import main

    root, *_ = write_checkpoint(tmp_path / "q", "qwen3")
    assert main(["convert", str(root), str(tmp_path / "no" / "such" / "q.gguf")]) == 1
    err = capsys.readouterr().err
    assert err == f"error: no such directory: {tmp_path / 'no' / 'such'}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]  # no directory created
