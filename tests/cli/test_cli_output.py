"""What the CLI prints: text from files and the network cannot drive the terminal or rich's markup, and
output written to a file or pipe is one line per line (no wrap at 80 columns, no trailing spaces)."""

from __future__ import annotations

import json
import re

import pytest

from localllm.cli import ui
from localllm.cli.app import main
from localllm.gguf import GGUFWriter
from tiny_models import write_tiny_model

# An OSC 8 hyperlink, BEL, rich markup (a style and a closing tag), an SGR colour, a carriage return.
HOSTILE = "\x1b]8;;http://x\x07[bold red]hi[/]\x1b[31m\r"
# How terminal_safe writes it: each control character as its Python escape, the brackets as they are.
HOSTILE_SHOWN = "\\x1b]8;;http://x\\x07[bold red]hi[/]\\x1b[31m\\r"
# What json.dumps leaves raw: a C1 CSI (ESC [ in one character) and a right-to-left override.
C1_TAIL, C1_TAIL_SHOWN = "\x9b31m\u202e", "\\x9b31m\\u202e"
LONG_NAME = "a-model-name-longer-than-eighty-columns-" * 4  # 160 characters
TEMPLATE = "{{ '[link=http://x]click[/link]' }}\x1b[2J" + "{# a template line longer than eighty columns #}" * 3 + "\n{{ messages }}"


def _write_with_metadata(monkeypatch, path, **metadata) -> str:
    """A tiny llama GGUF (tests/tiny_models.py) with `metadata` set over what it writes."""
    original = GGUFWriter.write

    def write(self):
        for key, value in metadata.items():
            self.add(key.replace("__", "."), value)
        return original(self)

    with monkeypatch.context() as patch:
        patch.setattr(GGUFWriter, "write", write)
        return write_tiny_model(path, "llama", "Q8_0", seed=3)


@pytest.fixture
def hostile_model(tmp_path, monkeypatch):
    return _write_with_metadata(
        monkeypatch, tmp_path / "hostile.gguf", general__name=HOSTILE + C1_TAIL, tokenizer__chat_template=TEMPLATE
    )


@pytest.fixture
def long_named_model(tmp_path, monkeypatch):
    return _write_with_metadata(monkeypatch, tmp_path / "long.gguf", general__name=LONG_NAME)


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _no_control_characters(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


# -- terminal and markup injection (issue 25 point 5) ------------------------------------------------------


def test_terminal_safe_escapes_controls_and_markup_safe_escapes_markup_too():
    assert ui.terminal_safe(HOSTILE) == HOSTILE_SHOWN
    assert ui.terminal_safe("line one\nline two\t\x9b1m") == "line one\\nline two\\t\\x9b1m"
    assert ui.terminal_safe("line one\nline two\t\u202e", keep_newlines=True) == "line one\nline two\t\\u202e"
    assert ui.terminal_safe("日本語 ok") == "日本語 ok"
    assert ui.markup_safe("[bold red]hi[/]") == "\\[bold red]hi\\[/]"


def test_show_prints_a_hostile_name_and_template_escaped_also_into_a_pipe(capsys, hostile_model):
    code, out, err = run_cli(capsys, "show", hostile_model)
    assert code == 0, err
    assert _no_control_characters(out)
    assert HOSTILE_SHOWN + C1_TAIL_SHOWN in out  # rich interpreted none of it: the markup is there, as text
    assert "{{ '[link=http://x]click[/link]' }}\\x1b[2J" in out  # the template: markup and escape visible
    assert "\n{{ messages }}" in out  # its own newlines kept


def test_show_json_keeps_the_name_exact_and_the_output_free_of_control_characters(capsys, hostile_model):
    code, out, err = run_cli(capsys, "show", hostile_model, "--json")
    assert code == 0, err
    assert _no_control_characters(out)
    info = json.loads(out)
    assert info["name"] == HOSTILE + C1_TAIL and info["template"]["text"] == TEMPLATE
    assert "\\u009b31m\\u202e" in out


def test_list_escapes_file_names_and_metadata(capsys, tmp_path, monkeypatch, hostile_model):
    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setenv("LOCALLLM_MODELS", str(models))
    (models / "evil\x1b[31m[bold].gguf").write_bytes(open(hostile_model, "rb").read())
    (models / "broken\x07.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    code, out, err = run_cli(capsys, "list")
    assert code == 0, err
    assert _no_control_characters(out)
    assert "evil\\x1b[31m[bold]" in out and "broken\\x07" in out


def test_an_error_quoting_a_files_text_is_one_escaped_line(capsys, tmp_path, monkeypatch):
    bad = _write_with_metadata(monkeypatch, tmp_path / "bad.gguf", general__architecture="evil\x1b[2J\nsecond [bold]line")
    code, out, err = run_cli(capsys, "run", bad, "hi", "-n", "1")
    assert code == 1 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and _no_control_characters(err)
    assert "evil\\x1b[2J\\nsecond [bold]line" in err
    code, out, err = run_cli(capsys, "show", bad)  # show describes what it can: the architecture escaped
    assert code == 0 and _no_control_characters(out) and "evil\\x1b[2J\\nsecond [bold]line" in out


# -- output that reads well in a file (issue 26 point 7) ---------------------------------------------------


def test_show_into_a_file_neither_wraps_nor_pads_lines(capsys, long_named_model, hostile_model):
    for model in (long_named_model, hostile_model):
        code, out, err = run_cli(capsys, "show", model)
        assert code == 0, err
        assert all(line == line.rstrip() for line in out.splitlines()), [l for l in out.splitlines() if l != l.rstrip()]
    code, out, _ = run_cli(capsys, "show", long_named_model)
    assert any(line.split() == ["name", LONG_NAME] for line in out.splitlines())  # the whole name on its line


def test_the_confirmation_prompt_shows_y_slash_n(capsys, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda: "n")
    assert ui.confirm("Delete [bold]x\x1b[31m (1.0 KiB)?") is False
    _, err = capsys.readouterr()
    assert err == "Delete [bold]x\\x1b[31m (1.0 KiB)? [y/N] "


def test_run_verbose_prints_the_chat_stats_line_on_stderr(capsys, tmp_path):
    model = write_tiny_model(tmp_path / "tiny.gguf", "llama", "Q8_0", seed=3)
    code, out, err = run_cli(capsys, "run", model, "▁ab▁cd", "-n", "5", "--temperature", "0", "--ctx", "64", "--json")
    assert code == 0, err
    answer = json.loads(out)
    code, out, err = run_cli(capsys, "run", model, "▁ab▁cd", "-n", "5", "--temperature", "0", "--ctx", "64", "-v")
    assert code == 0, err
    assert out == answer["text"] + "\n"  # stdout keeps only the completion
    used = len(answer["prompt_tokens"]) + len(answer["tokens"])
    pattern = (
        r"time to first token \d+\.\d\d s · prompt (\d+) new tokens \(0 cached\) at \d+\.\d tok/s · "
        r"reply (\d+) tokens at \d+\.\d tok/s · context (\d+)/64"
    )
    match = re.fullmatch(pattern, err.strip())
    assert match, err
    assert tuple(map(int, match.groups())) == (len(answer["prompt_tokens"]), len(answer["tokens"]), used)
