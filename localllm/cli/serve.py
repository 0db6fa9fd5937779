"""`localllm serve [MODEL]`: the OpenAI-compatible HTTP API (see docs/server.md)."""

from __future__ import annotations

import sys
from typing import Optional

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
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No access log (one line per request on stderr)."),
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API."""
    from ..errors import LocalLLMError
    from ..server import ServeOptions, serve as run_server

    # The engine's batched decode indexes activation buffers on the host (Backend.host_buffers), so the
    # server runs on the CPU backend for now; 'auto' therefore means cpu here.
    if backend == "cuda":
        raise LocalLLMError("serve does not support --backend cuda yet (its batched decode needs host buffers); use --backend cpu")

    options = ServeOptions(host=host, port=port, parallel=parallel, ctx=ctx, api_key=api_key, cache_mb=cache_mb,
                           max_queue=max_queue, threads=threads, access_log=None if quiet else _log_line,
                           lookup=lookup, draft_max=draft_max, draft=draft)

    def ready(llm, engine, model_id, url) -> None:
        # url has the port actually bound (--port 0: the one the system chose)
        ui.status(
            f"serving {model_id} on {url}/v1  (parallel {parallel}, context {int(engine.seq_ctx)}, "
            f"KV cache {int(engine.pool.n_blocks)} blocks of {int(engine.block_size)} tokens)"
        )

    def warming_up():
        return ui.err_console.status("preparing the kernels (compiled once per machine: the first run takes a while)")

    run_server(model, options, on_ready=ready, warming_up=warming_up)


def _log_line(line: str) -> None:
    """The access log: plain text on stderr (not rich: a logged path is not markup)."""
    print(line, file=sys.stderr, flush=True)
