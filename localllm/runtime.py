"""The process's settings, resolved once from arguments and the environment and passed down.

`localllm.load` resolves a Runtime (or takes the caller's) and hands it to the backend it creates; the
backends, the tier marker and the background compile read their settings from it, never from the
environment. This module is the one place localllm reads its environment variables:

| variable                         | setting                          | default                                  |
|----------------------------------|----------------------------------|------------------------------------------|
| LOCALLLM_REPACK                  | repack ("0": off)                | on                                       |
| LOCALLLM_COMPILE                 | compile_mode                     | background                               |
| LOCALLLM_WEIGHTS                 | weights                          | auto                                     |
| LOCALLLM_KERNEL_DIR              | kernel_dir                       | $XDG_CACHE_HOME/localllm/kernels         |
| LOCALLLM_MODELS                  | models_dir                       | $XDG_CACHE_HOME/localllm/models          |
| LOCALLLM_HISTORY                 | history_path                     | $XDG_STATE_HOME/localllm/history         |
| LOCALLLM_CONFIG                  | config_path (remotes, routes)    | $XDG_CONFIG_HOME/localllm/config.toml    |
| LOCALLLM_DEBUG                   | debug ("1": on)                  | off                                      |
| OMP_WAIT_POLICY, GOMP_SPINCOUNT  | openmp_spincount (None when set) | DEFAULT_SPINCOUNT                        |
| NUMBA_CACHE_DIR                  | numba_cache_dir (keys the marker)| ""                                       |

(XDG_CACHE_HOME defaults to ~/.cache, XDG_STATE_HOME to ~/.local/state, XDG_CONFIG_HOME to ~/.config:
host.py.) A remote engine's API key is read from the variable its entry in the config file names
(`api_key_env`; LOCALLLM_REMOTE_API_KEY for a `remote:URL` reference), by `secret` below, when a request
is sent. The CLI's option
variables (LOCALLLM_THREADS, LOCALLLM_CTX, ...) are Typer's, read with the command line; HF_ENDPOINT is
the Hugging Face client's own (hub/pull.py) and NUMBA_ENABLE_CUDASIM Numba's (backends/cuda).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Optional

from . import host
from .errors import LocalLLMError

# "background" (default) starts cold in the basic tier (backends/cpu/tiers.py); "foreground" compiles each
# kernel when first called (the test suite, and processes that want one code path).
COMPILE_MODES = ("background", "foreground")

# Where the CPU backend keeps the weights it reads (backends/cpu/weight_memory.py): "copied" into huge-page
# memory at load, "mapped" (read where they lie in the file's mapping, llama.cpp's default), or "auto":
# copied when the machine has transparent huge pages and the model fits well within its memory.
WEIGHT_PLACES = ("auto", "copied", "mapped")

# Spins before an idle OpenMP worker sleeps (GOMP_SPINCOUNT), set when the user chose no waiting policy.
# libgomp's own default (300,000, when the variables are unset) keeps a worker spinning far longer than
# the gaps inside a decode step need, taking CPU from other processes between steps; 30,000 covered the
# gaps about as well (100-104 tok/s against 110-112 in the same runs; 3,000 did not: 57-101). Why the
# workers spin at all: backends/cpu/threads.py.
DEFAULT_SPINCOUNT = "30000"

@dataclass(frozen=True)
class Runtime:
    threads: Optional[int]  # None: the backend's default (the CPU: host.physical_cores())
    repack: bool  # re-lay matrices at their first product (backends/cpu/matmul.PackedWeights, TiledWeights)
    compile_mode: str  # one of COMPILE_MODES
    kernel_dir: Path  # generated CPU kernels and the tier markers
    models_dir: Path  # the local models directory (hub/store.py)
    history_path: Path  # chat's readline history
    openmp_spincount: Optional[str]  # GOMP_SPINCOUNT for the OpenMP pool; None: the user's own policy
    numba_cache_dir: str = ""  # NUMBA_CACHE_DIR as given ("" when unset)
    debug: bool = False  # tracebacks on errors (the CLI)
    weights: str = "auto"  # one of WEIGHT_PLACES

    @classmethod
    def resolve(cls, threads: Optional[int] = None, repack: Optional[bool] = None,
                environ: Optional[Mapping[str, str]] = None) -> "Runtime":
        """The settings from the arguments (those not None win) and `environ` (default: this process's)."""
        env = os.environ if environ is None else environ
        return cls(
            threads=threads,
            repack=repack_setting(env) if repack is None else bool(repack),
            compile_mode=compile_mode(env),
            kernel_dir=kernel_dir(env),
            models_dir=models_dir(env),
            history_path=history_path(env),
            openmp_spincount=openmp_spincount(env),
            numba_cache_dir=env.get("NUMBA_CACHE_DIR", ""),
            debug=debug(env),
            weights=weight_place(env),
        )

    def with_arguments(self, threads: Optional[int] = None, repack: Optional[bool] = None) -> "Runtime":
        """These settings with the arguments that are not None in place of their own."""
        changes = {k: v for k, v in (("threads", threads), ("repack", repack)) if v is not None}
        return replace(self, **changes) if changes else self

    def precompile_environment(self) -> dict:
        """The environment of the background compile (backends/cpu/tiers.py): this process's, with every
        kernel compiled when first called and this runtime's repacking and kernel folder."""
        return {**os.environ, "LOCALLLM_COMPILE": "foreground", "LOCALLLM_REPACK": "1" if self.repack else "0",
                "LOCALLLM_KERNEL_DIR": str(self.kernel_dir)}


def _env(environ: Optional[Mapping[str, str]]) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def repack_setting(environ: Optional[Mapping[str, str]] = None) -> bool:
    return _env(environ).get("LOCALLLM_REPACK", "1") != "0"


def compile_mode(environ: Optional[Mapping[str, str]] = None) -> str:
    mode = _env(environ).get("LOCALLLM_COMPILE", "background").strip().lower() or "background"
    if mode not in COMPILE_MODES:
        raise LocalLLMError(f"LOCALLLM_COMPILE must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    return mode


def weight_place(environ: Optional[Mapping[str, str]] = None) -> str:
    place = _env(environ).get("LOCALLLM_WEIGHTS", "auto").strip().lower() or "auto"
    if place not in WEIGHT_PLACES:
        raise LocalLLMError(f"LOCALLLM_WEIGHTS must be one of {', '.join(WEIGHT_PLACES)}, got {place!r}")
    return place


def kernel_dir(environ: Optional[Mapping[str, str]] = None) -> Path:
    env = _env(environ)
    configured = env.get("LOCALLLM_KERNEL_DIR")
    if configured:
        return Path(configured).expanduser()
    return host.user_cache_dir(env) / "localllm" / "kernels"


def models_dir(environ: Optional[Mapping[str, str]] = None) -> Path:
    """$LOCALLLM_MODELS, else <user cache>/localllm/models. Not created here."""
    env = _env(environ)
    configured = env.get("LOCALLLM_MODELS")
    if configured:
        return Path(configured).expanduser()
    return host.user_cache_dir(env) / "localllm" / "models"


def config_path(environ: Optional[Mapping[str, str]] = None) -> Path:
    """$LOCALLLM_CONFIG, else <user config>/localllm/config.toml: remote engines and routes
    (localllm/remote/config.py). Not created here; a missing file is an empty configuration."""
    env = _env(environ)
    configured = env.get("LOCALLLM_CONFIG")
    if configured:
        return Path(configured).expanduser()
    return host.user_config_dir(env) / "localllm" / "config.toml"


def secret(name: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The value of environment variable `name` (an API key), None when unset or empty."""
    return _env(environ).get(name) or None


def history_path(environ: Optional[Mapping[str, str]] = None) -> Path:
    env = _env(environ)
    configured = env.get("LOCALLLM_HISTORY")
    if configured:
        return Path(configured).expanduser()
    return host.user_state_dir(env) / "localllm" / "history"


def openmp_spincount(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """DEFAULT_SPINCOUNT, or None when the user set OpenMP's waiting policy or spin count themselves."""
    env = _env(environ)
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return None
    return DEFAULT_SPINCOUNT


def debug(environ: Optional[Mapping[str, str]] = None) -> bool:
    return _env(environ).get("LOCALLLM_DEBUG") == "1"
