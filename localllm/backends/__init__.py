"""Backend registry: name -> factory. Adding a backend is one module plus one line here."""

from __future__ import annotations

from ..errors import LocalLLMError
from .base import Backend, Weight


def _cpu(threads):
    from .cpu import CPUBackend

    return CPUBackend(threads)


BACKENDS = {"cpu": _cpu}


def create_backend(name: str = "cpu", threads: int | None = None) -> Backend:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise LocalLLMError(f"unknown backend {name!r} (available: {', '.join(BACKENDS)})") from None
    return factory(threads)


__all__ = ["Backend", "Weight", "create_backend", "BACKENDS"]
