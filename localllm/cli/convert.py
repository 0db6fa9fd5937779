"""`localllm convert DIR OUT [--outtype f16]`: a Hugging Face model directory to a GGUF file."""

from __future__ import annotations

from pathlib import Path

import typer

from . import ui


def convert(
    model_dir: Path = typer.Argument(..., help="Hugging Face model directory (config.json, *.safetensors, tokenizer files)."),
    output: Path = typer.Argument(..., help="GGUF file to write (written under a temporary name, renamed when complete)."),
    outtype: str = typer.Option("f16", "--outtype", help="Type of the matrices: f32, f16 or bf16 (vectors stay f32)."),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite OUTPUT if it exists."),
) -> None:
    """Convert a Hugging Face checkpoint (llama, mistral, qwen2, qwen3, gemma3) to GGUF, as llama.cpp's converter does."""
    from ..convert import OUT_TYPES, convert_checkpoint

    if outtype.upper() not in OUT_TYPES:
        raise typer.BadParameter(f"--outtype must be one of {', '.join(t.lower() for t in OUT_TYPES)}")
    progress = lambda name, i, n: ui.status(f"[{i + 1}/{n}] {name}")  # noqa: E731
    path = convert_checkpoint(model_dir, output, out_type=outtype.upper(), progress=progress, force=force)
    ui.console.print(f"wrote {path} ({ui.human_bytes(path.stat().st_size)})")
