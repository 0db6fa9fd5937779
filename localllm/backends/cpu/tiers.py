"""A first start in seconds: the few kernels a conversation cannot do without now, the rest compiled by
a background process.

Compiling every kernel a model uses takes ~30 s of one core (Gemma 3 270M Q4_K_M: ~100 kernels; the
multi-row prefill kernels and the re-laid Q4_K kernel are two thirds of it). On a cold start the
backend therefore begins in the *basic* tier:
- a matrix product of several rows goes row by row through the one-row kernel (`matvec`), where the
  multi-row kernels would have been used; products that go through BLAS still do;
- no matrix is re-laid (PackedWeights): the one-row kernel reads the file's layout;
- norms, RoPE and activations run their serial twins, attention one head at a time (attention_by_head),
  a prompt's attention through NumPy's matmul on the calling thread (attention_blas.BlasAttention);
- our kernels run on one thread: the compile has the other cores (on 2 cores, a parallel region whose
  second thread waits behind the compiling process took ~30 ms instead of microseconds).
Every one of these computes the same bits as the kernel it stands in for (the multi-row and re-laid
kernels equal the one-row kernel for every row, the serial twins the parallel kernels), so what a model
computes does not depend on the tier; only the speed does (tests/backends/cpu/test_tiers.py checks the logits).

Meanwhile `python -m localllm.backends.cpu.precompile MODEL` runs every op of that model's forward pass
on the model's own shapes and types, so that each kernel the *full* tier calls in `Model.generate` is
compiled into Numba's on-disk cache, then leaves a marker file. When that process has finished, the
backend switches to the full tier at the start of the next forward pass (loading a cached kernel takes
milliseconds; the server's batched paths, which the precompile does not run, still compile when first
called). A start that finds the marker begins in the full tier. A file over BASIC_TIER_MAX_BYTES, whose
prompts would be slow row by row, compiles when first called, as before.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

from ...runtime import Runtime

# Runtime.compile_mode (LOCALLLM_COMPILE): "background" (default) starts cold in the basic tier as above;
# "foreground" compiles each kernel when first called, as before.


def _machine_key(runtime: Runtime) -> str:
    """What Numba's cached code depends on besides the sources: its version, this CPU, the cache folder."""
    import llvmlite.binding as llvm
    import numba

    parts = (
        numba.__version__,
        llvm.get_host_cpu_name(),
        llvm.get_host_cpu_features().flatten(),
        runtime.numba_cache_dir,
    )
    return "\0".join(parts)


# The basic tier is for models whose prompts go fast row by row: each prompt row reads every weight once
# (the default model's per-layer matrices: ~60 MB, a few ms a row). An 8B Q4_K_M file (4.6 GB) would take
# ~0.5 s a row on one thread, more for a first prompt than the ~30 s compile it saves: such files compile
# when first called, as before.
BASIC_TIER_MAX_BYTES = 1 << 30


def fits_basic_tier(model_path) -> bool:
    return os.path.getsize(model_path) <= BASIC_TIER_MAX_BYTES


def marker_path(model_path, repack: bool, runtime: Optional[Runtime] = None) -> Path:
    """The file that says the full tier's kernels for this model are in the cache: named by a hash of
    the kernel sources, the machine (_machine_key), whether Q4_K matrices are re-laid (LOCALLLM_REPACK:
    another kernel) and the model file (path, size, modification time); in runtime's kernel folder
    (default: the settings resolved from the environment now)."""
    from ...jit import kernel_sources_hash

    runtime = runtime or Runtime.resolve()
    path = Path(model_path).resolve()
    stat = path.stat()
    key = "\0".join((kernel_sources_hash(), _machine_key(runtime), str(repack), str(path), str(stat.st_size), str(stat.st_mtime_ns)))
    return runtime.kernel_dir / f"prepared_{hashlib.sha256(key.encode()).hexdigest()[:24]}"


class BackgroundCompile:
    """The precompile process for one model file, and whether it has finished (`ready`)."""

    def __init__(self, model_path, repack: bool, runtime: Optional[Runtime] = None):
        self.model_path = Path(model_path)
        self.repack = repack
        self.runtime = (runtime or Runtime.resolve()).with_arguments(repack=repack)
        self.marker = marker_path(model_path, repack, self.runtime)
        self._finished = threading.Event()
        self._succeeded = False
        self._process = None

    @property
    def ready(self) -> bool:
        return self._succeeded

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def start(self) -> None:
        """Start the process (at low priority, in its own session: a Ctrl-C at the terminal is not for it)
        and a thread that waits for it. It goes on if this process exits first, so that the next start
        finds the cache full."""
        log = self.marker.with_suffix(".log")
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as err:  # appended: a second start's process may write beside the first's
            self._process = subprocess.Popen(
                [sys.executable, "-m", "localllm.backends.cpu.precompile", str(self.model_path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                start_new_session=True,
                env=self.runtime.precompile_environment(),
            )
        threading.Thread(target=self._wait, name="localllm-precompile", daemon=True).start()

    def _wait(self) -> None:
        # A failed process (its error is in the .log beside the marker) leaves the backend in the basic
        # tier: slower, never a stall to compile in the middle of a reply.
        self._succeeded = self._process.wait() == 0 and self.marker.exists()
        self._finished.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the process has finished (benchmarks, tests); whether the full tier is ready."""
        self._finished.wait(timeout)
        return self._succeeded


def prepared(model_path, repack: bool, runtime: Optional[Runtime] = None) -> bool:
    try:
        return marker_path(model_path, repack, runtime).exists()
    except OSError:
        return False
