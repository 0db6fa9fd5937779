"""Remote models the server answers for beside its own (`localllm serve --route NAME=remote:...`).

A request whose `model` is a routed name goes to the route's remotes, in order (the next when one cannot be
reached). On the OpenAI endpoints the answer is the remote's, passed through as it comes (streamed events
byte for byte; the request's body unchanged but for `model`, which becomes the remote's name for it). Ollama's
/api/chat and /api/generate are translated: the request to the remote's /chat/completions or /completions,
its events back into Ollama's lines (RemoteHandle stands in for the engine's handle).

Keys: the client's Authorization header is the gateway's own (--api-key) and is never forwarded; a remote
gets its own key from its environment variable (remote/config.py). Neither is ever logged.
Errors: a remote's 4xx/5xx answer is passed on with its body and Retry-After, except an API key it refuses
(401/403: the gateway's key, not the client's, so 502); a remote that cannot be reached is a 502.
"""

from __future__ import annotations

import json
import logging
from typing import Optional

from starlette.responses import Response, StreamingResponse

from ..engine.sequence import Event
from ..remote.client import CONNECT_TIMEOUT, connect_reason, error_text
from ..remote.config import Remote
from ..remote.model import StreamTally
from . import protocol as p

log = logging.getLogger(__name__)

PASSED_HEADERS = ("content-type", "retry-after")


class RemoteRoutes:
    """name (any case) -> the remotes that serve it, in order."""

    def __init__(self, routes: Optional[dict] = None, notify=None):
        self.routes = {name.lower(): (name, tuple(remotes)) for name, remotes in (routes or {}).items()}
        self.notify = notify or log.warning
        self._http = None
        self._served: dict = {}  # remote url -> the first model it lists (for a remote named without one)

    @property
    def names(self) -> list:
        return [name for name, _ in self.routes.values()]

    def find(self, model) -> Optional[tuple]:
        """The remotes serving `model`, or None for a name that is not routed."""
        if not isinstance(model, str):
            return None
        entry = self.routes.get(model.strip().lower())
        return entry[1] if entry else None

    def model_objects(self) -> list:
        return [{"id": name, "object": "model", "created": 0, "owned_by": "remote"} for name in self.names]

    def _client(self):
        if self._http is None:
            import httpx

            self._http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT))
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # -- sending ------------------------------------------------------------------------------------------------
    async def open(self, remotes, path: str, body: dict):
        """The first remote's streamed answer to POST `path` (the next remote when one cannot be reached);
        APIError 502 when none can be."""
        import httpx

        reasons = []
        for remote in remotes:
            try:
                sent = dict(body, model=await self._model_name(remote))
                headers = _auth(remote)
                timeout = httpx.Timeout(remote.timeout, connect=min(CONNECT_TIMEOUT, remote.timeout))
                request = self._client().build_request("POST", remote.url + path, json=sent, headers=headers,
                                                       timeout=timeout)
                return remote, await self._client().send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                reasons.append(f"{remote.label}: {connect_reason(exc)}")
                self.notify(f"note: {remote.label} is unreachable ({connect_reason(exc)})")
        raise p.APIError(502, f"no remote for '{body.get('model')}' can be reached ({'; '.join(reasons)})",
                         type="server_error", code="remote_unreachable")

    async def _model_name(self, remote: Remote) -> str:
        if remote.model:
            return remote.model
        if remote.url not in self._served:
            response = await self._client().get(remote.url + "/models", headers=_auth(remote))
            try:
                first = response.json()["data"][0]["id"] if response.status_code == 200 else None
            except (ValueError, KeyError, IndexError, TypeError):
                first = None
            if not isinstance(first, str):
                raise p.APIError(502, f"{remote.label} lists no models ({response.status_code}): name one in its route",
                                 type="server_error")
            self._served[remote.url] = first
        return self._served[remote.url]

    async def proxy(self, remotes, path: str, body: dict) -> Response:
        """An OpenAI endpoint's answer from the remote, passed through (streamed when it streams)."""
        remote, response = await self.open(remotes, path, body)
        if response.status_code >= 400:
            return await _failed(remote, response)
        headers = {k: v for k, v in response.headers.items() if k.lower() in PASSED_HEADERS}
        if not body.get("stream"):
            try:
                content = await response.aread()
            finally:
                await response.aclose()
            return Response(content, status_code=response.status_code, headers=headers)

        async def passed():
            try:
                async for piece in response.aiter_raw():
                    yield piece
            except Exception as exc:  # noqa: BLE001 - the remote went away mid-stream: say so, in the stream
                error = p.APIError(502, f"{remote.label} closed the connection in the middle of the reply ({exc})",
                                   type="server_error")
                yield f"data: {json.dumps(error.body())}\n\n".encode()
            finally:
                await response.aclose()  # also when the client went away: the remote cancels the request

        headers.setdefault("content-type", "text/event-stream")
        return StreamingResponse(passed(), status_code=response.status_code, headers={
            **headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def handle(self, remotes, path: str, body: dict) -> "RemoteHandle":
        """The remote's streamed answer as engine events (for the Ollama endpoints)."""
        remote, response = await self.open(remotes, path, dict(body, stream=True, stream_options={"include_usage": True}))
        if response.status_code >= 400:
            content = await response.aread()
            await response.aclose()
            raise _status_api_error(remote, response.status_code, content, response.headers.get("retry-after"))
        return RemoteHandle(remote, response, chat=path.endswith("/chat/completions"))


class RemoteHandle:
    """A remote's streamed OpenAI answer as the engine's events: 'token' (text, no id), then 'done' with the
    finish reason and Timings (counts from the answer's usage), or 'error'. `cancel` closes the connection."""

    def __init__(self, remote: Remote, response, chat: bool):
        self.remote = remote
        self.response = response
        self.chat = chat

    async def events(self):
        tally = StreamTally(self.chat)
        try:
            async for line in self.response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if chunk.get("error") is not None and not chunk.get("choices"):
                    yield Event("error", text=f"{self.remote.label}: {error_text(payload.encode())}")
                    return
                for text in tally.add(chunk):
                    yield Event("token", text=text, token=-1)  # counted as a token; the id stays remote
        except Exception as exc:  # noqa: BLE001 - a cut connection or a malformed event ends the answer
            yield Event("error", text=f"{self.remote.label} closed the connection in the middle of the reply ({exc})")
            return
        finally:
            await self.response.aclose()
        if tally.finish is None:
            yield Event("error", text=f"{self.remote.label} ended the reply without a finish reason")
            return
        yield Event("done", finish_reason=tally.finish, timings=tally.timings())

    def cancel(self) -> None:
        """Close the connection (the remote cancels the request); a no-op once the answer is whole."""
        if not self.response.is_closed:
            import asyncio

            asyncio.ensure_future(self.response.aclose())


def _auth(remote: Remote) -> dict:
    """The remote's own key (from its environment variable), never the client's."""
    key = remote.api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def _status_api_error(remote: Remote, status: int, content: bytes, retry_after: Optional[str]) -> p.APIError:
    said = error_text(content) or "no message"
    if status in (401, 403):
        return p.APIError(502, f"{remote.label} refused the gateway's API key ({status}): {said}", type="server_error",
                          code="remote_auth")
    return p.APIError(status, f"{remote.label}: {said}", type="server_error" if status >= 500 else "invalid_request_error",
                      retry_after=retry_after)


async def _failed(remote: Remote, response) -> Response:
    """A remote's error answer, passed on (but 502 for an API key it refused: see the module docstring)."""
    content = await response.aread()
    await response.aclose()
    if response.status_code in (401, 403):
        error = _status_api_error(remote, response.status_code, content, None)
        return Response(json.dumps(error.body()), status_code=error.status, media_type="application/json")
    headers = {k: v for k, v in response.headers.items() if k.lower() in PASSED_HEADERS}
    return Response(content, status_code=response.status_code, headers=headers)
