"""`localllm quantize`: llama.cpp's mixes, the IQ4 quantizers against ggml's C code, the CLI, and the
Gemma 3 270M round trip (F32 -> Q8_0 / Q4_K_M, both load and generate).

Expected tensor types are derived by hand from llama.cpp's rules (src/llama-quant.cpp); each test names
the rule. The real Gemma Q4_K_M file is an independent oracle: llama-quantize chose its tensor types.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import gguf
import numpy as np
import pytest

import localllm
from localllm.cli.app import main
from localllm.gguf import GGUFReader
from localllm.quant import iq4_nl, iq4_xs
from localllm.quantize import QuantizeError, choose_types, dry_run, quantize_file
from localllm.quantize.recipes import ModelShape, TensorSpec
from tiny_models import write_tiny_model

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "quantize")


# -- recipes ------------------------------------------------------------------------------------------------

LLAMA_8B = ModelShape("llama", n_layer=32, n_head=32, n_head_kv=8)  # GQA 4


def llama_8b_tensors() -> list[TensorSpec]:
    """Llama 3 8B's tensor list (ggml-order shapes), as convert_hf_to_gguf writes it (F16 matrices)."""
    specs = [TensorSpec("token_embd.weight", (4096, 128256), "F16"), TensorSpec("rope_freqs.weight", (64,), "F32")]
    for i in range(32):
        for name, shape in (
            ("attn_norm", (4096,)), ("attn_q", (4096, 4096)), ("attn_k", (4096, 1024)), ("attn_v", (4096, 1024)),
            ("attn_output", (4096, 4096)), ("ffn_norm", (4096,)), ("ffn_gate", (4096, 14336)),
            ("ffn_up", (4096, 14336)), ("ffn_down", (14336, 4096)),
        ):
            specs.append(TensorSpec(f"blk.{i}.{name}.weight", shape, "F32" if len(shape) == 1 else "F16"))
    specs += [TensorSpec("output_norm.weight", (4096,), "F32"), TensorSpec("output.weight", (4096, 128256), "F16")]
    return specs


# use_more_bits(i, 32): i < 32/8 or i >= 7*32/8 or (i - 32/8) % 3 == 2
MORE_BITS_32 = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}


def llama_types(file_type, **options) -> dict[str, str]:
    specs = llama_8b_tensors()
    return dict(zip((s.name for s in specs), choose_types(specs, file_type, LLAMA_8B, **options)))


def layer_types(types, part):
    return [types[f"blk.{i}.{part}.weight"] for i in range(32)]


def test_llama_8b_q4_k_m():
    types = llama_types("Q4_K_M")
    # attn_v and ffn_down: Q6_K where use_more_bits(layer, 32), Q4_K elsewhere
    expected = ["Q6_K" if i in MORE_BITS_32 else "Q4_K" for i in range(32)]
    assert layer_types(types, "attn_v") == expected
    assert layer_types(types, "ffn_down") == expected
    # output.weight: Q6_K (4096 % 256 == 0); token_embd (not tied) keeps the default Q4_K
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    for part in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
        assert set(layer_types(types, part)) == {"Q4_K"}
    # 1-D tensors (norms, rope_freqs) are never quantized
    assert {types[n] for n in types if "norm" in n or "rope" in n} == {"F32"}
    # the published Llama 3 8B Q4_K_M census: 33 Q6_K (16 attn_v + 16 ffn_down + output), 193 Q4_K
    census = Counter(types.values())
    assert census["Q6_K"] == 33 and census["Q4_K"] == 193


def test_llama_8b_other_mixes():
    q4s = llama_types("Q4_K_S")  # attn_v: Q5_K for i_attention_wv < 4; ffn_down: Q5_K for layer < 32/8
    assert layer_types(q4s, "attn_v") == ["Q5_K"] * 4 + ["Q4_K"] * 28
    assert layer_types(q4s, "ffn_down") == ["Q5_K"] * 4 + ["Q4_K"] * 28
    q3m = llama_types("Q3_K_M")  # attn_v Q5_K for the first 2; ffn_down Q5_K below 32/16, Q4_K above (not Falcon)
    assert layer_types(q3m, "attn_v") == ["Q5_K"] * 2 + ["Q4_K"] * 30
    assert layer_types(q3m, "ffn_down") == ["Q5_K"] * 2 + ["Q4_K"] * 30
    assert set(layer_types(q3m, "attn_output")) == {"Q4_K"} and set(layer_types(q3m, "attn_q")) == {"Q3_K"}
    q2 = llama_types("Q2_K")  # attn_v Q4_K (GQA >= 4), ffn_down Q3_K, attn_output Q3_K, output Q6_K
    assert set(layer_types(q2, "attn_v")) == {"Q4_K"} and set(layer_types(q2, "ffn_down")) == {"Q3_K"}
    assert set(layer_types(q2, "attn_output")) == {"Q3_K"} and q2["output.weight"] == "Q6_K"
    assert q2["token_embd.weight"] == "Q2_K"
    xs = llama_types("IQ4_XS")  # attn_v Q5_K (GQA >= 4); ffn_down Q5_K below 32/8 (no imatrix)
    assert set(layer_types(xs, "attn_v")) == {"Q5_K"}
    assert layer_types(xs, "ffn_down") == ["Q5_K"] * 4 + ["IQ4_XS"] * 28
    q8 = llama_types("Q8_0")  # output: stays Q8_0 for the Q8_0 file type
    assert {t for n, t in q8.items() if "norm" not in n and "rope" not in n} == {"Q8_0"}
    f16 = llama_types("F16")  # unquantized file types: every quantizable tensor gets it, output included
    assert f16["output.weight"] == "F16" and f16["blk.0.attn_norm.weight"] == "F32"


def test_llama_8b_options():
    pure = llama_types("Q4_K_M", pure=True)  # --pure: the base type everywhere, output included
    assert {t for n, t in pure.items() if "norm" not in n and "rope" not in n} == {"Q4_K"}
    custom = llama_types("Q4_K_M", output_type="Q8_0", token_embedding_type="Q6_K")
    assert custom["output.weight"] == "Q8_0" and custom["token_embd.weight"] == "Q6_K"


def test_fallbacks_for_rows_that_do_not_split_into_256():
    model = ModelShape("llama", n_layer=1, n_head=4, n_head_kv=4)
    specs = [
        TensorSpec("token_embd.weight", (640, 1000), "F32"),  # tied: output rule, 640 % 256 -> Q8_0
        TensorSpec("blk.0.attn_q.weight", (640, 640), "F32"),  # Q4_K -> Q5_0
        TensorSpec("blk.0.attn_v.weight", (96, 640), "F32"),  # use_more_bits(0, 1): Q6_K -> Q8_0
        TensorSpec("blk.0.ffn_up.weight", (40, 640), "F32"),  # Q4_K -> Q5_0 does not fit 40 either -> F16
        TensorSpec("blk.0.ffn_down.weight", (512, 640), "F32"),  # fits: use_more_bits -> Q6_K
    ]
    assert choose_types(specs, "Q4_K_M", model) == ["Q8_0", "Q5_0", "Q8_0", "F16", "Q6_K"]
    assert choose_types(specs, "Q5_K_S", model)[1] == "Q5_1"  # Q5_K -> Q5_1
    assert choose_types(specs, "IQ4_XS", model)[1] == "IQ4_NL"  # IQ4_XS -> IQ4_NL


def test_gemma_q4_k_m_plan_equals_llama_cpp_file(gemma_path):
    """llama-quantize chose the shipped file's types with the Q4_K_M recipe; our plan for the same tensor
    list must agree on every tensor (and the file we would write is exactly as large)."""
    plan = dry_run(gemma_path, "Q4_K_M", allow_requantize=True)
    with GGUFReader(gemma_path) as reader:
        theirs = {t.name: t.ggml_type.name for t in reader.tensors.values()}
    assert {t.name: t.dst_type for t in plan.tensors} == theirs
    assert plan.output_size == os.path.getsize(gemma_path)


# -- IQ4 quantizers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [iq4_nl, iq4_xs], ids=["IQ4_NL", "IQ4_XS"])
def test_iq4_quantizers_equal_ggml_c_code(module):
    """iq4_reference.npz: ggml's quantize_iq4_nl / quantize_iq4_xs (C, built from ggml's source; see
    gen_iq4_reference.py) on 88 rows: varied synthetic rows, real Gemma weights, edge cases."""
    ref = np.load(os.path.join(DATA, "iq4_reference.npz"))
    name = module.QUANT.name
    np.testing.assert_array_equal(module.quantize(ref["x"]), ref[name])
    # and gguf's independent dequantizer reads our blocks back close to the input
    back = gguf.quants.dequantize(module.quantize(ref["x"][18:82]), gguf.GGMLQuantizationType[name])
    x = ref["x"][18:82]
    assert np.sqrt(np.mean((back - x) ** 2)) < 0.12 * np.sqrt(np.mean(x**2))


# -- CLI ----------------------------------------------------------------------------------------------------


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("q") / "tiny-f32.gguf", "llama", "F32")


@pytest.mark.parametrize("qtype", ["Q4_K_M", "Q3_K_S", "IQ4_XS", "Q5_1", "BF16", "Q8_0"])
def test_cli_writes_the_planned_file(capsys, tmp_path, tiny_f32, qtype):
    code, out, _ = run_cli(capsys, "quantize", tiny_f32, tmp_path / "x.gguf", "--type", qtype, "--dry-run")
    assert code == 0 and not (tmp_path / "x.gguf").exists()
    planned_size = int(out.split("output size: ")[1].split()[0])
    code, out, _ = run_cli(capsys, "quantize", tiny_f32, tmp_path / "x.gguf", "--type", qtype, "--threads", "2")
    assert code == 0, out
    assert os.path.getsize(tmp_path / "x.gguf") == planned_size
    assert sorted(os.listdir(tmp_path)) == ["x.gguf"]
    plan = {t.name: t.dst_type for t in dry_run(tiny_f32, qtype).tensors}
    theirs = gguf.GGUFReader(tmp_path / "x.gguf")  # llama.cpp's own reader
    assert {t.name: t.tensor_type.name for t in theirs.tensors} == plan
    assert int(theirs.fields["general.file_type"].parts[-1][0]) == {"Q4_K_M": 15, "Q3_K_S": 11, "IQ4_XS": 30, "Q5_1": 9, "BF16": 32, "Q8_0": 7}[qtype]
    assert int(theirs.fields["general.quantization_version"].parts[-1][0]) == 2
    # the weights survive: each tensor dequantizes (with gguf's code) within its type's resolution
    with GGUFReader(tiny_f32) as src:
        for t in theirs.tensors:
            original = src.tensor_array(t.name).astype(np.float64).reshape(-1)
            back = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
            assert_within_resolution(t.tensor_type.name, original, back, t.name)
    # and the model generates: greedy, to the token limit or an end-of-generation token, the text being
    # the tokens' text; BF16 (error <= 2^-8 per weight) picks the F32 model's tokens
    with localllm.load(tmp_path / "x.gguf", n_ctx=64, threads=1) as model:
        tokens, text, done = greedy(model)
        assert done.finish_reason == "length" and len(tokens) == 8 or done.finish_reason == "stop" and tokens[-1] in model.tokenizer.eog_ids
        assert text == model.detokenize(tokens)
    if qtype == "BF16":
        with localllm.load(tiny_f32, n_ctx=64, threads=1) as f32:
            assert greedy(f32)[0] == tokens


def greedy(model, max_tokens: int = 8):
    """(generated token ids, their text, the final event) of a greedy run on a fixed prompt."""
    events = list(model.generate("ab", max_tokens=max_tokens, temperature=0))
    tokens = [e.token for e in events if e.kind == "token" and e.token is not None]  # not the decoder's flush
    assert events[-1].kind == "done"
    return tokens, "".join(e.text for e in events), events[-1]


# Quantization grids: type -> (values per scale, steps between the lowest and highest level, symmetric).
# A symmetric type's levels span [-amax, amax] of its block (Q8_0: 254 steps of d = amax/127); an
# asymmetric one's span [min, max]. IQ4_XS's 16 non-uniform levels count as 15 steps.
GRIDS = {"Q8_0": (32, 254, True), "Q5_1": (32, 31, False), "Q6_K": (16, 63, True), "Q5_K": (32, 31, False),
         "Q4_K": (32, 15, False), "Q3_K": (16, 7, True), "Q2_K": (16, 3, False), "IQ4_XS": (32, 15, True)}
F16_ROUNDING = 2.0**-11  # unit roundoff of the float16 scales (11 significant bits)


def assert_within_resolution(qtype: str, original: np.ndarray, back: np.ndarray, name: str) -> None:
    """Bounds from each format's resolution, not from a measurement (measured on this tiny model, RMSE is
    0.83-0.99 of the step/sqrt(12) estimate for every grid type; per-value errors reach their bounds):
    - F32: exact. BF16: round to nearest with 8 significant bits, |error| <= 2^-8 |x|.
    - Q8_0: d = amax/127, |error| <= d/2 + 127 d u16 (rounding to the grid, then of d to float16).
    - Q5_1: d = (max-min)/31, |error| <= d/2 + 31 d u16 + |min| u16.
    - every grid type: RMSE <= 1.1 step/sqrt(12) (uniform rounding error over a step; the K-quants' and
      IQ4's searched scales may clip single values, so they get no per-value bound)."""
    err = np.abs(back - original)
    if qtype == "F32":
        assert np.array_equal(back, original), name
        return
    if qtype == "BF16":
        assert (err <= 2.0**-8 * np.abs(original)).all(), name
        return
    block, steps, symmetric = GRIDS[qtype]
    x = original.reshape(-1, block)
    err = err.reshape(-1, block)
    low, high = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    span = 2 * np.abs(x).max(axis=1, keepdims=True) if symmetric else high - low
    step = span / steps
    if qtype == "Q8_0":
        assert (err <= step / 2 + 127 * step * F16_ROUNDING).all(), name
    if qtype == "Q5_1":
        assert (err <= step / 2 + 31 * step * F16_ROUNDING + np.abs(low) * F16_ROUNDING).all(), name
    rmse = np.sqrt(np.mean(err**2))
    assert rmse <= 1.1 * np.sqrt(np.mean(step**2) / 12), (name, qtype, rmse)


def test_cli_refuses_to_overwrite_without_force(capsys, tmp_path, tiny_f32):
    (tmp_path / "x.gguf").write_bytes(b"keep me")
    code, _, err = run_cli(capsys, "quantize", tiny_f32, tmp_path / "x.gguf", "--int8")
    assert code == 1 and "--force" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "x.gguf").read_bytes() == b"keep me"
    code, _, _ = run_cli(capsys, "quantize", tiny_f32, tmp_path / "x.gguf", "--int8", "--force")
    assert code == 0 and GGUFReader(tmp_path / "x.gguf").tensors["blk.0.attn_q.weight"].ggml_type.name == "Q8_0"


def test_cli_requantize_needs_the_flag(capsys, tmp_path, tiny_f32):
    run_cli(capsys, "quantize", tiny_f32, tmp_path / "q8.gguf", "--int8")
    code, _, err = run_cli(capsys, "quantize", tmp_path / "q8.gguf", tmp_path / "q4.gguf", "--int4")
    assert code == 1 and "--allow-requantize" in err and len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["q8.gguf"]
    code, _, err = run_cli(capsys, "quantize", tmp_path / "q8.gguf", tmp_path / "q4.gguf", "--int4", "--allow-requantize")
    assert code == 0 and "warning: requantizing" in err


def test_cli_usage_and_input_errors(capsys, tmp_path, tiny_f32):
    code, _, err = run_cli(capsys, "quantize", tiny_f32, tmp_path / "x.gguf")  # no type
    assert code == 2 and "--int4" in err
    code, _, err = run_cli(capsys, "quantize", tiny_f32, tmp_path / "x.gguf", "--type", "Q7_K")
    assert code == 1 and "Q7_K" in err and len(err.strip().splitlines()) == 1
    data = open(tiny_f32, "rb").read()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 3])  # truncated: tensors run past the end
    code, _, err = run_cli(capsys, "quantize", tmp_path / "cut.gguf", tmp_path / "x.gguf", "--int4")
    assert code == 1 and err.startswith("error: ") and "cut.gguf" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "junk.gguf").write_bytes(b"not a model at all")
    code, _, err = run_cli(capsys, "quantize", tmp_path / "junk.gguf", tmp_path / "x.gguf", "--int4")
    assert code == 1 and "junk.gguf" in err and len(err.strip().splitlines()) == 1
    from localllm.gguf import GGUFWriter

    w = GGUFWriter(tmp_path / "mamba.gguf")
    w.add("general.architecture", "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 256), np.float32))
    w.write()
    code, _, err = run_cli(capsys, "quantize", tmp_path / "mamba.gguf", tmp_path / "x.gguf", "--int4")
    assert code == 1 and "mamba" in err and len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["cut.gguf", "junk.gguf", "mamba.gguf"]


# -- the real model: F32 -> Q8_0 / Q4_K_M, interruption ------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_f32(tmp_path_factory, gemma_path):
    path = tmp_path_factory.mktemp("gemma") / "gemma-f32.gguf"
    quantize_file(gemma_path, path, "F32", allow_requantize=True, threads=2)
    return path


@pytest.mark.parametrize("file_type", ["Q8_0", "Q4_K_M"])
def test_gemma_round_trip_loads_and_generates(tmp_path, gemma_f32, gemma_path, file_type):
    with pytest.raises(QuantizeError, match="overwrite the input"):  # even with --force
        quantize_file(gemma_f32, gemma_f32, file_type, force=True)
    result = quantize_file(gemma_f32, tmp_path / "g.gguf", file_type, threads=2)
    assert result.seconds < 30
    with GGUFReader(tmp_path / "g.gguf") as ours, GGUFReader(gemma_path) as shipped:
        if file_type == "Q4_K_M":  # same recipe as llama.cpp's shipped file
            assert {t.name: t.ggml_type.name for t in ours} == {t.name: t.ggml_type.name for t in shipped}
        assert ours.metadata["tokenizer.ggml.tokens"] == shipped.metadata["tokenizer.ggml.tokens"]
    model = localllm.load(tmp_path / "g.gguf", n_ctx=128, threads=2)
    text = "".join(e.text for e in model.generate("The capital of France is", max_tokens=8, temperature=0))
    # llama.cpp's shipped Q4_K_M (and F32) say " the capital of the country of France."
    assert "France" in text, text


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_run_leaves_nothing(tmp_path, gemma_f32, sig, code):
    out = tmp_path / "g.gguf"
    proc = subprocess.Popen(
        [sys.executable, "-m", "localllm.cli.app", "quantize", str(gemma_f32), str(out), "--type", "IQ4_XS", "-t", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.time() + 60
    while not any(p.name.endswith(".partial") for p in tmp_path.iterdir()):  # the stream has begun
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert err.strip().splitlines()[-1] == f"interrupted: nothing written to {out}"
    assert list(tmp_path.iterdir()) == []


# -- file-system failures: one wording, nothing left behind (issue 25 point 6, issue 26 point 5) ----------


class _FullDisk:
    """A file object whose writes fail with ENOSPC once `room` bytes have gone through."""

    def __init__(self, real, room: int):
        self._real, self._room = real, room

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if size > self._room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= size
        return self._real.write(data)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _disk_fills_after(monkeypatch, room: int) -> None:
    from localllm.gguf import writer

    real_fdopen = os.fdopen
    monkeypatch.setattr(writer.os, "fdopen", lambda fd, mode: _FullDisk(real_fdopen(fd, mode), room))


@pytest.mark.parametrize("room", [0, 100_000])  # while writing the header / in the middle of the tensors
def test_a_full_disk_is_one_line_and_leaves_nothing(monkeypatch, capsys, tmp_path, tiny_f32, room):
    _disk_fills_after(monkeypatch, room)
    out = tmp_path / "x.gguf"
    planned = dry_run(tiny_f32, "Q8_0").output_size
    code, _, err = run_cli(capsys, "quantize", tiny_f32, out, "--type", "Q8_0")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: the disk is full: {out} (the file needs {planned:,} bytes, "), err
    assert "nothing was written" in err and "partial" not in err and "Errno" not in err and "unexpected" not in err
    assert list(tmp_path.iterdir()) == []  # no output, no partial file


def test_the_library_raises_insufficient_disk_space(monkeypatch, tmp_path, tiny_f32):
    from localllm.errors import InsufficientDiskSpace

    _disk_fills_after(monkeypatch, 50_000)
    with pytest.raises(InsufficientDiskSpace, match="the disk is full"):
        quantize_file(tiny_f32, tmp_path / "x.gguf", "Q4_0")
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_output_names_the_output_not_the_temporary_file(monkeypatch, capsys, tmp_path, tiny_f32):
    from localllm.gguf import writer

    real_open = os.open

    def refuse_partials(path, *args, **kwargs):
        if str(path).endswith(".partial"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(writer.os, "open", refuse_partials)
    code, _, err = run_cli(capsys, "quantize", tiny_f32, tmp_path / "x.gguf", "--int8")
    assert (code, err) == (1, f"error: permission denied: {tmp_path / 'x.gguf'}\n")
    assert list(tmp_path.iterdir()) == []


def test_quantize_into_a_missing_directory_is_an_error(capsys, tmp_path, tiny_f32):
    """As llama-quantize: the tree is not created (it used to be, silently)."""
    code, _, err = run_cli(capsys, "quantize", tiny_f32, tmp_path / "no" / "such" / "x.gguf", "--int8")
    assert (code, err) == (1, f"error: no such directory: {tmp_path / 'no' / 'such'}\n")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_bytes(b"")
    code, _, err = run_cli(capsys, "quantize", tiny_f32, tmp_path / "file" / "x.gguf", "--int8")
    assert (code, err) == (1, f"error: not a directory: {tmp_path / 'file'}\n")


def test_missing_and_unreadable_inputs_read_the_same_in_every_command(capsys, tmp_path, tiny_f32):
    missing = tmp_path / "missing.txt"
    for args in (
        ["tokenize", tiny_f32, "--file", missing],
        ["perplexity", tiny_f32, "--file", missing],
        ["quantize", tmp_path / "missing.gguf", tmp_path / "x.gguf", "--int8"],
    ):
        code, _, err = run_cli(capsys, *args)
        assert code == 1 and err.startswith("error: no such file: ") and str(args[-1] if args[0] != "quantize" else args[1]) in err, err
        assert len(err.strip().splitlines()) == 1
    for command in ("tokenize", "perplexity"):
        code, _, err = run_cli(capsys, command, tiny_f32, "--file", tmp_path)
        assert (code, err) == (1, f"error: a directory, not a file: {tmp_path}\n")
