"""A model name -> what serves it: a local .gguf file or a Remote.

Order: a `remote:` reference is that remote; a name a route of the config file matches goes to the route's
targets in order (the first that can serve it wins; each one passed over is announced in one line); any
other name resolves locally (hub/resolve.py: the default model, a path, the models directory, a pull).

A route passes over a target when
  - it is local and its weights plus KV cache (at the default context) exceed the memory available now,
    or it is not on this machine and a later target is (the last target is pulled as `run` would pull it);
  - it is a remote that cannot be reached (connection refused, unknown host, no answer in 10 s).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Optional, Union

from ..errors import LocalLLMError
from .config import Remote, RemoteConfig, is_remote_reference, load_config, parse_reference

log = logging.getLogger(__name__)

Target = Union[Path, Remote]


def resolve_target(name: Optional[str], *, allow_pull=None, progress=None, config: Optional[RemoteConfig] = None,
                   notify: Optional[Callable[[str], None]] = None, available: Optional[int] = None,
                   reachable: Optional[Callable[[Remote], Optional[str]]] = None) -> Target:
    """What serves `name`. `notify` gets the one-line notice of each target passed over (default: a
    logged warning); `available` bytes of memory stand in for the memory available now; `reachable`
    returns None for a remote that answers, else why not (default: probe)."""
    from ..hub.resolve import resolve_model

    notify = notify or log.warning
    if is_remote_reference(name):
        return parse_reference(name, config)
    if name is not None and not Path(name).expanduser().exists():
        config = config if config is not None else load_config()
        route = config.route_for(name)
        if route is not None:
            return _follow(name, route.targets, config, allow_pull, progress, notify, available, reachable or probe)
    return resolve_model(name, allow_pull=allow_pull, progress=progress)


def _follow(name, targets, config, allow_pull, progress, notify, available, reachable) -> Target:
    from ..hub.resolve import resolve_local, resolve_model

    for index, target in enumerate(targets):
        last = index == len(targets) - 1
        following = "" if last else f"; trying {targets[index + 1]}"
        if is_remote_reference(target):
            remote = parse_reference(target, config)
            problem = None if last else reachable(remote)
            if problem is None:
                return remote
            notify(f"note: {remote.label} for '{name}' is unreachable ({problem}){following}")
            continue
        path = resolve_model(target, allow_pull=allow_pull, progress=progress) if last else resolve_local(target)
        if path is None:
            notify(f"note: {target} for '{name}' is not on this machine{following}")
            continue
        problem = None if last else _too_large(path, available)
        if problem is None:
            return path
        notify(f"note: {target} for '{name}' {problem}{following}")
    raise LocalLLMError(f"no target of the route for '{name}' can serve it")  # the last one returns or raises


def _too_large(path: Path, available: Optional[int]) -> Optional[str]:
    """Why the model at `path` does not fit in memory now (weights + KV cache at the default context), or None."""
    from ..api import estimate_memory
    from ..host import available_memory

    memory = estimate_memory(path)
    available = available_memory() if available is None else available
    if memory.total_bytes <= available:
        return None
    return f"needs {memory.total_bytes / 2**30:.1f} GiB of memory and {available / 2**30:.1f} GiB is available"


def probe(remote: Remote) -> Optional[str]:
    """None when the remote accepts a connection and answers its model list (any status), else why not."""
    from .client import Client, RemoteError, RemoteUnreachable

    client = Client(remote, retries=0)
    try:
        client.get_json("/models")
    except RemoteUnreachable as exc:
        return str(exc).rsplit(": ", 1)[-1]
    except RemoteError:
        return None  # it answered: an error of its own is the request's to report
    finally:
        client.close()
    return None


def open_target(target: Target, *, n_ctx=None, threads=None, backend: str = "cpu", runtime=None):
    """A loaded Model for a path, a RemoteModel for a Remote."""
    if isinstance(target, Remote):
        from .model import RemoteModel

        return RemoteModel(target)
    from ..api import load_path

    return load_path(target, n_ctx=n_ctx, threads=threads, backend=backend, runtime=runtime)
