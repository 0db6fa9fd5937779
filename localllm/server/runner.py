"""Running the server: in the foreground (`serve`) or in a background thread (`BackgroundServer`)."""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..engine.batching import DEFAULT_CACHE_MB, Engine
from ..errors import LocalLLMError
from .app import DEFAULT_MAX_BODY_BYTES, ServerConfig, create_app

@dataclass
class ServeOptions:
    host: str = "127.0.0.1"  # loopback only unless asked: the API has no key by default
    port: int = 8080
    parallel: int = 4
    ctx: Optional[int] = None  # None: localllm.api.default_context (4096, or the trained length if shorter)
    api_key: Optional[str] = None
    cache_mb: float = DEFAULT_CACHE_MB
    block_size: int = 16
    max_queue: int = 64
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    threads: Optional[int] = None
    lookup: bool = False  # speculative decoding by prompt lookup in every sequence (Engine's speculation)
    draft_max: int = 8  # the most tokens a sequence drafts per step (1..speculative.MAX_DRAFT)
    draft: Optional[str] = None  # a draft model (path or name) with the model's vocabulary: every sequence drafts with it
    warm_up: bool = True  # prepare the kernels on the engine's thread before listening (Engine.warm_up)
    access_log: Optional[Callable[[str], None]] = None  # called with one line per request (access_log.py)
    # The gateway's routes (server/gateway.py): a name requests may give -> the remote.config.Remote(s) serving it
    routes: dict = field(default_factory=dict)
    notify: Optional[Callable[[str], None]] = None  # a route's notices (a remote unreachable); None: logged


def _listed_name(path: Path) -> Optional[str]:
    """The name `localllm list` shows for a file of the models directory (gemma-3-270m for the default,
    the registry name for a pulled file), None for a file elsewhere or when it cannot be told."""
    from ..hub.local import local_name
    from ..hub.store import models_dir

    try:
        if path.resolve().parent != models_dir().resolve():
            return None
        return local_name(path)
    except (LocalLLMError, OSError):
        return None


def _registry_choice(path: Path):
    """The registry entry and quant this file is (by the pull index, else by file name), or None."""
    from ..hub.pull import pulled_records
    from ..hub.registry import default_registry

    try:
        record = pulled_records(path.parent).get(path.name)
        registry = default_registry()
        return registry.by_file(record.repo_id, record.filename) if record else registry.by_file(None, path.name)
    except (LocalLLMError, OSError):  # a broken registry must not stop the server
        return None


def model_id_of(model, name: Optional[str]) -> str:
    """The id the server answers with: the name it was started with, else the file's listed name
    (`localllm list`), else the file's stem."""
    return name or _listed_name(Path(model.path)) or Path(model.path).stem


def served_names(model, name: Optional[str]) -> list:
    """Every name a request may give the served model: its id, the file's stem and name, its listed
    name, and every registry name of the same file (for a pulled llama-3.1-8b-instruct-q4_k_m:
    llama-3.1-8b-instruct, llama-3.1-8b, llama-3.1-8b-q4 ...)."""
    path = Path(model.path)
    names = [model_id_of(model, name), path.stem, path.name, _listed_name(path)]
    choice = _registry_choice(path)
    if choice is not None:
        from ..hub.registry import default_registry

        names += [typed for typed, other in default_registry().names.items() if other == choice]
    return [n for n in dict.fromkeys(names) if n]


def build_app(model, options: ServeOptions, model_id: Optional[str] = None):
    """The ASGI app and its (not yet started) engine for a loaded model."""
    from ..speculative import Speculation

    speculation = None
    if options.lookup or options.draft:
        speculation = Speculation(lookup=options.lookup, draft=_draft_model(model, options), max_draft=options.draft_max)
    engine = Engine(model, parallel=options.parallel, cache_mb=options.cache_mb, block_size=options.block_size,
                    max_queue=options.max_queue, speculation=speculation)
    from .gateway import RemoteRoutes

    names = served_names(model, model_id)
    clash = [name for name in options.routes if name.strip().lower() in {n.lower() for n in names}]
    if clash:
        raise LocalLLMError(f"--route {clash[0]}: that name is the local model's")
    config = ServerConfig(names[0], api_key=options.api_key, max_body_bytes=options.max_body_bytes,
                          aliases=tuple(names[1:]), access_log=options.access_log,
                          routes=RemoteRoutes(options.routes, notify=options.notify))
    return create_app(engine, config), engine


def _draft_model(model, options: ServeOptions):
    """The draft model of options.draft, loaded with the model's context (None without one); a LocalLLMError
    when the KV caches it takes (one per decoding sequence, options.parallel at most) would not fit in the
    memory available now (NumPy allocates them lazily: too many would fail later, mid-request)."""
    if not options.draft:
        return None
    from ..api import load_path
    from ..host import available_memory
    from ..hub.resolve import resolve_model

    draft = load_path(resolve_model(options.draft), n_ctx=model.n_ctx, threads=options.threads)
    needed, available = draft.memory.kv_bytes * options.parallel, available_memory()
    if needed > available:
        draft.close()
        raise LocalLLMError(f"--draft: {options.parallel} sequences' KV caches of the draft model need "
                            f"{needed / 2**30:.1f} GiB ({draft.memory.kv_bytes / 2**20:.0f} MiB each for {model.n_ctx} "
                            f"tokens) and {available / 2**30:.1f} GiB is available: lower --parallel or --ctx")
    return draft


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (port 0: any free one), not yet listening; a port in use or an
    address this machine does not have is a LocalLLMError of one line."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise LocalLLMError(f"cannot listen on {host}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        # As uvicorn does: a restarted server may take over a port whose old connections are in TIME_WAIT;
        # a port another socket listens on is still refused (EADDRINUSE).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise LocalLLMError(_bind_failure(host, port, exc)) from None
    return sock


def _bind_failure(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is already in use; choose another with --port (0: any free port)"
    if exc.errno == errno.EACCES:
        return f"no permission to listen on port {port} (ports below 1024 need privileges); choose another with --port"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}: this machine has no such address"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


def base_url(sock: socket.socket) -> str:
    """http://HOST:PORT of a bound socket, with the port actually bound (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


def _uvicorn_config(app, options: ServeOptions):
    import uvicorn

    return uvicorn.Config(app, host=options.host, port=options.port, log_level="warning", access_log=False,
                          timeout_graceful_shutdown=5)


def serve(model_name: Optional[str], options: ServeOptions, on_ready=None, warming_up=None) -> None:
    """Load the model and serve until interrupted. The socket is bound right after the model loads (a
    port in use fails before the kernels are prepared); the engine then starts and prepares its kernels
    (options.warm_up: Engine.warm_up on its thread), inside the context manager warming_up() returns
    when given (the CLI's spinner); then on_ready(model, engine, model_id, url) runs, url naming the
    port actually bound, once the socket listens (the CLI's banner): connections from then on wait in its
    backlog until uvicorn accepts them."""
    import uvicorn

    import localllm

    model = localllm.load(model_name, n_ctx=options.ctx, threads=options.threads)
    model.session = None  # the server's sequences live in the paged cache; free the default session's
    try:
        sock = bind_socket(options.host, options.port)
    except BaseException:
        model.close()
        raise
    model_id = model_name if model_name and not Path(model_name).exists() else None
    app, engine = build_app(model, options, model_id)
    engine.start(warm_up=options.warm_up)
    try:
        with warming_up() if warming_up is not None else contextlib.nullcontext():
            _wait_ready(engine)
        # Listening before the banner: a client that connects as soon as it reads it waits in the backlog
        # until uvicorn accepts, rather than being refused (uvicorn listens again, with the same backlog).
        config = _uvicorn_config(app, options)
        sock.listen(config.backlog)
        if on_ready is not None:
            on_ready(model, engine, model_id_of(model, model_id), base_url(sock))
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
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
        self._socket: Optional[socket.socket] = None

    @property
    def port(self) -> int:
        return self._socket.getsockname()[1]

    @property
    def base_url(self) -> str:
        return base_url(self._socket)

    def start(self, timeout: float = 30.0) -> "BackgroundServer":
        self._socket = bind_socket(self.options.host, self.options.port)
        self.engine.start(warm_up=self.options.warm_up)
        try:
            _wait_ready(self.engine)
        except LocalLLMError:
            self.engine.stop()
            self._socket.close()
            raise
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="localllm-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.engine.stop()
                self._socket.close()
                raise LocalLLMError(f"the server did not start on {self.options.host}:{self.options.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.engine.stop()
        if self._socket is not None:
            self._socket.close()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
