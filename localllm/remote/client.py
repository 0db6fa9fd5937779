"""HTTP to one remote engine (httpx): JSON requests, streamed answers as server-sent events, and every failure
as one line that names the remote.

Busy answers (429, 503) that say when to come back (Retry-After, in seconds) are retried up to `retries` times
when the wait is at most `max_retry_wait`; otherwise they fail at once with the wait in the message. Nothing
waits without a bound: connecting takes at most CONNECT_TIMEOUT, and an answer may pause at most the remote's
`timeout` between two bytes. The API key goes into the Authorization header and nowhere else.
"""

from __future__ import annotations

import json
import time
from typing import Callable, Iterator, Optional

from ..errors import LocalLLMError, one_line
from .config import Remote

CONNECT_TIMEOUT = 10.0  # seconds
RETRIES = 2
MAX_RETRY_WAIT = 10.0  # seconds: a longer Retry-After is reported, not waited for
MESSAGE_LIMIT = 300  # characters of a remote's error text quoted in a message


class RemoteError(LocalLLMError):
    """A remote engine failed a request (the message names the remote and says what it answered)."""

    def __init__(self, message: str, status: Optional[int] = None, retry_after: Optional[float] = None):
        super().__init__(one_line(message))
        self.status = status
        self.retry_after = retry_after


class RemoteUnreachable(RemoteError):
    """No connection could be made (refused, unknown host, timed out): routing falls back from it."""


class RemoteStreamCut(RemoteError):
    """The connection ended before the answer did."""


class Client:
    """Requests to `remote`; `sleep` waits between retries (tests pass their own)."""

    def __init__(self, remote: Remote, retries: int = RETRIES, max_retry_wait: float = MAX_RETRY_WAIT,
                 sleep: Callable[[float], None] = time.sleep):
        self.remote = remote
        self.retries = retries
        self.max_retry_wait = max_retry_wait
        self.sleep = sleep
        self._http = None

    # -- plumbing --
    def _client(self):
        if self._http is None:
            import httpx

            timeout = httpx.Timeout(self.remote.timeout, connect=min(CONNECT_TIMEOUT, self.remote.timeout))
            self._http = httpx.Client(timeout=timeout, headers=self.headers(), follow_redirects=False)
        return self._http

    def headers(self) -> dict:
        key = self.remote.api_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def url(self, path: str) -> str:
        return self.remote.url + path

    # -- requests --
    def get_json(self, path: str) -> dict:
        """GET the remote's `path` (under its base URL) as JSON."""
        response = self._send("GET", path, None)
        try:
            return _json_body(response, self.remote)
        finally:
            response.close()

    def post_json(self, path: str, body: dict) -> dict:
        response = self._send("POST", path, body)
        try:
            return _json_body(response, self.remote)
        finally:
            response.close()

    def stream(self, path: str, body: dict) -> Iterator[dict]:
        """POST `body` and yield each event of the streamed answer (a JSON object) until its end ([DONE]).
        Closing the generator closes the connection, which a remote takes as the request cancelled.
        RemoteStreamCut when the connection ends first."""
        import httpx

        response = self._send("POST", path, body)
        try:
            yield from _events(response, self.remote)
        except httpx.TimeoutException:
            raise RemoteError(f"{self.remote.label} sent nothing for {self.remote.timeout:g} s in the middle of the "
                              "reply (raise its timeout in the config file)") from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise RemoteStreamCut(f"{self.remote.label} closed the connection in the middle of the reply ({exc})") from None
        finally:
            response.close()

    def _send(self, method: str, path: str, body: Optional[dict]):
        """The response (streamed, status checked) to one request, after the retries a busy remote asks for."""
        import httpx

        client = self._client()
        for attempt in range(self.retries + 1):
            request = client.build_request(method, self.url(path), json=body)
            try:
                response = client.send(request, stream=True)
            except httpx.TimeoutException:
                raise RemoteUnreachable(f"cannot reach {self.remote.label} at {self.remote.url}: no answer in "
                                        f"{CONNECT_TIMEOUT:g} s") from None
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                raise RemoteUnreachable(f"cannot reach {self.remote.label} at {self.remote.url}: "
                                        f"{connect_reason(exc)}") from None
            if response.status_code < 400:
                return response
            wait = retry_after(response.headers.get("retry-after"))
            if (response.status_code in (429, 503) and attempt < self.retries and wait is not None
                    and wait <= self.max_retry_wait):
                response.close()
                self.sleep(wait)
                continue
            try:
                response.read()
            except httpx.HTTPError:
                pass
            raise status_error(self.remote, response.status_code, response.content, wait)
        raise AssertionError("unreachable")  # the last attempt returns or raises


def retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds from a Retry-After header given in seconds (an HTTP date is not waited for: None)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def connect_reason(exc) -> str:
    """Why a connection failed, in a few words: the first cause in the exception's chain that says it
    (httpx's async transport wraps the socket's error in "All connection attempts failed")."""
    seen = exc
    while seen is not None:
        text = str(seen)
        if isinstance(seen, ConnectionRefusedError) or "Connection refused" in text or "ECONNREFUSED" in text:
            return "connection refused"
        if "Name or service not known" in text or "nodename nor servname" in text or "getaddrinfo" in text:
            return "unknown host"
        seen = seen.__cause__ or seen.__context__
    return str(exc) or type(exc).__name__


def error_text(content: bytes) -> str:
    """The message in an error body: OpenAI's {"error": {"message"}}, TGI's {"error": "..."}, FastAPI's
    {"detail": ...}, or the text itself (cut to MESSAGE_LIMIT characters)."""
    text = content.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            text = str(error["message"])
        elif isinstance(error, str) and error:
            text = error
        elif data.get("detail"):
            text = json.dumps(data["detail"]) if not isinstance(data["detail"], str) else data["detail"]
        elif data.get("message"):
            text = str(data["message"])
    text = " ".join(text.split())
    return text[:MESSAGE_LIMIT] + ("…" if len(text) > MESSAGE_LIMIT else "")


def status_error(remote: Remote, status: int, content: bytes, wait: Optional[float] = None) -> RemoteError:
    """The RemoteError of an answer with an error status."""
    said = error_text(content) or "no message"
    label = remote.label
    if status in (401, 403):
        key = remote.api_key_env
        hint = (f"; the key is read from ${key}" + ("" if remote.api_key() else ", which is not set")) if key else ""
        return RemoteError(f"{label} refused the request ({status}, API key): {said}{hint}", status)
    if status in (429, 503):
        later = f"; retry after {wait:g} s" if wait is not None else ""
        return RemoteError(f"{label} is busy ({status}): {said}{later}", status, wait)
    return RemoteError(f"{label} answered {status}: {said}", status)


def _json_body(response, remote: Remote) -> dict:
    import httpx

    try:
        response.read()
        data = json.loads(response.content)
    except (ValueError, httpx.HTTPError):
        raise RemoteError(f"{remote.label} did not answer with JSON") from None
    if not isinstance(data, dict):
        raise RemoteError(f"{remote.label} answered with JSON that is not an object")
    return data


def _events(response, remote: Remote) -> Iterator[dict]:
    """The `data:` objects of a server-sent event stream, up to `data: [DONE]`; an error object in the
    stream raises it. A stream that ends without [DONE] raises RemoteStreamCut."""
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue  # comments (": ping"), event names, blank lines between events
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            event = json.loads(payload)
        except ValueError:
            raise RemoteError(f"{remote.label} sent an event that is not JSON: {payload[:80]!r}") from None
        if not isinstance(event, dict):
            raise RemoteError(f"{remote.label} sent an event that is not a JSON object")
        if event.get("error") is not None and not event.get("choices"):
            raise RemoteError(f"{remote.label} failed in the middle of the reply: "
                              f"{error_text(json.dumps(event).encode())}")
        yield event
    raise RemoteStreamCut(f"{remote.label} ended the reply without its end marker (the connection closed early)")
