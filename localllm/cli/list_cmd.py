"""`localllm list [--json]`: the models on this machine."""

from __future__ import annotations

import typer

from . import ui


def list_models(
    json_out: bool = typer.Option(False, "--json", help="Print a JSON array (keys in docs/cli.md)."),
) -> None:
    """List local models: NAME, SIZE, QUANT, ARCH, MODIFIED (the directory is $LOCALLLM_MODELS); then the
    remote ones the config file names (remotes and the names its routes send to them), marked (remote)."""
    from ..hub.local import list_local
    from ..remote.config import load_config

    models = list_local()
    remotes = remote_entries(load_config())
    if json_out:
        ui.print_json([m.as_dict() for m in models] + remotes)
    else:
        ui.print_model_list(models)
        ui.print_remote_list(remotes)


def remote_entries(config) -> list:
    """The config's remotes (remote:NAME) and routes whose first target is remote, as `list --json` gives them.
    Nothing is asked of the remotes: listing stays instant when one is down."""
    from ..remote.config import is_remote_reference, parse_reference

    entries = [{"name": remote.label, "remote": True, "url": remote.url, "model": remote.model, "engine": remote.engine}
               for remote in config.remotes.values()]
    for route in config.routes:
        if is_remote_reference(route.targets[0]):
            remote = parse_reference(route.targets[0], config)
            entries.append({"name": route.pattern, "remote": True, "url": remote.url, "model": remote.model,
                            "engine": remote.engine, "route": list(route.targets)})
    return entries
