"""Backend registry: name -> factory. Adding a backend is one module plus one line here."""

from __future__ import annotations

from typing import Optional

from ..errors import LocalLLMError
from ..runtime import Runtime
from .base import Backend, Weight


def _cpu(runtime: Runtime):
    from .cpu import CPUBackend

    return CPUBackend(runtime=runtime)


def _cuda(runtime: Runtime):
    from .cuda import CUDABackend

    return CUDABackend(runtime.threads)


BACKENDS = {"cpu": _cpu, "cuda": _cuda}
BACKEND_CHOICES = ("auto", *BACKENDS)


def resolve_backend_name(name: str) -> str:
    """'auto' -> 'cuda' when numba-cuda sees a real device, else 'cpu'; other names unchanged."""
    if name != "auto":
        return name
    from .cuda import device_available

    return "cuda" if device_available() else "cpu"


def create_backend(name: str = "cpu", threads: Optional[int] = None, runtime: Optional[Runtime] = None) -> Backend:
    """The backend `name` with `runtime`'s settings (default: resolved from the environment now);
    `threads`, when given, in place of its own."""
    name = resolve_backend_name(name)
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise LocalLLMError(f"unknown backend {name!r} (available: {', '.join(BACKENDS)})") from None
    return factory((runtime or Runtime.resolve()).with_arguments(threads=threads))


__all__ = ["Backend", "Weight", "create_backend", "resolve_backend_name", "BACKENDS", "BACKEND_CHOICES"]
