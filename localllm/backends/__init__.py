"""Backend registry: name -> factory. Adding a backend is one module plus one line here."""

from __future__ import annotations

from ..errors import LocalLLMError
from .base import Backend, Weight


def _cpu(threads):
    from .cpu import CPUBackend

    return CPUBackend(threads)


def _cuda(threads):
    from .cuda import CUDABackend

    return CUDABackend(threads)


BACKENDS = {"cpu": _cpu, "cuda": _cuda}
BACKEND_CHOICES = ("auto", *BACKENDS)


def resolve_backend_name(name: str) -> str:
    """'auto' -> 'cuda' when numba-cuda sees a real device, else 'cpu'; other names unchanged."""
    if name != "auto":
        return name
    from .cuda import device_available

    return "cuda" if device_available() else "cpu"


def create_backend(name: str = "cpu", threads: int | None = None) -> Backend:
    name = resolve_backend_name(name)
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise LocalLLMError(f"unknown backend {name!r} (available: {', '.join(BACKENDS)})") from None
    return factory(threads)


__all__ = ["Backend", "Weight", "create_backend", "resolve_backend_name", "BACKENDS", "BACKEND_CHOICES"]
