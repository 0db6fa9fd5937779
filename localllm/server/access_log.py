"""One line per HTTP request, written once its response has been sent (a stream: at its end):

    POST /v1/chat/completions 200  in 23  out 64  1.234 s
    GET /health 200  0.001 s

Handlers of generation endpoints leave their token counts in the request's state (`note_tokens`);
the others log no counts. The path is logged as the client sent it, with anything unprintable escaped
(a log line must not carry terminal escapes).
"""

from __future__ import annotations

import time
from typing import Callable

from ..errors import one_line

_TOKENS = "localllm.tokens"  # key in the ASGI scope's "state": an object with n_prompt and n_generated


def note_tokens(request, counts) -> None:
    """Let the access log read `counts.n_prompt` and `counts.n_generated` when the request ends."""
    request.scope.setdefault("state", {})[_TOKENS] = counts


def format_line(method: str, path: str, status: int, counts, seconds: float) -> str:
    tokens = f"  in {counts.n_prompt}  out {counts.n_generated}" if counts is not None else ""
    return f"{one_line(method)} {one_line(path)} {status}{tokens}  {seconds:.3f} s"


class AccessLog:
    """ASGI middleware around the app: `write(line)` for every HTTP request (status 0: no response was
    started, e.g. the connection dropped first)."""

    def __init__(self, app, write: Callable[[str], None]):
        self.app = app
        self.write = write

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = 0

        async def send_noting_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            path = scope.get("raw_path", b"").decode("latin-1") or scope.get("path", "")
            counts = scope.get("state", {}).get(_TOKENS)
            self.write(format_line(scope.get("method", ""), path, status, counts, time.perf_counter() - t0))
