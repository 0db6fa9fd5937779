"""The sampling defaults docs/cli.md promises are the ones `run` and `chat` start from, and SamplingConfig's
(the one place they are written: localllm/sampling_config.py). The expected values come from the text of
docs/cli.md, not from the code."""

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import typer.main

from localllm.chat.conversation import ChatSettings
from localllm.cli import options as opt
from localllm.cli.app import app
from localllm.sampling import SamplingConfig

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def documented_defaults() -> dict:
    """{field name: value} from the paragraph "Sampling options of `chat` and `run`: `--temperature` (0.8; …"."""
    text = " ".join(DOCS.read_text(encoding="utf-8").split())
    paragraph = re.search(r"Sampling options of `chat` and `run`: (.*?)\. ", text).group(1)
    found = {}
    for flag, value in re.findall(r"`--([a-z-]+)` \(([^;:=)]+)", paragraph):
        value = value.strip()
        found[flag.replace("-", "_")] = None if value == "none" else (float(value) if "." in value else int(value))
    return found


def command_defaults(name: str) -> dict:
    """{parameter name: default} of a CLI command, as Typer hands it to click."""
    command = typer.main.get_command(app).commands[name]
    return {param.name: param.default for param in command.params}


def test_the_docs_name_every_sampling_option_with_a_default():
    assert documented_defaults() == {
        "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0, "seed": None,
    }


@pytest.mark.parametrize("name", ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed"])
def test_sampling_config_defaults_are_the_documented_ones(name):
    default = {f.name: f.default for f in fields(SamplingConfig)}[name]
    assert default == documented_defaults()[name]


def test_run_starts_from_the_documented_defaults():
    given = command_defaults("run")
    config = opt.sampling_config(given["temperature"], given["top_k"], given["top_p"], given["min_p"],
                                 given["repeat_penalty"], given["seed"], given["stop"])
    assert {name: getattr(config, name) for name in documented_defaults()} == documented_defaults()
    assert given["max_tokens"] == SamplingConfig().max_tokens


def test_chat_starts_from_the_documented_defaults():
    given = command_defaults("chat")
    settings = ChatSettings(**{name: given[name] for name in ChatSettings.SAMPLING})
    config = settings.sampling()  # a model with a template of its own: no default penalty
    assert {name: getattr(config, name) for name in documented_defaults()} == documented_defaults()
    assert settings.sampling(default_repeat_penalty=1.1).repeat_penalty == 1.1  # a base model's transcript
    assert ChatSettings().sampling() == SamplingConfig()


def test_the_cli_builds_its_options_without_importing_numpy():
    # the defaults come from localllm/sampling_config.py, which imports no NumPy (~60 ms at every start)
    code = "import sys, localllm.cli.app; print('numpy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
