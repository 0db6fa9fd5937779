"""Real engines in other processes for the remote tests: `localllm serve`, and llama-cpp-python's server."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

BANNER = re.compile(r"serving \S+ on (http://\S+)/v1")


class Engine:
    """A server process: its base URL (…/v1), its log file, and how to stop it."""

    def __init__(self, process: subprocess.Popen, url: str, log: Path):
        self.process, self.url, self.log = process, url, log

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def metric(self, name: str, key: str = None) -> float:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        text = httpx.get(self.url.removesuffix("/v1") + "/metrics", headers=headers, timeout=10).text
        return float(re.search(rf"^localllm_{name} (\S+)$", text, re.M).group(1))


def start_localllm(tmp: Path, *args: str, env: dict = None, name: str = "serve") -> Engine:
    """`localllm serve --port 0 ARGS` (the built-in model unless ARGS name one), once it listens."""
    log = tmp / f"{name}.log"
    command = [sys.executable, "-m", "localllm.cli.app", "serve", "--port", "0", "--ctx", "1024", *args]
    out = open(log, "w")
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {}),
                               "COLUMNS": "400"}, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        found = BANNER.search(log.read_text(errors="replace"))
        if found:
            return Engine(process, found.group(1) + "/v1", log)
        if process.poll() is not None:
            raise RuntimeError(f"localllm serve exited {process.returncode}: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"localllm serve did not start: {log.read_text()[-2000:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_cpp_python() -> str:
    """The Python that has llama-cpp-python's server (LLAMA_CPP_SERVER_PYTHON, else this one), or ""."""
    python = os.environ.get("LLAMA_CPP_SERVER_PYTHON", sys.executable)
    try:
        found = subprocess.run([python, "-c", "import llama_cpp.server.app"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return python if found.returncode == 0 else ""


def start_llama_cpp(tmp: Path, python: str, model: str, api_key: str) -> Engine:
    """`python -m llama_cpp.server` on `model` with an API key, once its /v1/models answers."""
    port = free_port()
    log = tmp / "llama_cpp_server.log"
    command = [python, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1", "--port", str(port),
               "--n_ctx", "1024", "--n_threads", "2", "--model_alias", "gemma", "--api_key", api_key]
    process = subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/models", timeout=2, headers={"Authorization": f"Bearer {api_key}"}).status_code == 200:
                return Engine(process, url, log)
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited {process.returncode}: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"llama_cpp.server did not start: {log.read_text()[-2000:]}")
