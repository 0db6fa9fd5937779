"""`localllm serve [MODEL]`: the OpenAI-compatible HTTP API (see docs/server.md)."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from . import options as opt
from . import ui


def serve(
    model: Optional[str] = opt.Model,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback unless you say otherwise)."),
    port: int = typer.Option(8080, "--port", "-p", min=0, max=65535),
    parallel: int = typer.Option(4, "--parallel", min=1, help="Sequences decoded together in each step."),
    ctx: Optional[int] = opt.Ctx,  # default: localllm.api.default_context (4096, or the trained length if shorter)
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="LOCALLLM_API_KEY",
                                          help="Require 'Authorization: Bearer KEY'."),
    cache_mb: float = typer.Option(512, "--cache-mb", min=1, help="Memory for the paged KV cache (MiB)."),
    max_queue: int = typer.Option(64, "--max-queue", min=1, help="Waiting requests before 503."),
    threads: Optional[int] = opt.Threads,
    backend: str = opt.Backend,
    lookup: bool = typer.Option(False, "--lookup/--no-lookup",
                                help="Speculative decoding by prompt lookup: each sequence drafts tokens copied from "
                                     "its context, checked in its step (the same answers; faster where they repeat "
                                     "their context, a little slower where they do not)."),
    draft: Optional[str] = typer.Option(None, "--draft", show_default=False,
                                        help="A small model with the same vocabulary: every sequence drafts tokens with it "
                                             "(its own KV cache per sequence; the same answers)."),
    draft_max: int = typer.Option(8, "--draft-max", min=1, max=16, help="Tokens a sequence drafts per step at most."),
    route: Optional[List[str]] = typer.Option(
        None, "--route", show_default=False,
        help="NAME=remote:REMOTE (or remote:URL#MODEL): answer requests for model NAME from that remote engine "
             "(repeatable); a bare NAME takes its route from the config file."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No access log (one line per request on stderr)."),
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (and Ollama's), with --route remote models beside it."""
    from ..errors import LocalLLMError
    from ..remote.config import is_remote_reference
    from ..server import ServeOptions, serve as run_server

    if is_remote_reference(model):
        raise LocalLLMError("serve runs a local model; answer for a remote one with --route NAME=remote:...")
    routes = _routes(route or [])

    # The engine's batched decode indexes activation buffers on the host (Backend.host_buffers), so the
    # server runs on the CPU backend for now; 'auto' therefore means cpu here.
    if backend == "cuda":
        raise LocalLLMError("serve does not support --backend cuda yet (its batched decode needs host buffers); use --backend cpu")

    options = ServeOptions(host=host, port=port, parallel=parallel, ctx=ctx, api_key=api_key, cache_mb=cache_mb,
                           max_queue=max_queue, threads=threads, access_log=None if quiet else _log_line,
                           lookup=lookup, draft_max=draft_max, draft=draft, routes=routes, notify=_log_line)

    def ready(llm, engine, model_id, url) -> None:
        # url has the port actually bound (--port 0: the one the system chose)
        ui.status(
            f"serving {model_id} on {url}/v1  (parallel {parallel}, context {int(engine.seq_ctx)}, "
            f"KV cache {int(engine.pool.n_blocks)} blocks of {int(engine.block_size)} tokens)"
        )
        for name, remotes in routes.items():
            ui.status(f"routing {name} to {', then '.join(r.label for r in remotes)}")

    def warming_up():
        return ui.err_console.status("preparing the kernels (compiled once per machine: the first run takes a while)")

    run_server(model, options, on_ready=ready, warming_up=warming_up)


def _log_line(line: str) -> None:
    """The access log: plain text on stderr (not rich: a logged path is not markup)."""
    print(line, file=sys.stderr, flush=True)


def _routes(specs: list) -> dict:
    """--route values -> {name: (Remote, ...)}: NAME=REFERENCE, or a bare NAME whose route the config file has
    (its remote targets, in order; local ones are the local model's business, not a gateway's)."""
    from ..remote.config import is_remote_reference, load_config, parse_reference

    config = load_config()
    routes = {}
    for spec in specs:
        name, sep, reference = spec.partition("=")
        name = name.strip()
        if not name:
            raise typer.BadParameter(f"--route {spec!r}: give NAME=remote:... or the name of a route in {config.path}")
        if sep:
            if not is_remote_reference(reference):
                raise typer.BadParameter(f"--route {spec!r}: the target must be remote:NAME or remote:URL#MODEL")
            routes[name] = (parse_reference(reference, config),)
            continue
        route = config.route_for(name)
        remotes = tuple(parse_reference(t, config) for t in route.targets if is_remote_reference(t)) if route else ()
        if not remotes:
            raise typer.BadParameter(f"--route {name}: {config.path} has no route with a remote target for it")
        routes[name] = remotes
    return routes
