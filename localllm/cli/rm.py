"""`localllm rm MODEL... [--yes]`: delete downloaded models from the models directory."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from ..errors import LocalLLMError, ModelNotFound
from . import ui


def rm(
    models: List[str] = typer.Argument(..., help="Names from `localllm list`, registry names, or files in the models directory."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete without asking."),
) -> None:
    """Delete models (asks first unless --yes). The default model is rebuilt from its package on next use."""
    paths = [_local_file(name) for name in models]  # every name checked before anything is deleted
    if not yes:
        if not ui.is_interactive():
            raise LocalLLMError("not deleting without confirmation: add --yes (no terminal to ask on)")
        listed = ", ".join(f"{name} ({ui.human_bytes(path.stat().st_size)})" for name, path in zip(models, paths))
        if not ui.confirm(f"Delete {listed}?"):
            raise typer.Exit(1)
    from ..hub.default_model import FILE_NAME as DEFAULT_FILE
    from ..hub.local import remove_local

    for path, name in dict(zip(paths, models)).items():  # a file named twice is deleted once
        remove_local(path)
        note = " (rebuilt from the installed package on next use)" if path.name == DEFAULT_FILE else ""
        ui.console.print(f"deleted {ui.markup_safe(name)}{note}")


def _local_file(name: str) -> Path:
    """The models-directory file `name` means; never downloads, never touches files elsewhere."""
    from ..hub.default_model import FILE_NAME as DEFAULT_FILE
    from ..hub.resolve import is_default, not_found_error, remote_ref, resolve_local
    from ..hub.store import models_dir

    directory = models_dir()
    if is_default(name):
        path = directory / DEFAULT_FILE
        if not path.exists():
            raise ModelNotFound(f"{name} is not assembled yet: nothing to delete")
        return path
    path = resolve_local(name)
    if path is None:
        if remote_ref(name) is None:
            raise not_found_error(name)
        raise ModelNotFound(f"'{name}' is not downloaded: nothing to delete")
    if path.resolve().parent != directory.resolve():
        raise LocalLLMError(f"{path} is not in the models directory ({directory}): rm only deletes models localllm keeps")
    return path
