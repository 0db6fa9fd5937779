"""A local stand-in for the Hugging Face Hub: the endpoints huggingface_hub 2.4 calls to find and fetch a file.

Point HF_ENDPOINT at `FakeHub.url`. What it serves, as the real Hub does (facts read from huggingface_hub's
hf_api.py, file_download.py and utils/_http.py):
  GET  /api/models/REPO[/revision/REV][?blobs=true]  -> JSON {id, sha, private, gated, siblings: [{rfilename,
       size, blobId, lfs: {sha256, size, pointerSize}}]}; unknown repo: 404 + X-Error-Code: RepoNotFound,
       unknown revision: 404 + X-Error-Code: RevisionNotFound.
  HEAD|GET /REPO/resolve/REV/FILE -> 302 to /cdn/SHA256 with X-Repo-Commit, X-Linked-Etag ("sha256"),
       X-Linked-Size (what get_hf_file_metadata reads); unknown file: 404 + X-Error-Code: EntryNotFound;
       gated repo without an accepted token: 401 (no token) or 403 (other token) + X-Error-Code: GatedRepo.
  HEAD|GET /cdn/SHA256 -> the bytes: 200, or 206 with Content-Range for `Range: bytes=START-[END]`, 416 past
       the end; ETag, Accept-Ranges, Content-Length always.

Failure switches, each taken by the next file transfer(s) in the order set: `drop_after(n)` (n body bytes,
then the connection is cut, as a dropped link does), `stall_after(n)` (n bytes, then it hangs until
`release()`), `fail_with(status)` (an HTTP error instead of the bytes); and `gate(repo, token)`.
`bytes_served` counts file bytes sent from /cdn/ (not JSON or headers), counted as they are handed to the socket.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote, urlsplit

import pytest

DEFAULT_BRANCH = "main"


@dataclass
class _Repo:
    files: dict[str, bytes] = field(default_factory=dict)
    advertised_sha256: dict[str, str] = field(default_factory=dict)  # what the Hub claims; may differ from the bytes
    gated_token: str | None = None  # gated: only this token may download
    commit: str = ""


class FakeHub:
    """A threaded HTTP server on 127.0.0.1 (port chosen by the OS); a context manager."""

    def __init__(self) -> None:
        self._repos: dict[str, _Repo] = {}
        self._blobs: dict[str, bytes] = {}  # /cdn/<sha256 of the real bytes>
        self._lock = threading.Lock()
        self._faults: list[tuple[str, int]] = []  # ("drop"|"stall", bytes) or ("status", code), next first
        self._released = threading.Event()
        self.stalled = threading.Event()  # set once a stalled transfer has sent its bytes
        self.bytes_served = 0
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers)
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    # --- set-up ---

    def add_file(self, repo_id: str, filename: str, data: bytes, *, sha256: str | None = None) -> None:
        """Serve `data` as repo_id/filename; `sha256` overrides the advertised LFS hash (a mismatch test)."""
        real = hashlib.sha256(data).hexdigest()
        with self._lock:
            repo = self._repos.setdefault(repo_id, _Repo())
            repo.files[filename] = data
            repo.advertised_sha256[filename] = sha256 or real
            repo.commit = hashlib.sha1(repr(sorted(repo.advertised_sha256.items())).encode()).hexdigest()
            self._blobs[real] = data

    def gate(self, repo_id: str, token: str) -> None:
        """Make a repo gated: downloads need `Authorization: Bearer <token>`."""
        self._repos[repo_id].gated_token = token

    def drop_after(self, n_bytes: int, times: int = 1) -> None:
        """The next `times` file transfers send `n_bytes` of body, then the connection is cut."""
        self._faults.extend([("drop", n_bytes)] * times)

    def stall_after(self, n_bytes: int) -> None:
        """The next file transfer sends `n_bytes`, sets `stalled`, then hangs until `release()`."""
        self._released.clear()
        self.stalled.clear()
        self._faults.append(("stall", n_bytes))

    def fail_with(self, status: int, times: int = 1) -> None:
        """The next `times` file transfers answer HTTP `status` (e.g. 503) instead of the bytes."""
        self._faults.extend([("status", status)] * times)

    def release(self) -> None:
        self._released.set()

    def commit_of(self, repo_id: str) -> str:
        return self._repos[repo_id].commit

    # --- lifecycle ---

    def __enter__(self) -> "FakeHub":
        hub = self

        class Handler(_HubHandler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="fake-hub", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    # --- used by the handler ---

    def _next_fault(self) -> tuple[str, int] | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    def _count(self, n: int) -> None:
        with self._lock:
            self.bytes_served += n


_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects; every response has a Content-Length
    fake: FakeHub

    def log_message(self, *args) -> None:  # quiet test output
        pass

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def _route(self, body: bool) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        self.fake.requests.append((self.command, path, dict(self.headers)))
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?", path):
            return self._model_info(match[1], match[2], "blobs=true" in parts.query, body)
        if match := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            return self._resolve(match[1], match[2], match[3], body)
        if match := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
            return self._blob(match[1], body)
        self._reply(404, b"not found", body=body)

    def _reply(self, status: int, payload: bytes = b"", headers: dict[str, str] | None = None, body=True) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def _error(self, status: int, code: str, body: bool) -> None:
        self._reply(status, json.dumps({"error": code}).encode(), {"X-Error-Code": code}, body)

    def _repo(self, repo_id: str, revision: str | None) -> _Repo | str:
        repo = self.fake._repos.get(repo_id)
        if repo is None:
            return "RepoNotFound"
        if revision not in (None, DEFAULT_BRANCH, repo.commit):
            return "RevisionNotFound"
        return repo

    def _model_info(self, repo_id: str, revision: str | None, blobs: bool, body: bool) -> None:
        repo = self._repo(repo_id, revision)
        if isinstance(repo, str):
            return self._error(404, repo, body)
        siblings = []
        for name, data in repo.files.items():
            entry = {"rfilename": name}
            if blobs:
                sha = repo.advertised_sha256[name]
                entry.update(size=len(data), blobId=hashlib.sha1(data).hexdigest(),
                             lfs={"sha256": sha, "size": len(data), "pointerSize": 134})
            siblings.append(entry)
        info = {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                "gated": "manual" if repo.gated_token else False, "siblings": siblings}
        self._reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)

    def _resolve(self, repo_id: str, revision: str, filename: str, body: bool) -> None:
        repo = self._repo(repo_id, revision)
        if isinstance(repo, str):
            return self._error(404, repo, body)
        if repo.gated_token is not None:
            given = self.headers.get("Authorization")
            if given is None:
                return self._error(401, "GatedRepo", body)
            if given != f"Bearer {repo.gated_token}":
                return self._error(403, "GatedRepo", body)
        if filename not in repo.files:
            return self._error(404, "EntryNotFound", body)
        data, sha = repo.files[filename], repo.advertised_sha256[filename]
        real = hashlib.sha256(data).hexdigest()
        self._reply(302, b"", {
            "Location": f"/cdn/{real}?filename={quote(filename)}",
            "X-Repo-Commit": repo.commit, "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
            "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
        }, body)

    def _blob(self, sha: str, body: bool) -> None:
        data = self.fake._blobs.get(sha)
        if data is None:
            return self._reply(404, b"no such blob", body=body)
        start, end, status = 0, len(data) - 1, 200
        headers = {"ETag": f'"{sha}"', "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if (wanted := self.headers.get("Range")) and (match := _RANGE.fullmatch(wanted.strip())):
            start = int(match[1])
            end = min(int(match[2]), len(data) - 1) if match[2] else len(data) - 1
            if start >= len(data):
                return self._reply(416, b"", {"Content-Range": f"bytes */{len(data)}"}, body)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        fault = self.fake._next_fault() if body else None
        if fault is not None and fault[0] == "status":
            return self._reply(fault[1], b"fake failure", body=body)
        self._send_body(status, headers, data[start : end + 1], body, fault)

    def _send_body(self, status: int, headers: dict[str, str], payload: bytes, body: bool, fault) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if not body:
            return
        cut = fault[1] if fault is not None else None
        # Count before writing: the client can read the last byte, finish and let the test read
        # bytes_served before this thread runs again (a race CI hit with count-after-write).
        if cut is None or cut >= len(payload):
            self.fake._count(len(payload))
            self.wfile.write(payload)
            return
        self.fake._count(cut)
        self.wfile.write(payload[:cut])
        self.wfile.flush()
        if fault[0] == "stall":
            self.fake.stalled.set()
            self.fake._released.wait(timeout=30)
        self.close_connection = True
        try:  # a dropped link: the client sees the body end before its Content-Length
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """A running FakeHub with HF_ENDPOINT pointing at it; no token, offline mode, proxy or telemetry.

    HF_HOME points into tmp_path (for subprocesses); in this process huggingface_hub computed its token path
    at import, so that constant is pointed there too: a real `hf auth login` token never reaches the fake.
    """
    from huggingface_hub import constants

    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
        # huggingface_hub's first request in a process fetches {ENDPOINT}/api/agent-harnesses for its
        # user-agent string, with ENDPOINT read at import (so possibly the real Hub): switched off.
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        yield hub
