"""Where the CPU backend keeps the weight matrices its kernels read: copied once, at load, into memory
backed by 2 MiB pages, or left where they lie in the file's mapping.

Why copy: a decode step streams every matrix once, so its speed is the memory's read rate, and that rate
depends on the pages under the bytes. Measured with the F16 matvec over Gemma 3 270M's 320 MiB output
matrix on two threads (docs/performance.md, "Weights in huge pages"): 20 GB/s from the file's mapping,
19 GB/s from ordinary anonymous memory (4 KiB pages), 29 GB/s from anonymous memory in 2 MiB pages. The
file's mapping stays at 20 GB/s even when the kernel maps it with 2 MiB folios, so the gain needs a copy.
llama.cpp reads its mapping by default (`--no-mmap` reads into ordinary memory).

Why not always: the copy is private memory that cannot be dropped and re-read as the page cache can, so it
is made only when the model fits well within the memory available (`copies_weights`). Matrices the backend
re-lays at their first product (matmul.PackedWeights, TiledWeights) are left mapped until then: their
re-laid copy is their copy, placed in the same huge-page memory (`place`).
"""

from __future__ import annotations

import mmap
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ... import host
from ...gguf.reader import release_pages

HUGE_PAGE = 2 << 20  # bytes: the x86-64 transparent huge page
CHUNK = 64 << 20  # bytes reserved at a time for matrices smaller than CHUNK // 4
ALIGN = 64  # bytes: each matrix starts on a cache line (what the file's alignment gives, or more)
COPY_PIECE = 16 << 20  # bytes each copying thread takes at a time


def copies_weights(place: str, weights_bytes: int, kv_bytes: int, available: int | None = None,
                   huge_pages: bool | None = None) -> bool:
    """Whether a model is copied into huge-page memory, for Runtime.weights `place`: "copied" always,
    "mapped" never, "auto" when the machine backs advised memory with huge pages and weights plus KV
    cache take under half the available memory (host.well_within, the read-ahead's rule too)."""
    if place != "auto":
        return place == "copied"
    available = host.available_memory() if available is None else available
    huge_pages = host.transparent_huge_pages() if huge_pages is None else huge_pages
    return huge_pages and hasattr(mmap, "MADV_HUGEPAGE") and host.well_within(weights_bytes + kv_bytes, available)


class HugePageArena:
    """Anonymous memory advised MADV_HUGEPAGE, handed out in ALIGN-aligned slots, never freed while the
    arena's copies live (each copy keeps its mapping alive through its base). A matrix of CHUNK // 4 or
    more gets a mapping of its own; smaller ones share CHUNK-sized mappings, whose unused tails are never
    touched and so take no memory."""

    def __init__(self, threads: int = 1):
        """threads: how many threads copy a large matrix (the first write to fresh memory costs as much as
        the copy: measured 3-4 GB/s on one thread, 8 on two, on a 2-vCPU virtual machine)."""
        self.threads = threads
        self._chunk: np.ndarray | None = None  # uint8 view of the current shared mapping
        self._used = 0  # bytes of it handed out

    def copy(self, data: np.ndarray) -> np.ndarray:
        """A read-only copy of `data` (C-contiguous) in huge-page memory, same dtype and shape. Read-only
        as the file's mapping is, so that the kernels compiled for a mapped model (precompile.py) serve."""
        out = self.place(data)
        out.flags.writeable = False
        return out

    def place(self, data: np.ndarray) -> np.ndarray:
        """A copy of `data` (C-contiguous) in huge-page memory, same dtype and shape, writable as `data`
        is: for the re-laid matrices (matmul.PackedWeights, TiledWeights), whose kernels are compiled for
        the writable arrays their packing makes."""
        slot = self._slot(data.nbytes)
        _copy_bytes(slot, data.reshape(-1).view(np.uint8), self.threads)
        return slot.view(data.dtype).reshape(data.shape)

    def _slot(self, nbytes: int) -> np.ndarray:
        if nbytes >= CHUNK // 4:
            return _huge_page_bytes(nbytes)
        start = -(-self._used // ALIGN) * ALIGN
        if self._chunk is None or start + nbytes > self._chunk.nbytes:
            self._chunk, start = _huge_page_bytes(CHUNK), 0
        self._used = start + nbytes
        return self._chunk[start : start + nbytes]


def _copy_bytes(dst: np.ndarray, src: np.ndarray, threads: int) -> None:
    """dst[:] = src (uint8, same length), in COPY_PIECE pieces over `threads` threads (NumPy's copy
    releases the GIL)."""
    starts = range(0, src.nbytes, COPY_PIECE)
    if threads < 2 or len(starts) < 2:
        np.copyto(dst, src)
        return

    def piece(start: int) -> None:
        np.copyto(dst[start : start + COPY_PIECE], src[start : start + COPY_PIECE])

    with ThreadPoolExecutor(min(threads, len(starts))) as pool:
        for _ in pool.map(piece, starts):  # re-raises a piece's error
            pass


def _huge_page_bytes(nbytes: int) -> np.ndarray:
    """A writable uint8 array of nbytes starting on a HUGE_PAGE boundary of an anonymous mapping advised
    MADV_HUGEPAGE (where the platform has the advice)."""
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(region, dtype=np.uint8)  # keeps `region` alive
    first = -whole.ctypes.data % HUGE_PAGE
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            region.madvise(advice, first, len(region) - first)
        except OSError:  # the kernel refuses the advice: ordinary pages, still a correct copy
            pass
    return whole[first : first + nbytes]


def copy_to_arena(arena: HugePageArena, data: np.ndarray) -> np.ndarray:
    """data's copy in `arena`; the process's pages of the file's mapping under `data` are then released
    (gguf.reader.release_pages), so the process holds the weight's bytes once."""
    copy = arena.copy(data)
    release_pages(data)
    return copy
