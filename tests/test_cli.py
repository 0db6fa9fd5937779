"""The command line: real commands on real files, exit codes, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from localllm.cli.app import main

from tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("cli") / "tiny-llama.gguf", "llama", "Q8_0", seed=3)


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_json_on_the_default_model(capsys):
    code, out, err = run_cli(capsys, "show", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["architecture"] == "gemma3"
    assert info["n_tensors"] == 236
    assert info["tokenizer_model"] == "llama"


def test_show_a_hostile_file_is_one_line_and_exit_1(capsys, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 16)
    code, out, err = run_cli(capsys, "show", str(bad))
    assert code == 1
    assert err.count("\n") == 1 and "bad.gguf" in err and "Traceback" not in err


def test_missing_model_is_one_line_and_exit_1(capsys, tmp_path):
    code, _, err = run_cli(capsys, "show", str(tmp_path / "nope.gguf"))
    assert code == 1 and err.startswith("error:") and err.count("\n") == 1


def test_run_json_greedy_is_deterministic(capsys, tiny_llama):
    args = ("run", tiny_llama, "▁ab▁cd", "-n", "6", "--temperature", "0", "--json")
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    first = json.loads(out)
    assert first["prompt_tokens"][0] == 2  # BOS from the vocabulary's metadata
    assert len(first["tokens"]) <= 6 and first["timings"]["prompt_tokens"] == len(first["prompt_tokens"])
    code, out, _ = run_cli(capsys, *args)
    assert json.loads(out)["tokens"] == first["tokens"]


def test_run_prompt_over_context_exits_1(capsys, tiny_llama):
    code, _, err = run_cli(capsys, "run", tiny_llama, "▁ab" * 40, "--ctx", "16", "-n", "2")
    assert code == 1 and "context" in err and err.count("\n") == 1


def test_run_bad_flag_value_is_a_usage_error(capsys, tiny_llama):
    code, _, err = run_cli(capsys, "run", tiny_llama, "hi", "--top-p", "1.5")
    assert code != 0 and "top" in err.lower()


def test_tokenize_jsonl_loads_once_and_answers_per_line(tiny_llama):
    lines = [json.dumps("▁ab▁cd"), json.dumps("▁zz"), json.dumps("")]
    proc = subprocess.run(
        [sys.executable, "-m", "localllm.cli.app", "tokenize", tiny_llama, "--jsonl", "--no-bos"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(answers) == 3
    assert all(isinstance(ids, list) for ids in answers) and answers[2] == []
    assert all(2 not in ids for ids in answers)
