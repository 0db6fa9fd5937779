"""`localllm show [MODEL] [--json] [--tensors]`: what a model holds, its chat template and default sampling."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from . import ui

# The settings `chat` and `run` start from (their option defaults); `run -n` defaults to 256, `chat -n` to 512.
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")


def show(
    model: Optional[str] = typer.Argument(None, help="Model name or path (default: the built-in Gemma 3 270M)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (keys in docs/cli.md)."),
    tensors: bool = typer.Option(False, "--tensors", help="List every tensor too."),
) -> None:
    """Show a model's architecture, sizes, quant mix, tokenizer, chat template and default sampling."""
    from ..gguf import GGUFReader
    from ..hub.resolve import is_default, registry_choice, resolve_local, resolve_model
    from ..model.info import describe
    from ..remote.config import is_remote_reference

    if is_remote_reference(model):  # what the remote says of it (its model list)
        import localllm

        llm = localllm.load(model).connect()
        info = llm.describe()
        if json_out:
            ui.print_json(info)
        else:
            for key, value in info.items():
                ui.console.print(f"{key:<15} {ui.terminal_safe(value if value is not None else 'not reported')}",
                                 markup=False)
        return
    choice = None if is_default(model) else registry_choice(model)
    if choice is not None and not choice.entry.supported:  # nothing to open: say what it is and why not
        _show_not_downloaded(choice, json_out)
        return
    path = resolve_model(None) if is_default(model) else resolve_local(model)
    if path is None:
        if choice is None:  # a hub reference not pulled yet: resolution says so
            resolve_model(model)
        _show_not_downloaded(choice, json_out)
        return
    with GGUFReader(path) as reader:
        info = describe(reader)
        info["template"] = template_info(reader.metadata, Path(path).name)
        info["sampling"] = default_sampling()
        if json_out:
            if tensors:
                info["tensors"] = [
                    {"name": t.name, "type": t.ggml_type.name, "shape": list(t.shape), "offset": t.offset, "bytes": t.nbytes}
                    for t in reader.tensors.values()
                ]
            ui.print_json(info)
            return
        ui.print_model_summary(info)
        ui.print_template_and_sampling(info["template"], info["sampling"])
        if tensors:
            ui.print_tensors(reader)


def template_info(metadata, file_name: str = "") -> dict:
    """{origin: "file" | "builtin", name, text}: the template `chat` will apply to this file (a base
    model's: the transcript, see localllm/chat/builtin.py is_base_model)."""
    from ..chat.templates import ChatTemplate

    template = ChatTemplate.for_model(metadata, file_name)
    origin = "file" if template.name == "gguf" else "builtin"
    return {"origin": origin, "name": template.name, "text": template.source}


def default_sampling() -> dict:
    from ..sampling import SamplingConfig

    config = asdict(SamplingConfig())
    return {key: config[key] for key in SAMPLING_KEYS}


def _show_not_downloaded(choice, json_out: bool) -> None:
    entry = choice.entry
    info = {
        "name": choice.name,
        "downloaded": False,  # or not runnable: see supported
        "repo": entry.repo,
        "file": choice.filename,
        "family": entry.family,
        "license": entry.license,
        "arch": entry.arch,
        "supported": entry.supported,
        "quants": [{"quant": q.quant, "file": q.file, "size_gb": q.size_gb} for q in entry.files],
    }
    if json_out:
        ui.print_json(info)
    else:
        ui.print_registry_entry(info)
