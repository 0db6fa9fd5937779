"""`localllm embed MODEL TEXT...`: one embedding vector per text (Model.embed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from . import options as opt
from . import ui

POOLINGS = ("mean", "cls", "last")


def embed(
    model: Optional[str] = typer.Argument(..., help="Model path or name (an embedding model, or any model)."),
    texts: Optional[List[str]] = typer.Argument(None, help="Texts to embed, one vector each; '-' reads one text per stdin line."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Also embed each non-empty line of this file."),
    json_out: bool = typer.Option(False, "--json", help="Print {model, pooling, dimensions, embeddings, token_counts}."),
    no_normalize: bool = typer.Option(False, "--no-normalize", help="Leave the vectors as pooled (default: L2-normalised)."),
    pooling: Optional[str] = typer.Option(None, "--pooling", help="mean, cls or last (default: as the file says; none: last)."),
    truncate: bool = typer.Option(False, "--truncate", help="Cut a text longer than the context instead of failing."),
    ctx: Optional[int] = opt.Ctx,
    threads: Optional[int] = opt.Threads,
    backend: str = opt.Backend,
    yes: bool = typer.Option(False, "--yes", "-y", help="Download the model without asking if it is not local."),
) -> None:
    """Print the embedding of each TEXT: one line of space-separated numbers per text, or --json."""
    from ..api import load_path
    from ..remote.config import Remote

    if pooling is not None and pooling not in POOLINGS:
        raise typer.BadParameter(f"--pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
    inputs: list[str] = []
    for text in texts or []:
        inputs += [line.rstrip("\r\n") for line in sys.stdin if line.strip()] if text == "-" else [text]
    if file is not None:
        from .tokenize import _read_text

        inputs += [line for line in _read_text(file).splitlines() if line.strip()]
    if not inputs:
        raise typer.BadParameter("give at least one TEXT (or --file, or '-' for stdin)")
    target = opt.target(model, yes)
    if isinstance(target, Remote):
        llm = opt.remote_model(target, ctx=ctx, pooling=pooling, no_normalize=no_normalize, truncate=truncate)
        name = llm.label
    else:
        llm, name = load_path(target, n_ctx=ctx, threads=threads, backend=backend), Path(target).name
    result = llm.embeddings(inputs, normalize=not no_normalize, pooling=pooling, truncate=truncate)
    if json_out:
        ui.print_json({
            "model": name,
            "pooling": result.pooling,
            "normalized": not no_normalize,
            "dimensions": int(result.vectors.shape[1]),
            "embeddings": result.vectors.tolist(),
            "token_counts": result.token_counts,
        })
        return
    for vector in result.vectors:
        sys.stdout.write(" ".join(format(float(v), ".7g") for v in vector) + "\n")
