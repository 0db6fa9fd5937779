"""The Runtime settings (localllm/runtime.py): resolved once from arguments and the environment, passed from
`localllm.load` to the backend; and importing the package has no effect (design rule 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localllm import host
from localllm.errors import LocalLLMError
from localllm.runtime import DEFAULT_SPINCOUNT, Runtime

HOME = Path.home()

# (environment, arguments) -> the fields expected to differ from DEFAULTS
CASES = [
    ({}, {}, {}),
    ({"LOCALLLM_REPACK": "0"}, {}, {"repack": False}),
    ({"LOCALLLM_REPACK": "1"}, {}, {}),
    ({"LOCALLLM_REPACK": "no"}, {}, {}),  # only "0" switches it off, as before
    ({"LOCALLLM_REPACK": "0"}, {"repack": True}, {}),  # an argument wins
    ({}, {"repack": False}, {"repack": False}),
    ({}, {"threads": 3}, {"threads": 3}),
    ({"LOCALLLM_COMPILE": "foreground"}, {}, {"compile_mode": "foreground"}),
    ({"LOCALLLM_COMPILE": " Foreground "}, {}, {"compile_mode": "foreground"}),
    ({"LOCALLLM_COMPILE": ""}, {}, {}),
    ({"XDG_CACHE_HOME": "/c"}, {}, {"kernel_dir": Path("/c/localllm/kernels"), "models_dir": Path("/c/localllm/models")}),
    ({"XDG_CACHE_HOME": ""}, {}, {}),  # empty: as unset
    ({"XDG_CACHE_HOME": "/c", "LOCALLLM_KERNEL_DIR": "~/k"}, {},
     {"kernel_dir": HOME / "k", "models_dir": Path("/c/localllm/models")}),
    ({"LOCALLLM_MODELS": "/m"}, {}, {"models_dir": Path("/m")}),
    ({"XDG_STATE_HOME": "/s"}, {}, {"history_path": Path("/s/localllm/history")}),
    ({"XDG_STATE_HOME": "/s", "LOCALLLM_HISTORY": "~/h"}, {}, {"history_path": HOME / "h"}),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, {}, {"openmp_spincount": None}),
    ({"GOMP_SPINCOUNT": "1000"}, {}, {"openmp_spincount": None}),
    ({"NUMBA_CACHE_DIR": "/n"}, {}, {"numba_cache_dir": "/n"}),
    ({"LOCALLLM_DEBUG": "1"}, {}, {"debug": True}),
    ({"LOCALLLM_DEBUG": "yes"}, {}, {}),
    ({"LOCALLLM_WEIGHTS": "Mapped"}, {}, {"weights": "mapped"}),
    ({"LOCALLLM_WEIGHTS": "copied"}, {}, {"weights": "copied"}),
    ({"LOCALLLM_WEIGHTS": ""}, {}, {}),
]

DEFAULTS = dict(
    threads=None, repack=True, compile_mode="background", kernel_dir=HOME / ".cache" / "localllm" / "kernels",
    models_dir=HOME / ".cache" / "localllm" / "models", history_path=HOME / ".local" / "state" / "localllm" / "history",
    openmp_spincount=DEFAULT_SPINCOUNT, numba_cache_dir="", debug=False, weights="auto",
)


@pytest.mark.parametrize("environ, arguments, changed", CASES)
def test_runtime_resolves_from_the_environment_and_the_arguments(environ, arguments, changed):
    runtime = Runtime.resolve(environ=environ, **arguments)
    assert runtime == Runtime(**{**DEFAULTS, **changed})


def test_an_unknown_compile_mode_is_refused_when_resolved():
    with pytest.raises(LocalLLMError, match="LOCALLLM_COMPILE must be one of background, foreground, got 'later'"):
        Runtime.resolve(environ={"LOCALLLM_COMPILE": "later"})


def test_an_unknown_weight_place_is_refused_when_resolved():
    with pytest.raises(LocalLLMError, match="LOCALLLM_WEIGHTS must be one of auto, copied, mapped, got 'disk'"):
        Runtime.resolve(environ={"LOCALLLM_WEIGHTS": "disk"})


def test_the_process_environment_is_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALLLM_KERNEL_DIR", str(tmp_path))
    monkeypatch.setenv("LOCALLLM_REPACK", "0")
    runtime = Runtime.resolve()
    assert runtime.kernel_dir == tmp_path and runtime.repack is False


def test_arguments_replace_only_what_they_give():
    runtime = Runtime.resolve(environ={"LOCALLLM_REPACK": "0"})
    assert runtime.with_arguments() is runtime
    assert runtime.with_arguments(threads=2) == Runtime(**{**DEFAULTS, "repack": False, "threads": 2})
    assert runtime.with_arguments(repack=True).repack is True


def test_the_background_compile_gets_the_runtimes_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("SOMETHING_ELSE", "kept")
    runtime = Runtime.resolve(repack=False, environ={"LOCALLLM_KERNEL_DIR": str(tmp_path)})
    env = runtime.precompile_environment()
    assert env["SOMETHING_ELSE"] == "kept"
    assert (env["LOCALLLM_COMPILE"], env["LOCALLLM_REPACK"], env["LOCALLLM_KERNEL_DIR"]) == ("foreground", "0", str(tmp_path))
    child = Runtime.resolve(environ=env)  # what the precompile process resolves
    assert (child.compile_mode, child.repack, child.kernel_dir) == ("foreground", False, tmp_path)


def test_load_passes_its_runtime_to_the_backend(tmp_path):
    import localllm
    from tiny_models import write_tiny_model

    path = write_tiny_model(tmp_path / "tiny.gguf", "llama", "Q4_K")
    runtime = Runtime.resolve(threads=2, repack=False, environ={"LOCALLLM_COMPILE": "foreground"})
    with localllm.load(path, n_ctx=32, runtime=runtime) as model:
        assert model.backend.runtime is runtime
        assert (model.backend.threads, model.backend.repack) == (2, False)
    with localllm.load(path, n_ctx=32, threads=1, runtime=runtime) as model:  # threads= wins, as before
        assert model.backend.threads == 1 and model.backend.runtime == runtime.with_arguments(threads=1)


def test_load_reads_ahead_where_the_backend_reads_the_mapping(tmp_path, monkeypatch):
    """Asked of the backend (reads_mapped_weights), no longer of its name: the CPU's ops read the mapped
    file, a device backend's read what upload copied."""
    import localllm
    from localllm import api
    from localllm.backends.base import Backend
    from localllm.backends.cpu import CPUBackend
    from localllm.backends.cuda import CUDABackend
    from tiny_models import write_tiny_model

    assert CPUBackend.reads_mapped_weights and not CUDABackend.reads_mapped_weights and not Backend.reads_mapped_weights
    path = write_tiny_model(tmp_path / "tiny.gguf", "llama", "Q8_0")
    calls = []
    monkeypatch.setattr(api, "read_ahead_if_small", calls.append)
    localllm.load(path, n_ctx=32, threads=1).close()
    assert len(calls) == 1
    monkeypatch.setattr(CPUBackend, "reads_mapped_weights", False)
    localllm.load(path, n_ctx=32, threads=1).close()
    assert len(calls) == 1


def test_the_host_facts():
    assert host.available_memory() > 0
    assert 1 <= host.physical_cores() <= (os.cpu_count() or 1)
    assert host.user_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x") and host.user_cache_dir({}) == HOME / ".cache"
    assert host.user_state_dir({}) == HOME / ".local" / "state"


# A fresh interpreter: what importing does to the environment and the threads, then what the first
# CPUBackend does (GOMP_SPINCOUNT in the environment before Numba's thread pool starts, which is when
# libgomp reads it), recorded by wrapping Numba's pool launch.
_PROBE = """
import json, os, sys, threading
before = dict(os.environ)
threads_before = threading.active_count()
import localllm, localllm.backends.cpu, localllm.api, localllm.runtime, localllm.host
from numba.np.ufunc import parallel
report = {"environ_unchanged": dict(os.environ) == before, "threads_before": threads_before,
          "threads_after": threading.active_count(), "pool_started": bool(parallel._is_initialized)}
launch = parallel._launch_threads
def recording_launch():
    report.setdefault("spincount_at_launch", os.environ.get("GOMP_SPINCOUNT"))
    launch()
parallel._launch_threads = recording_launch
if sys.argv[1] == "backend":
    localllm.backends.cpu.CPUBackend(threads=1)
    localllm.backends.cpu.CPUBackend(threads=1)  # a second one changes nothing more
    report["spincount_after"] = os.environ.get("GOMP_SPINCOUNT")
print(json.dumps(report))
"""


def _probe(what: str, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", _PROBE, what], capture_output=True, text=True, check=True,
                         env={**clean, **env}, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_package_changes_no_environment_and_starts_no_thread():
    report = _probe("import")
    assert report["environ_unchanged"]
    assert report["threads_after"] == report["threads_before"]
    assert not report["pool_started"]


def test_the_first_cpu_backend_bounds_openmp_spinning_before_the_pool_starts():
    report = _probe("backend")
    assert report["spincount_at_launch"] == DEFAULT_SPINCOUNT == report["spincount_after"]


@pytest.mark.parametrize("env, spincount", [({"OMP_WAIT_POLICY": "PASSIVE"}, None), ({"GOMP_SPINCOUNT": "5"}, "5")])
def test_a_users_openmp_policy_is_left_alone(env, spincount):
    report = _probe("backend", **env)
    assert report["spincount_at_launch"] == spincount == report["spincount_after"]
