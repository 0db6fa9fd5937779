"""`localllm show [MODEL] [--json] [--tensors]`: what a GGUF file holds."""

from __future__ import annotations

from typing import Optional

import typer

from ..gguf import GGUFReader
from ..hub.resolve import resolve_model
from ..model.info import describe
from . import ui


def show(
    model: Optional[str] = typer.Argument(None, help="Model path or name (default: the built-in Gemma 3 270M)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (keys in docs/cli.md)."),
    tensors: bool = typer.Option(False, "--tensors", help="List every tensor too."),
) -> None:
    """Show a model's architecture, sizes, quant mix and tokenizer."""
    path = resolve_model(model)
    with GGUFReader(path) as reader:
        info = describe(reader)
        if json_out:
            if tensors:
                info["tensors"] = [
                    {"name": t.name, "type": t.ggml_type.name, "shape": list(t.shape), "offset": t.offset, "bytes": t.nbytes}
                    for t in reader.tensors.values()
                ]
            ui.print_json(info)
            return
        ui.print_model_summary(info)
        if tensors:
            ui.print_tensors(reader)
