"""Facts about the machine and the process that any part of localllm may ask for (a backend included: this
module imports nothing from localllm), and the one write localllm makes to its own environment.

Nothing here reads a LOCALLLM_* variable: settings are resolved in localllm/runtime.py, which passes the
environment to the directory conventions below.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping


def available_memory() -> int:
    """Bytes of memory available now (Linux's MemAvailable: free plus what the page cache gives back)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def well_within(nbytes: int, available: int) -> bool:
    """Whether nbytes take under half of `available` bytes of memory: what localllm lets a model take
    before it reads the whole file ahead or copies it (so that one that barely fits keeps room)."""
    return nbytes < available // 2


def transparent_huge_pages() -> bool:
    """Whether the kernel backs memory advised MADV_HUGEPAGE with 2 MiB pages (Linux's transparent huge
    pages set to "always" or "madvise"; False where it is "never" or there is no such setting)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            setting = f.read()
    except OSError:
        return False
    return "[always]" in setting or "[madvise]" in setting


def physical_cores() -> int:
    """Physical cores (hyper-threads share execution units, so they do not help memory-bound decode)."""
    try:
        with open("/proc/cpuinfo") as f:
            pairs = set()
            physical = core = None
            for line in f:
                if line.startswith("physical id"):
                    physical = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                    pairs.add((physical, core))
        if pairs:
            return max(1, min(len(pairs), len(os.sched_getaffinity(0))))
    except OSError:
        pass
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def user_cache_dir(environ: Mapping[str, str]) -> Path:
    """$XDG_CACHE_HOME, else ~/.cache (not created here)."""
    return Path(environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"))


def user_config_dir(environ: Mapping[str, str]) -> Path:
    """$XDG_CONFIG_HOME, else ~/.config (not created here)."""
    return Path(environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config"))


def user_state_dir(environ: Mapping[str, str]) -> Path:
    """$XDG_STATE_HOME, else ~/.local/state (not created here)."""
    return Path(environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state"))


def export_default(name: str, value: str) -> None:
    """Put name=value in this process's environment unless it is there already: for a native library
    that reads its settings from the environment when it loads (libgomp: runtime.Runtime.openmp_spincount),
    and for the processes this one starts."""
    os.environ.setdefault(name, value)
