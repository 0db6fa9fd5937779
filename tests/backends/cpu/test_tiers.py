"""The cold start's two kernel tiers (localllm/backends/cpu/tiers.py): the basic tier computes the full
tier's bits; the background compile covers every kernel the full tier calls; a cold `localllm run`
starts it, and the next start finds the full tier ready."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import localllm
from localllm.backends.cpu.matmul import PackedWeights, packed_available

from tiny_models import write_tiny_model



class _Pending:
    """Stands for a BackgroundCompile: `ready` and `finished` are whatever the test sets."""

    def __init__(self):
        self.ready = self.finished = False
        self.marker = Path("prepared_x")


def _start_basic(backend) -> _Pending:
    """The backend in the basic tier, as prepare_kernels leaves it on a cold start."""
    backend.background = pending = _Pending()
    backend.basic_tier = True
    return pending


def _finish(pending, ok=True) -> None:
    pending.finished, pending.ready = True, ok


def _logits_and_decode(model, prompt: list[int], steps: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """All-position logits of the prompt, then `steps` greedy decode steps' logits."""
    logits = model.logits(prompt, model.session)
    session = model.session
    decoded, token, pos = [], int(np.argmax(logits[-1])), len(prompt)
    for _ in range(steps):
        row = model.decoder.forward(np.array([token], dtype=np.int32), pos, session.cache).copy()
        decoded.append(row)
        token, pos = int(np.argmax(row[-1])), pos + 1
    return logits, decoded


def _both_tiers(path, prompt, steps):
    basic_model = localllm.load(path, n_ctx=512, threads=2)
    full_model = localllm.load(path, n_ctx=512, threads=2)
    pending = _start_basic(basic_model.backend)
    basic = _logits_and_decode(basic_model, prompt, steps)
    assert basic_model.backend.basic_tier and not basic_model.backend.layouts.recorded(), "the basic tier re-laid a matrix"
    full = _logits_and_decode(full_model, prompt, steps)
    _finish(pending)
    basic_model.decoder.forward(np.array([2], dtype=np.int32), 0, basic_model.new_session().cache)
    assert not basic_model.backend.basic_tier and basic_model.backend.background is None
    return basic, full


@pytest.mark.parametrize("n_prompt", [2, 17, 40, 300])
def test_the_basic_tier_computes_the_full_tiers_bits_on_gemma(gemma_path, n_prompt):
    # 17 rows: the tile kernels; 40: BLAS attention; 300: decode deep enough for the parallel attention
    prompt = [2] + [int(t) for t in np.random.default_rng(n_prompt).integers(3, 200_000, n_prompt - 1)]
    (basic_logits, basic_steps), (full_logits, full_steps) = _both_tiers(gemma_path, prompt, steps=3)
    np.testing.assert_array_equal(basic_logits, full_logits)
    for a, b in zip(basic_steps, full_steps):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "F16", "Q5_1"])
def test_the_basic_tier_computes_the_full_tiers_bits_on_every_kind_of_product(tmp_path, qtype):
    path = write_tiny_model(tmp_path / f"llama-{qtype}.gguf", "llama", qtype)
    prompt = [2] + list(range(260, 299))  # 40 rows: BLAS for the types without multi-row kernels
    for n in (3, 16, 40):
        (basic_logits, basic_steps), (full_logits, full_steps) = _both_tiers(path, prompt[:n], steps=2)
        np.testing.assert_array_equal(basic_logits, full_logits)
        for a, b in zip(basic_steps, full_steps):
            np.testing.assert_array_equal(a, b)


def test_the_switch_to_the_full_tier_re_lays_matrices_and_keeps_decoding_the_same(gemma_path):
    model = localllm.load(gemma_path, n_ctx=256, threads=2)
    reference = localllm.load(gemma_path, n_ctx=256, threads=2)
    pending = _start_basic(model.backend)
    prompt = model.tokenize("The capital of France is")
    first = model.logits(prompt, model.session)
    _finish(pending)  # the background compile finished between two steps
    token, pos, rows = int(np.argmax(first[-1])), len(prompt), []
    for _ in range(4):
        rows.append(model.decoder.forward(np.array([token], dtype=np.int32), pos, model.session.cache).copy())
        token, pos = int(np.argmax(rows[-1][-1])), pos + 1
    expected = _logits_and_decode(reference, prompt, 4)[1]
    for a, b in zip(rows, expected):
        np.testing.assert_array_equal(a, b)
    relaid = [layout for layout in model.backend.layouts.recorded() if isinstance(layout, PackedWeights)]
    assert bool(relaid) == packed_available()  # Q4_K matrices are re-laid where the lane kernels are fast


# Run in a fresh process: the kernels the precompile workload calls are then the only ones in memory, and
# any Dispatcher.compile call afterwards (a new signature: compiled, or loaded from the disk cache) is a
# kernel the background compile did not cover.
COVERAGE_SCRIPT = r"""
import json, sys
import numpy as np
import numba.core.dispatcher as dispatcher
import localllm
from localllm.backends.cpu.precompile import CompileOnlyBackend, exercise
from localllm.gguf import GGUFReader
from localllm.model.archs import architecture_class
from localllm.tokenizer import Tokenizer

path = sys.argv[1]
with GGUFReader(path) as reader:
    n_vocab = Tokenizer.from_metadata(reader.metadata).vocab_size
    exercise(architecture_class(reader.architecture)(reader, CompileOnlyBackend(), n_vocab=n_vocab))

missed = []
original = dispatcher.Dispatcher.compile
def compile_spy(self, sig):
    missed.append(self.py_func.__module__.rsplit("_", 1)[0] + "." + self.py_func.__qualname__)
    return original(self, sig)
dispatcher.Dispatcher.compile = compile_spy

model = localllm.load(path, n_ctx=400, threads=2)
n_vocab = model.decoder.hp.n_vocab
for n in (1, 2, 5, 16, 33, 300):
    model.logits([int(t) % n_vocab for t in range(2, 2 + n)], model.session)
session = model.session
for pos in (300, 301):
    model.decoder.forward(np.array([5], dtype=np.int32), pos, session.cache)
print(json.dumps(sorted(set(missed))))
"""


def _uncovered(path) -> list[str]:
    env = {**os.environ, "LOCALLLM_COMPILE": "foreground"}
    result = subprocess.run([sys.executable, "-c", COVERAGE_SCRIPT, str(path)], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_background_compile_covers_every_kernel_gemma_calls(gemma_path):
    assert _uncovered(gemma_path) == []


@pytest.mark.parametrize("arch,qtype", [("llama", "F16"), ("qwen2", "Q4_0"), ("qwen3", "Q6_K"), ("gemma3", "Q5_1")])
def test_the_background_compile_covers_every_kernel_of_other_families_and_types(tmp_path, arch, qtype):
    path = write_tiny_model(tmp_path / f"{arch}-{qtype}.gguf", arch, qtype)
    assert _uncovered(path) == []


def _chat_reply(env, model_path) -> str:
    """`localllm chat` in a pseudo-terminal: the reply to one question, as the terminal shows it."""
    import pexpect

    child = pexpect.spawn(sys.executable, ["-m", "localllm.cli.app", "chat", model_path, "--temperature", "0", "-n", "24"],
                          env=env, encoding="utf-8", timeout=600, dimensions=(40, 200))
    try:
        child.expect_exact(">>> ")
        child.sendline("What is the capital of France?")
        child.expect_exact("France?\r\n")
        child.expect_exact(">>> ")
        reply = child.before
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    return reply


def test_a_cold_chat_answers_in_the_basic_tier_and_leaves_the_full_tier_ready(gemma_path, tmp_path):
    """`localllm chat` on empty caches answers as a warm one does; the background compile it started
    leaves its marker, and the next start begins in the full tier."""
    from localllm import runtime

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "LOCALLLM_KERNEL_DIR": str(tmp_path / "kernels"),
           "LOCALLLM_COMPILE": "background"}
    cold = _chat_reply(env, gemma_path)
    assert "Paris" in cold
    marker = _marker_in(env, gemma_path)
    deadline = time.monotonic() + 600
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(1)
    log = marker.with_suffix(".log")
    assert marker.exists(), log.read_text() if log.exists() else "no log"
    assert _chat_reply(env, gemma_path) == cold
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, localllm; m = localllm.load(sys.argv[1]); print(m.backend.basic_tier)", gemma_path],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert probe.stdout.strip() == "False", probe.stderr[-2000:]
    assert runtime.compile_mode() == "foreground"  # the suite's own setting (conftest) is untouched


def _marker_in(env, model_path) -> Path:
    """The marker path as a process with env computes it."""
    code = "import sys; from localllm.backends.cpu.tiers import marker_path; print(marker_path(sys.argv[1], True))"
    out = subprocess.run([sys.executable, "-c", code, model_path], capture_output=True, text=True, env=env, check=True)
    return Path(out.stdout.strip())


def test_a_compile_mode_that_is_not_known_is_one_line(monkeypatch):
    from localllm.runtime import compile_mode
    from localllm.errors import LocalLLMError

    monkeypatch.setenv("LOCALLLM_COMPILE", "sometimes")
    with pytest.raises(LocalLLMError, match="LOCALLLM_COMPILE must be one of background, foreground"):
        compile_mode()


def test_a_failed_background_compile_leaves_the_basic_tier_and_says_why(tmp_path, monkeypatch):
    from localllm.backends.cpu.tiers import BackgroundCompile

    monkeypatch.setenv("LOCALLLM_KERNEL_DIR", str(tmp_path / "kernels"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\xff" * 60)
    background = BackgroundCompile(broken, True)
    background.start()
    assert background.wait(timeout=120) is False
    assert not background.ready and not background.marker.exists()
    assert "GGUFError" in background.marker.with_suffix(".log").read_text()


def test_a_failed_background_compile_is_reported_once_and_the_session_stays_in_the_basic_tier(tmp_path, caplog):
    path = write_tiny_model(tmp_path / "llama-Q8_0.gguf", "llama", "Q8_0")
    model = localllm.load(path, n_ctx=64, threads=2)
    pending = _start_basic(model.backend)
    _finish(pending, ok=False)
    with caplog.at_level("WARNING", logger="localllm.backends.cpu"):
        for pos in range(3):
            model.decoder.forward(np.array([5], dtype=np.int32), pos, model.session.cache)
    warnings = [r.getMessage() for r in caplog.records if "background failed" in r.getMessage()]
    assert len(warnings) == 1 and "prepared_x.log" in warnings[0]
    assert model.backend.basic_tier  # no compile in the middle of a reply
    model.backend.wait_for_kernels()  # a benchmark: the full tier, compiled when first called
    assert not model.backend.basic_tier


def test_a_file_over_the_basic_tiers_size_compiles_when_first_called(tmp_path, monkeypatch):
    from localllm.backends.cpu import tiers

    path = write_tiny_model(tmp_path / "llama-Q8_0.gguf", "llama", "Q8_0")
    monkeypatch.setenv("LOCALLLM_COMPILE", "background")
    monkeypatch.setenv("LOCALLLM_KERNEL_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(tiers, "BASIC_TIER_MAX_BYTES", Path(path).stat().st_size - 1)
    started = []
    monkeypatch.setattr(tiers.BackgroundCompile, "start", lambda self: started.append(self))
    assert not localllm.load(path, n_ctx=64).backend.basic_tier and not started
    monkeypatch.setattr(tiers, "BASIC_TIER_MAX_BYTES", Path(path).stat().st_size)
    assert localllm.load(path, n_ctx=64).backend.basic_tier and len(started) == 1
