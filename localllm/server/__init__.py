"""OpenAI-compatible HTTP API over the engine: continuous batching on a paged, prefix-sharing KV cache.

`serve(...)` runs it in the foreground (the CLI's `localllm serve`); `BackgroundServer` runs it in a
thread (tests, benchmarks). Nothing starts at import.
"""

from __future__ import annotations

from .runner import BackgroundServer, ServeOptions, build_app, serve

__all__ = ["BackgroundServer", "ServeOptions", "build_app", "serve"]
