"""Where the conformance suite runs each backend of the registry, and on which sizes.

The CPU backend (and any backend without a special case here) runs in the test process. The CUDA backend
runs under numba's CUDA simulator in a child process (simulator_worker.py): NUMBA_ENABLE_CUDASIM=1 must
be set before numba.cuda is first imported and must not reach this process, whose CPU kernels JIT
normally. With LOCALLLM_CUDA_FULL=1 (a machine with an NVIDIA GPU and numba-cuda) it runs in this
process on the device instead, at the full sizes.
"""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import conformance_runs

HERE = Path(__file__).parent
CPU_THREADS = 2  # two: the parallel kernels split their work, whatever the machine
REPLY_TIMEOUT_S = 600  # one simulated op takes seconds; ten minutes means the child hangs


@dataclass(frozen=True)
class AttentionCase:
    name: str
    n_tokens: int
    start: int
    window: int
    n_head: int
    n_kv: int
    head_dim: int
    softcap: float = 0.0  # Gemma 2's soft cap of the scores (0: none); 0.8 bends scores of N(0, 1)
    sinks: bool = False  # gpt-oss's attention sinks: one logit per query head in the softmax


@dataclass(frozen=True)
class Profile:
    """The sizes a backend is tested on (each test says what its sizes reach)."""

    n_out: int  # matmul weight rows
    k: int  # matmul inputs (a multiple of 256 for the K-quants)
    batches: tuple[int, ...]  # matmul activation rows
    rows_batches: tuple[int, ...]  # matmul_rows activation rows
    bounds: tuple[int, ...]  # matmul_segments cuts
    f16_patterns: int  # float16 / bfloat16 bit patterns decoded through embed (65536: all)
    norm_shapes: tuple[tuple[int, ...], ...]
    rope_shapes: tuple[tuple[int, int, int, int], ...]  # (T, H, D, n_rot)
    attention: tuple[AttentionCase, ...]
    kv_rows: tuple[int, ...]
    kv_head_dim: int
    paged_sequences: tuple[tuple[int, int], ...]  # (first position, rows) of each sequence in the step
    act_shapes: tuple[tuple[int, int], ...]


ATTENTION_SMALL = (
    AttentionCase("prefill", 5, 0, 0, 4, 2, 16),  # causal from an empty cache, GQA 2:1
    AttentionCase("decode", 1, 9, 0, 4, 1, 16),  # one row at start > 0, GQA 4:1
    AttentionCase("batch", 3, 6, 0, 4, 2, 16),  # rows at start > 0
    AttentionCase("window", 3, 6, 4, 4, 2, 16),  # sliding window of 4 over a cache past it
    AttentionCase("window-prefill", 9, 0, 4, 4, 1, 16),
    AttentionCase("mha", 2, 3, 0, 2, 2, 16),  # one query head per kv head
    AttentionCase("softcap", 3, 6, 4, 4, 2, 16, softcap=0.8),
    AttentionCase("sinks", 3, 6, 4, 4, 2, 16, sinks=True),
)

# The CPU backend's paths, by size (today's thresholds; test_cpu_profile_crosses_the_cpu_thresholds
# checks these sizes still reach both sides of each): matmul rows 2..17 walk the multi-row kernels'
# groups (pairs of rows in eights, fours, twos and an odd row; tiles of 16 weight rows from 16
# activation rows, with N = 38 leaving 6 rows to the row kernels), 33 rows cross BLAS_MIN_ROWS (32:
# dequantized tiles and BLAS for the types without multi-row kernels); small ops above SMALL_OP_WORK
# elements run the parallel kernels, below it the serial twins; kv_store from 16 rows converts in a
# kernel; attention from 32 rows goes through BLAS in query blocks of 64, decode above
# SMALL_ATTENTION_WORK through the parallel kernel; a paged sequence of 32 rows or more through BLAS.
FULL = Profile(
    n_out=38,
    k=512,
    batches=(1, *range(2, 18), 33),
    rows_batches=(5, 17),
    bounds=(0, 1, 3, 36, 38),
    f16_patterns=65536,
    norm_shapes=((3, 2, 48), (130, 512)),
    rope_shapes=((3, 2, 16, 12), (1, 4, 16, 16), (40, 8, 256, 256)),
    attention=ATTENTION_SMALL + (
        AttentionCase("decode-parallel", 3, 200, 0, 8, 2, 64),  # 3*8*203*64 work > 2^18
        AttentionCase("blas-prefill", 70, 0, 0, 4, 1, 32),  # two query blocks
        AttentionCase("blas-window", 40, 10, 5, 4, 2, 32),
        AttentionCase("softcap-parallel", 3, 200, 0, 8, 2, 64, softcap=0.8),
        AttentionCase("softcap-blas", 40, 10, 5, 4, 2, 32, softcap=0.8),
        AttentionCase("sinks-parallel", 3, 200, 0, 8, 2, 64, sinks=True),
        AttentionCase("sinks-blas", 40, 10, 5, 4, 2, 32, sinks=True),
    ),
    kv_rows=(1, 40),
    kv_head_dim=64,
    paged_sequences=((6, 1), (8, 2), (3, 34)),
    act_shapes=((3, 40), (40, 2048)),
)

# The simulator runs each CUDA thread as a Python thread (launch.SIMULATOR's tiny blocks): tiny shapes.
# Its paths: matvec for T < 8 (launch.MAX_VEC_T), dequantize + tiled GEMM from 8 rows (9: not a multiple
# of the 8x8 tile), matmul_rows in launches of 8 rows (10: two launches); the grid-stride loops run more
# than once at every size.
SIMULATOR = Profile(
    n_out=8,
    k=256,
    batches=(1, 3, 9),
    rows_batches=(10,),
    bounds=(0, 1, 3),
    f16_patterns=2048,
    norm_shapes=((3, 2, 48),),
    rope_shapes=((3, 2, 16, 12), (1, 4, 16, 16)),
    attention=ATTENTION_SMALL,
    kv_rows=(1, 4),
    kv_head_dim=16,
    paged_sequences=((6, 1), (8, 2)),
    act_shapes=((3, 40),),
)


# On an NVIDIA GPU (LOCALLLM_CUDA_FULL=1): the CPU's sizes, and the products at the sizes the device paths
# were written for (as the CUDA checks ran them before this suite): 2048 rows of 4096 (16 super-blocks a
# row, grids of many blocks), 512 activation rows through the tiled GEMM.
DEVICE = replace(FULL, n_out=2048, k=4096, batches=(*FULL.batches, 512), rows_batches=(*FULL.rows_batches, 64))


def cuda_on_device() -> bool:
    return os.environ.get("LOCALLLM_CUDA_FULL") == "1"


def profile_of(name: str) -> Profile:
    if name != "cuda":
        return FULL
    return DEVICE if cuda_on_device() else SIMULATOR


class InProcess:
    """A backend created in this process."""

    def __init__(self, name: str):
        from localllm.backends import create_backend

        self.backend = create_backend(name, CPU_THREADS)

    def run(self, run_name: str, **kwargs):
        return conformance_runs.RUNS[run_name](self.backend, **kwargs)

    def close(self) -> None:
        pass


class Simulator:
    """The CUDA backend under numba's simulator, in simulator_worker.py's child process. The child imports
    the same localllm as this process (its folder first on PYTHONPATH: a worktree's, when run there)."""

    def __init__(self):
        import localllm

        package_root = str(Path(localllm.__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=path)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, str(HERE / "simulator_worker.py")], cwd=HERE, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)

    def log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def run(self, run_name: str, **kwargs):
        try:
            pickle.dump((run_name, kwargs), self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise AssertionError(f"the simulator process has ended:\n{self.log_tail()}") from None
        ready, _, _ = select.select([self.proc.stdout], [], [], REPLY_TIMEOUT_S)
        if not ready:
            raise AssertionError(f"no reply from the simulator in {REPLY_TIMEOUT_S} s:\n{self.log_tail()}")
        try:
            status, value = pickle.load(self.proc.stdout)
        except EOFError:
            raise AssertionError(f"the simulator process has ended:\n{self.log_tail()}") from None
        if status != "ok":
            raise AssertionError(f"{run_name} raised in the simulator:\n{value}")
        return value

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Targets(dict):
    """backend name -> its runner, started when a test first asks for it."""

    def __missing__(self, name: str):
        runner = self[name] = Simulator() if name == "cuda" and not cuda_on_device() else InProcess(name)
        return runner

    def close(self) -> None:
        for runner in self.values():
            runner.close()
