"""`python -m localllm.backends.cpu.precompile MODEL`: compile the full tier's kernels for MODEL into
Numba's cache, then write the marker (tiers.py says why and when).

The model's own decoder runs a few forward passes on a CompileOnlyBackend: every op as CPUBackend runs
it, on the model's real arrays (so each kernel is compiled for exactly the types, layouts and
read-only flags of a real run), except that each matrix product computes only the first rows of its
matrix. The passes cover the paths a conversation takes: prompts of 2, TILE_MIN_ROWS and BLAS_MIN_ROWS
rows and one long enough for the parallel small ops, decode at position 0 and deep enough that
attention runs its parallel kernel.
"""

from __future__ import annotations

import fcntl
import os
import sys

import numpy as np

from ..base import Weight
from .backend import CPUBackend
from .matmul import BLAS_MIN_ROWS, TILE, TILE_MIN_ROWS
from .threads import SMALL_ATTENTION_WORK, SMALL_OP_WORK


class CompileOnlyBackend(CPUBackend):
    """CPUBackend whose matrix products use the first rows of each matrix only (2 * TILE rows, plus the
    matrix's N % TILE last rows where it has them, so that the re-laid and tile kernels and their tails
    all run), into scratch outputs: the kernels are those of a real run, the work a few microseconds.
    The results are meaningless; this backend only compiles."""

    def __init__(self):
        super().__init__(threads=1)
        self._heads: dict[int, tuple] = {}  # id(weight) -> (weight, its first rows as a Weight)

    def _head(self, w: Weight) -> Weight:
        entry = self._heads.get(id(w))
        if entry is None:
            n = w.data.shape[0]
            rows = min(n, 2 * TILE + n % TILE)
            entry = self._heads[id(w)] = (w, Weight(w.name, w.qtype, (w.shape[0], rows), w.data[:rows]))
        return entry[1]

    def _out(self, rows: int, w: Weight) -> np.ndarray:
        return np.zeros((rows, w.data.shape[0]), dtype=np.float32)

    def matmul(self, w, x, out, bias=None) -> None:
        head = self._head(w)
        super().matmul(head, x, self._out(x.shape[0], head))

    def matmul_segments(self, w, x, out, bounds, bias=None) -> None:
        head = self._head(w)
        super().matmul_segments(head, x, self._out(x.shape[0], head), bounds)

    def matmul_rows(self, w, x, out, bias=None) -> None:
        head = self._head(w)
        super().matmul_rows(head, x, self._out(x.shape[0], head))


def exercise(decoder) -> None:
    """Forward passes of decoder (on a CompileOnlyBackend) that call every kernel a conversation does."""
    from ...model.kv_cache import KVCache

    hp = decoder.hp
    # the first position at which one decode row's attention is parallel (CPUBackend.attention)
    deep = SMALL_ATTENTION_WORK // (hp.n_head * hp.head_dim) + 1
    # a prompt long enough that every norm, rotation and activation runs its parallel kernel (the
    # smallest of them: keys, n_head_kv * head_dim per row)
    long = max(BLAS_MIN_ROWS, -(-SMALL_OP_WORK // min(hp.n_embd, hp.n_head_kv * hp.head_dim)))
    cache = KVCache(decoder.ops, hp, max(deep, long) + 1, decoder.kv_layout())
    tokens = np.arange(long, dtype=np.int32) % hp.n_vocab
    if not decoder.GENERATES:  # an encoder (embeddings only): whole texts from position 0
        for rows in (1, 2, TILE_MIN_ROWS, BLAS_MIN_ROWS, long):
            decoder.hidden_states(tokens[:rows], cache)
        return
    for rows in (2, TILE_MIN_ROWS, BLAS_MIN_ROWS, long):
        decoder.forward(tokens[:rows], 0, cache)
    decoder.forward(tokens[:1], 0, cache)
    decoder.forward(tokens[:1], deep, cache)


def precompile(model_path: str) -> None:
    from ...gguf import GGUFReader
    from ...model.archs import architecture_class
    from ...tokenizer import Tokenizer
    from .tiers import marker_path

    backend = CompileOnlyBackend()  # re-lays Q4_K matrices as LOCALLLM_REPACK says (set by the parent)
    marker = marker_path(model_path, backend.repack, backend.runtime)
    marker.parent.mkdir(parents=True, exist_ok=True)
    # One compile per model at a time: a second start while the first is compiling waits here, then
    # finds the marker.
    with open(marker.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return
        with GGUFReader(model_path) as reader:
            n_vocab = Tokenizer.from_metadata(reader.metadata).vocab_size
            decoder = architecture_class(reader.architecture)(reader, backend, n_vocab=n_vocab)
            exercise(decoder)
        marker.write_bytes(b"")


def yield_the_cpu() -> None:
    """Run only on a CPU nothing else wants (Linux's SCHED_IDLE; elsewhere the lowest priority): the
    process that started this one, compiling its basic tier and answering, comes first. Measured on 2
    cores with a third busy process: at nice 10 the foreground's warm-up took 10.3 s against 7.9 s
    without this process."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m localllm.backends.cpu.precompile MODEL.gguf", file=sys.stderr)
        return 2
    yield_the_cpu()
    precompile(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
