"""`localllm list`, `rm`, `show NAME`, and `run`'s pull on first use, on a temporary models directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.cli.app import main
from localllm.hub import registry as reg

from fake_hub import fake_hub  # noqa: F401 - the fixture
from tiny_models import write_tiny_model


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    directory = tmp_path / "models"
    directory.mkdir()
    monkeypatch.setenv("LOCALLLM_MODELS", str(directory))
    return directory


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> bytes:
    path = write_tiny_model(tmp_path_factory.mktemp("tiny") / "t.gguf", "qwen2", "Q8_0", seed=5)
    return Path(path).read_bytes()


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> bool:
    return err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


# -- list -------------------------------------------------------------------------------------------------


def test_list_json_shows_files_their_header_facts_and_the_default_once(capsys, models_dir, tiny_bytes):
    (models_dir / "tiny-qwen.gguf").write_bytes(tiny_bytes)
    (models_dir / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    (models_dir / ".partial").mkdir()
    (models_dir / ".hidden.gguf").write_bytes(b"partial download")
    code, out, err = run_cli(capsys, "list", "--json")
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)}
    assert set(rows) == {"gemma-3-270m", "tiny-qwen", "broken"}
    tiny = rows["tiny-qwen"]
    # The writer records no general.file_type: the quant is unknown, the architecture is the header's.
    assert (tiny["arch"], tiny["quant"], tiny["size"], tiny["problem"]) == ("qwen2", None, len(tiny_bytes), None)
    assert rows["broken"]["problem"] and "broken.gguf" in rows["broken"]["problem"] and rows["broken"]["arch"] is None
    default = rows["gemma-3-270m"]
    assert default["default"] and default["modified"] is None and default["size"] == 253113024  # not assembled here


def test_list_table_has_the_columns_and_a_bad_file_with_its_problem(capsys, models_dir):
    (models_dir / "broken.gguf").write_bytes(b"not a gguf at all")
    code, out, err = run_cli(capsys, "list")
    assert code == 0, err
    header = out.splitlines()[0].split()
    assert header == ["NAME", "SIZE", "QUANT", "ARCH", "MODIFIED"]
    assert "gemma-3-270m (default)" in out and "^ not a usable model: " in out and "too short for a GGUF header" in out


def test_a_pulled_registry_file_is_listed_under_its_registry_name(capsys, models_dir, tiny_bytes):
    path = models_dir / "Qwen3-4B-Q4_K_M.gguf"
    path.write_bytes(tiny_bytes)
    _record(models_dir, path, "Qwen/Qwen3-4B-GGUF")
    code, out, _ = run_cli(capsys, "list", "--json")
    assert "qwen3-4b-q4_k_m" in [row["name"] for row in json.loads(out)]


def _record(directory: Path, path: Path, repo: str) -> None:
    fields = {"repo_id": repo, "filename": path.name, "revision": None, "commit": "0" * 40, "sha256": "0" * 64,
              "size": path.stat().st_size, "pulled_at": "2025-01-01T00:00:00+00:00"}
    (directory / ".pulls.json").write_text(json.dumps({"version": 1, "files": {path.name: fields}}))


def test_list_rejects_an_unknown_flag_as_usage(capsys, models_dir):
    code, _, err = run_cli(capsys, "list", "--colour")
    assert code == 2 and "No such option" in err and "Traceback" not in err


# -- rm ---------------------------------------------------------------------------------------------------


def test_rm_without_yes_and_without_a_terminal_refuses_and_keeps_the_file(capsys, models_dir, tiny_bytes):
    path = models_dir / "tiny.gguf"
    path.write_bytes(tiny_bytes)
    code, _, err = run_cli(capsys, "rm", "tiny")
    assert code == 1 and one_error_line(err) and "--yes" in err
    assert path.exists()


def test_rm_yes_deletes_the_file_and_its_pull_record(capsys, models_dir, tiny_bytes):
    path = models_dir / "Qwen3-4B-Q4_K_M.gguf"
    path.write_bytes(tiny_bytes)
    _record(models_dir, path, "Qwen/Qwen3-4B-GGUF")
    code, out, err = run_cli(capsys, "rm", "QWEN3-4B", "--yes")
    assert code == 0, err
    assert not path.exists() and "deleted QWEN3-4B" in out
    assert json.loads((models_dir / ".pulls.json").read_text())["files"] == {}


def test_rm_checks_every_name_before_deleting_any(capsys, models_dir, tiny_bytes):
    path = models_dir / "tiny.gguf"
    path.write_bytes(tiny_bytes)
    code, _, err = run_cli(capsys, "rm", "tiny", "lama-3.1-8b", "--yes")
    assert code == 1 and one_error_line(err) and "did you mean llama-3.1-8b" in err
    assert path.exists()


@pytest.mark.parametrize("name, message", [
    ("qwen3-8b", "'qwen3-8b' is not downloaded: nothing to delete"),
    ("nowhere/m.gguf", "no such file: nowhere/m.gguf"),
    ("gemma-3-270m", "gemma-3-270m is not assembled yet: nothing to delete"),
])
def test_rm_bad_names_are_one_line(capsys, models_dir, name, message):
    code, _, err = run_cli(capsys, "rm", name, "--yes")
    assert code == 1 and one_error_line(err) and message in err


def test_rm_refuses_a_file_outside_the_models_directory_and_a_directory(capsys, models_dir, tmp_path, tiny_bytes):
    outside = tmp_path / "mine.gguf"
    outside.write_bytes(tiny_bytes)
    code, _, err = run_cli(capsys, "rm", str(outside), "--yes")
    assert code == 1 and one_error_line(err) and "is not in the models directory" in err
    assert outside.exists()
    code, _, err = run_cli(capsys, "rm", str(tmp_path), "--yes")
    assert code == 1 and one_error_line(err) and "is a directory" in err


def test_rm_of_the_default_model_says_it_comes_back(capsys, models_dir):
    from localllm.hub.default_model import FILE_NAME, default_model_path

    assert default_model_path() == models_dir / FILE_NAME  # assembled here from the package's chunks
    code, out, err = run_cli(capsys, "rm", "gemma-3-270m", "--yes")
    assert code == 0, err
    assert "rebuilt from the installed package on next use" in out
    assert not (models_dir / FILE_NAME).exists()


def test_rm_needs_a_name(capsys, models_dir):
    code, _, err = run_cli(capsys, "rm")
    assert code == 2 and "Missing argument" in err


# -- show -------------------------------------------------------------------------------------------------


def test_show_json_adds_the_builtin_template_and_default_sampling(capsys, models_dir, tiny_bytes):
    (models_dir / "tiny.gguf").write_bytes(tiny_bytes)
    code, out, err = run_cli(capsys, "show", "tiny", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["architecture"] == "qwen2" and info["chat_template"] is False
    # A qwen2 file without its own template and with no chat-tuning word in its names ("tiny-qwen2-…") is a
    # base model: chat uses the plain transcript (localllm/chat/builtin.py is_base_model).
    assert info["template"]["origin"] == "builtin" and info["template"]["name"] == "transcript"
    assert "User: " in info["template"]["text"] and "<|im_start|>" not in info["template"]["text"]
    assert info["sampling"] == {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                                "repeat_penalty": 1.0, "seed": None}


def test_show_the_default_model_prints_the_template_section(capsys):
    code, out, err = run_cli(capsys, "show")
    assert code == 0, err
    # the shipped Gemma 3 270M is a base model: chat uses the transcript, not Gemma's turn markers
    assert "chat template built-in 'transcript'" in out and "<start_of_turn>" not in out and "temperature=0.8" in out


def test_show_a_registry_name_not_downloaded_describes_what_pull_fetches(capsys, models_dir):
    code, out, err = run_cli(capsys, "show", "llama-3.2-1b-q8", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert (info["downloaded"], info["repo"], info["file"]) == (
        False, "bartowski/Llama-3.2-1B-Instruct-GGUF", "Llama-3.2-1B-Instruct-Q8_0.gguf")


@pytest.mark.parametrize("args, message", [
    (["show", "lama-3.1-8b"], "did you mean llama-3.1-8b"),
    (["show", "/nonexistent/m.gguf"], "no such file: /nonexistent/m.gguf"),
    (["show", "hf.co/someone/Thing-GGUF:Q4_K_M"], "is not downloaded yet"),
])
def test_show_bad_names_are_one_line(capsys, models_dir, args, message):
    code, _, err = run_cli(capsys, *args)
    assert code == 1 and one_error_line(err) and message in err


def test_show_a_directory_and_an_unreadable_file(capsys, models_dir, tmp_path, monkeypatch):
    code, _, err = run_cli(capsys, "show", str(tmp_path))
    assert code == 1 and one_error_line(err) and "is a directory" in err
    locked = tmp_path / "locked.gguf"
    locked.write_bytes(b"GGUF")
    import localllm.hub.resolve as resolve

    # As root (these tests' user) chmod 000 still reads: simulate the permission check failing.
    monkeypatch.setattr(resolve.os, "access", lambda path, mode: Path(path) != locked)
    code, _, err = run_cli(capsys, "show", str(locked))
    assert code == 1 and one_error_line(err) and "permission denied" in err


# -- run: pull on first use ------------------------------------------------------------------------------------


@pytest.fixture
def tiny_registry(tmp_path, monkeypatch):
    """A registry with one entry, served by the fake hub (the real registry's files are gigabytes)."""
    directory = tmp_path / "registry"
    directory.mkdir()
    (directory / "tiny.toml").write_text(
        '[[model]]\nname = "tiny-1m-instruct"\nfamily = "tiny"\nparams = "1m"\nvariant = "instruct"\n'
        'aliases = ["tiny-1m"]\nlicense = "mit"\narch = "qwen2"\nrepo = "tester/Tiny-1M-Instruct-GGUF"\n'
        'default_quant = "Q8_0"\nfiles = [{ quant = "Q8_0", file = "Tiny-1M-Instruct-Q8_0.gguf", size_gb = 0.001 }]\n'
    )
    monkeypatch.setattr(reg, "registry_dir", lambda: directory)
    return directory


def test_run_yes_pulls_a_registry_name_then_uses_the_local_copy(capsys, models_dir, fake_hub, tiny_registry, tiny_bytes):
    fake_hub.add_file("tester/Tiny-1M-Instruct-GGUF", "Tiny-1M-Instruct-Q8_0.gguf", tiny_bytes)
    args = ("run", "tiny-1m", "▁ab", "-n", "3", "--temperature", "0", "--json")
    code, out, err = run_cli(capsys, *args, "--yes")
    assert code == 0, err
    first = json.loads(out)
    assert (models_dir / "Tiny-1M-Instruct-Q8_0.gguf").read_bytes() == tiny_bytes
    assert fake_hub.bytes_served == len(tiny_bytes)
    code, out, err = run_cli(capsys, *args)  # now local: no --yes needed, nothing downloaded
    assert code == 0, err
    assert json.loads(out)["tokens"] == first["tokens"] and fake_hub.bytes_served == len(tiny_bytes)
    code, out, _ = run_cli(capsys, "list", "--json")
    assert "tiny-1m-instruct-q8_0" in [row["name"] for row in json.loads(out)]


def test_run_pulls_a_hub_reference_with_yes_and_refuses_without(capsys, models_dir, fake_hub, tiny_bytes):
    fake_hub.add_file("someone/Small-GGUF", "small-q8_0.gguf", tiny_bytes)
    code, _, err = run_cli(capsys, "run", "someone/Small-GGUF:Q8_0", "▁ab", "-n", "1")
    assert code == 1 and one_error_line(err) and "add --yes" in err and "hf.co/someone/Small-GGUF:Q8_0" in err
    assert fake_hub.bytes_served == 0 and not any(models_dir.glob("*.gguf"))
    code, out, err = run_cli(capsys, "run", "hf.co/someone/Small-GGUF:q8_0", "▁ab", "-n", "1", "--yes", "--json")
    assert code == 0, err
    assert (models_dir / "small-q8_0.gguf").read_bytes() == tiny_bytes


def test_run_with_an_unknown_name_suggests_and_a_bad_flag_is_usage(capsys, models_dir):
    code, _, err = run_cli(capsys, "run", "qwen2.5-7b-q5", "hi", "--yes")
    assert code == 1 and one_error_line(err) and "did you mean qwen2.5-7b" in err
    code, _, err = run_cli(capsys, "run", "gemma-3-270m", "hi", "--top-p", "7")
    assert code == 2 and "Traceback" not in err
