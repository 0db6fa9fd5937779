"""Running the server: in the foreground (`serve`) or in a background thread (`BackgroundServer`)."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import LocalLLMError
from .app import DEFAULT_MAX_BODY_BYTES, ServerConfig, create_app
from .engine import DEFAULT_CACHE_MB, Engine

DEFAULT_CTX = 4096


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"  # loopback only unless asked: the API has no key by default
    port: int = 8080
    parallel: int = 4
    ctx: int = DEFAULT_CTX
    api_key: Optional[str] = None
    cache_mb: float = DEFAULT_CACHE_MB
    block_size: int = 16
    max_queue: int = 64
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    threads: Optional[int] = None
    warm_up: bool = True  # prepare the kernels on the engine's thread before listening (Engine.warm_up)


def model_id_of(model, name: Optional[str]) -> str:
    return name or Path(model.path).stem


def build_app(model, options: ServeOptions, model_id: Optional[str] = None):
    """The Starlette app and its (not yet started) engine for a loaded model."""
    engine = Engine(model, parallel=options.parallel, cache_mb=options.cache_mb, block_size=options.block_size,
                    max_queue=options.max_queue)
    ident = model_id_of(model, model_id)
    config = ServerConfig(ident, api_key=options.api_key, max_body_bytes=options.max_body_bytes,
                          aliases=(Path(model.path).stem, Path(model.path).name))
    return create_app(engine, config), engine


def _uvicorn_config(app, options: ServeOptions):
    import uvicorn

    return uvicorn.Config(app, host=options.host, port=options.port, log_level="warning", access_log=False,
                          timeout_graceful_shutdown=5)


def serve(model_name: Optional[str], options: ServeOptions, on_ready=None, warming_up=None) -> None:
    """Load the model and serve until interrupted. The engine starts and prepares its kernels first
    (options.warm_up: Engine.warm_up on its thread), inside the context manager warming_up() returns
    when given (the CLI's spinner); then on_ready(model, engine, model_id) runs, just before the socket
    opens (the CLI's banner)."""
    import uvicorn

    import localllm

    model = localllm.load(model_name, n_ctx=options.ctx, threads=options.threads)
    model.session = None  # the server's sequences live in the paged cache; free the default session's
    model_id = model_name if model_name and not Path(model_name).exists() else None
    app, engine = build_app(model, options, model_id)
    engine.start(warm_up=options.warm_up)
    try:
        with warming_up() if warming_up is not None else contextlib.nullcontext():
            _wait_ready(engine)
        if on_ready is not None:
            on_ready(model, engine, model_id_of(model, model_id))
        uvicorn.Server(_uvicorn_config(app, options)).run()
    finally:
        engine.stop()
        model.close()


def _wait_ready(engine: Engine) -> None:
    """Wait for a started engine's warm-up; a warm-up that failed is the server's start failing."""
    engine.ready.wait()
    if engine.warm_up_error is not None:
        raise LocalLLMError(f"preparing the kernels failed: {engine.warm_up_error}")


class BackgroundServer:
    """The server on a background thread, for tests and benchmarks. port=0 picks a free port."""

    def __init__(self, model, options: Optional[ServeOptions] = None, model_id: Optional[str] = None):
        import uvicorn

        self.options = options or ServeOptions(port=0)
        self.app, self.engine = build_app(model, self.options, model_id)
        self.model_id = model_id_of(model, model_id)
        self._server = uvicorn.Server(_uvicorn_config(self.app, self.options))
        self._server.install_signal_handlers = lambda: None  # not the main thread
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return self._server.servers[0].sockets[0].getsockname()[1]

    @property
    def base_url(self) -> str:
        return f"http://{self.options.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "BackgroundServer":
        self.engine.start(warm_up=self.options.warm_up)
        try:
            _wait_ready(self.engine)
        except LocalLLMError:
            self.engine.stop()
            raise
        self._thread = threading.Thread(target=self._server.run, name="localllm-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.engine.stop()
                raise LocalLLMError(f"the server did not start on {self.options.host}:{self.options.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.engine.stop()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
