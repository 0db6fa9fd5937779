"""`localllm list [--json]`: the models on this machine."""

from __future__ import annotations

import typer

from . import ui


def list_models(
    json_out: bool = typer.Option(False, "--json", help="Print a JSON array (keys in docs/cli.md)."),
) -> None:
    """List local models: NAME, SIZE, QUANT, ARCH, MODIFIED (the directory is $LOCALLLM_MODELS)."""
    from ..hub.local import list_local

    models = list_local()
    if json_out:
        ui.print_json([m.as_dict() for m in models])
    else:
        ui.print_model_list(models)
