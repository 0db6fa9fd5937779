"""Quantized matrix products on the CPU.

Few activation rows (decode, the server's batched steps, short prompts): each row is quantized once to
the weight type's pairing format, then each output element is one integer `vec_dot` over a quantized
weight row; the multi-row kernels (`matvec_rows`) read each weight row once for all the activation rows,
with every result equal to the one-row kernel's. Many rows (prefill of a long prompt): weight tiles are
dequantized to float32 into a reused scratch buffer and multiplied through BLAS (NumPy's matmul); the
weights stay quantized in memory. Dequantizing a matrix costs about as much as multiplying it by a few
dozen rows, hence the threshold BLAS_MIN_ROWS between the two.
"""

from __future__ import annotations

from functools import lru_cache

import numba
import numpy as np

from ...gguf.reader import release_pages
from ...quant import QuantType
from ...quant.activation import QK8_0, QK_K, QuantizedActivation
from .drivers import drivers, row_drivers
from .kernels import quantize_rows_q8_0, quantize_rows_q8_k
from .quant_kernels import kernel_record
from .quant_kernels.q4_k_tiles import MIN_ROWS as TILE_MIN_ROWS
from .quant_kernels.q4_k_tiles import TILE
from .quant_kernels.q4_k_tiles import available as tiles_available
from .quant_kernels.legacy_tiles import narrow_available as narrow_tiles_available

# From this many activation rows a matmul of a type without multi-row kernels (below) goes through
# dequantized tiles + BLAS (and a batch is a prefill whose other ops leave the cores to BLAS:
# ThreadPolicy.for_op); below it, the integer kernels. Measured on Gemma 3 270M, 2 threads, all its
# per-layer matrices, with the batched kernels of the time (one vec_dot per weight and activation row
# for the K-quants), ms per pass (BLAS / integer): T=8 25.6/11.4, 16 31.0/22.5, 32 44.9/52.1, 64
# 70.0/105.8 (scripts/crossover.py).
BLAS_MIN_ROWS = 32
INTEGER_ALWAYS = 1 << 62


def has_multirow_kernels(qt: QuantType) -> bool:
    """Whether the type's batched matvec unpacks each weight block once for many activation rows (the
    pair kernels of the 32-element types, the K-quant row kernels), rather than one vec_dot per weight
    and activation row."""
    return kernel_record(qt).has_multirow_kernels


def blas_min_rows(qt: QuantType) -> int:
    """Activation rows from which qt's matmul dequantizes tiles for BLAS. Never for the types with
    multi-row kernels: they multiply 8-bit integers as llama.cpp does, faster than tiles + BLAS at every
    prompt length measured (Gemma 3 270M, one thread, ms at T=64 / 512, BLAS with the AVX2 kernels
    against integer: Q5_0 640x2048 1.61/0.72, 11.55/5.86; Q6_K 2048x640 1.73/0.69, 12.15/5.50; Q4_K
    1024x640 0.82/0.36, 6.30/3.07; Llama-3-8B shapes, T=64: Q4_K 4096x14336 118/36), and about even
    with the AVX-512 kernels' GEMM alone, before their dequantization; nor for the types with a matrix
    kernel (the float types: KernelRecord.matrix), which takes every product of their matrices."""
    by_kernels = has_multirow_kernels(qt) or has_fast_tiles(qt) or kernel_record(qt).matrix is not None
    return INTEGER_ALWAYS if by_kernels else BLAS_MIN_ROWS


def has_fast_tiles(qt: QuantType) -> bool:
    """Whether the type has a tile kernel (16 weight rows as vector lanes) and the target runs it fast
    (tile_rows_from): from there the tiles, below the one-row or grid kernels, never BLAS. Elsewhere
    the tile kernel compiles through portable IR and BLAS stays ahead for long prompts."""
    return tile_rows_from(kernel_record(qt).tiles) is not None


def tile_rows_from(tiles) -> int | None:
    """The activation rows from which a product takes the tile kernel on this target: its min_rows on
    AVX-512 VNNI, its narrow_min_rows on AVX2 (None: never there), None for no tile kernel."""
    if tiles is None:
        return None
    if _tiles_available():
        return tiles.min_rows
    return tiles.narrow_min_rows if _narrow_tiles_available() else None


def matrix_kernel(qt: QuantType, weights):
    """The type's matrix kernel (KernelRecord.matrix) where it takes this matrix, else None: then every
    product of the matrix, at every batch size, goes through it."""
    kernel = kernel_record(qt).matrix
    if kernel is None or isinstance(weights, RELAID) or not kernel.suits(weights):
        return None
    return kernel


class MatrixRow:
    """A matrix kernel in the one-row kernel's call form: (weights, out[N], x[K])."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __call__(self, weights: np.ndarray, out: np.ndarray, x: np.ndarray) -> None:
        self.kernel.matmul(weights, x[None], out[None], numba.get_num_threads())


TILE_ROWS = 512


def gather_rows_kernel(qt: QuantType):
    return drivers(qt).gather_rows


def matvec_kernel(qt: QuantType):
    """The decode's matvec(weights, out, *activation) over a matrix's file rows (the generated driver's),
    for the types without a matrix kernel (matrix_kernel: the float types' decode goes through theirs)."""
    return drivers(qt).matvec


def dequant_rows_kernel(qt: QuantType):
    return drivers(qt).dequant_rows


class BatchActivation:
    """Preallocated pairing-format buffers for up to `rows` activation rows of n floats (the [T, ...]
    form of QuantizedActivation; row t holds exactly what QuantizedActivation.quantize(x[t]) would)."""

    def __init__(self, kind: str, rows: int, n: int):
        self.kind = kind
        self.rows = rows
        if kind == "f32":
            self.arrays = (np.zeros((rows, n), dtype=np.float32),)
            return
        block = QK8_0 if kind == "q8_0" else QK_K
        if n % block:
            raise ValueError(f"activation length {n} is not a multiple of {block} ({kind})")
        sums = n // (QK8_0 if kind == "q8_0" else 16)
        self.arrays = (
            np.zeros((rows, n), dtype=np.int8),
            np.zeros((rows, n // block), dtype=np.float32),
            np.zeros((rows, sums), dtype=np.int32),
        )

    def quantize(self, x: np.ndarray) -> tuple:
        """Quantize x float32[T, n] (T <= rows); returns the [T, ...] views matvec_rows takes."""
        t = x.shape[0]
        views = tuple(a[:t] for a in self.arrays)
        if self.kind == "f32":
            views[0][:] = x
            return views
        quantize_rows = quantize_rows_q8_0 if self.kind == "q8_0" else quantize_rows_q8_k
        quantize_rows(x, *views)
        return views


class MatmulScratch:
    """Reusable buffers: one quantized activation per (pairing kind, K), one dequantization tile."""

    def __init__(self):
        self._acts: dict[tuple[str, int], QuantizedActivation] = {}
        self._batch_acts: dict[tuple[str, int], BatchActivation] = {}
        self._tile = np.empty(0, dtype=np.float32)
        self._tail = np.empty(0, dtype=np.float32)

    def batch_activation(self, kind: str, rows: int, k: int) -> BatchActivation:
        key = (kind, k)
        act = self._batch_acts.get(key)
        if act is None or act.rows < rows:
            act = self._batch_acts[key] = BatchActivation(kind, max(rows, 8), k)
        return act

    def activation(self, kind: str, k: int) -> QuantizedActivation:
        key = (kind, k)
        act = self._acts.get(key)
        if act is None:
            act = self._acts[key] = QuantizedActivation(kind, k)
        return act

    def tail(self, rows: int, n: int) -> np.ndarray:
        """float32[rows, n] for the last weight rows of a tiled product (matmul_rows)."""
        size = rows * n
        if self._tail.size < size:
            self._tail = np.empty(size, dtype=np.float32)
        return self._tail[:size].reshape(rows, n)

    def tile(self, rows: int, k: int) -> np.ndarray:
        if self._tile.size < rows * k:
            self._tile = np.empty(rows * k, dtype=np.float32)
        return self._tile[: rows * k].reshape(rows, k)


def matmul(qt: QuantType, weights: np.ndarray, x: np.ndarray, out: np.ndarray, scratch: MatmulScratch) -> None:
    """out[T, N] = x[T, K] @ W.T for a quantized W (weights: uint8[N, row_bytes] holding N rows of K)."""
    matmul_segments(qt, weights, x, out, (0, x.shape[0]), scratch)


def matmul_segments(qt: QuantType, weights: np.ndarray, x: np.ndarray, out: np.ndarray, bounds, scratch: MatmulScratch) -> None:
    """matmul over the rows bounds[i]..bounds[i+1] of x and out, segment by segment, each exactly as
    matmul computes it alone; the segments that go through BLAS share each dequantized tile (in a
    server step with several short prompts, dequantization is most of the cost of a prompt)."""
    k = x.shape[1]
    segments = list(zip(bounds[:-1], bounds[1:]))
    by_matrix = isinstance(weights, TiledWeights) or matrix_kernel(qt, weights) is not None
    min_rows = INTEGER_ALWAYS if by_matrix else blas_min_rows(qt)
    by_blas = [(a, b) for a, b in segments if b - a >= min_rows]
    if by_blas:
        dequant = dequant_rows_kernel(qt)
        n_rows = weights.shape[0]
        # BLAS owns the cores here (the backend runs Numba on one thread for batches: see
        # ThreadPolicy.for_op), so tiles are dequantized on the calling thread.
        for start in range(0, n_rows, TILE_ROWS):
            rows = min(TILE_ROWS, n_rows - start)
            tile = scratch.tile(rows, k)
            dequant(weights, start, tile)
            for a, b in by_blas:
                np.matmul(x[a:b], tile.T, out=out[a:b, start : start + rows])
    # The integer kernels' rows do not depend on each other: consecutive short segments go in one call.
    run_start = None
    for a, b in segments + [(bounds[-1], None)]:
        if b is not None and b - a < min_rows:
            run_start = a if run_start is None else run_start
            continue
        if run_start is not None:
            _integer_rows(qt, weights, x[run_start:a], out[run_start:a], scratch)
            run_start = None


def _integer_rows(qt: QuantType, weights: np.ndarray, x: np.ndarray, out: np.ndarray, scratch: MatmulScratch) -> None:
    matrix = matrix_kernel(qt, weights)
    if matrix is not None:
        matrix.matmul(weights, x, out, numba.get_num_threads())
    elif isinstance(weights, RELAID):
        weights.matmul(x, out, scratch, numba.get_num_threads())
    elif x.shape[0] == 1:
        matvec_kernel(qt)(weights, out[0], *scratch.activation(qt.act, x.shape[1]).quantize(x[0]))
    else:
        matmul_rows(qt, weights, x, out, scratch)


def matmul_rows(qt: QuantType, weights: np.ndarray, x: np.ndarray, out: np.ndarray, scratch: MatmulScratch) -> None:
    """out[T, N] = x[T, K] @ W.T, each row exactly as the one-row decode path computes it (integer
    vec_dot over the quantized activation), the weights streamed once for all T rows: through the type's
    tile kernel (the record's `tiles`: weight rows as lanes) for batches of its min_rows rows or more
    where the target has it fast, else the row kernels."""
    matrix = matrix_kernel(qt, weights)
    if matrix is not None:
        matrix.matmul(weights, x, out, numba.get_num_threads())
        return
    if isinstance(weights, RELAID):
        weights.matmul(x, out, scratch, numba.get_num_threads())
        return
    act = scratch.batch_activation(qt.act, x.shape[0], x.shape[1])
    args = act.quantize(x)
    tiles = kernel_record(qt).tiles
    n_tiled = weights.shape[0] - weights.shape[0] % TILE
    rows_from = tile_rows_from(tiles)
    if rows_from is None or x.shape[0] < rows_from or n_tiled == 0:
        row_drivers(qt).matvec_rows(weights, out, *args)
        return
    tiles.matvec(weights, out, *args)
    if n_tiled < weights.shape[0]:  # the last N % 16 rows by the row kernels
        rest = scratch.tail(x.shape[0], weights.shape[0] - n_tiled)
        row_drivers(qt).matvec_rows(weights[n_tiled:], rest, *args)
        out[:, n_tiled:] = rest


@lru_cache(maxsize=1)
def _tiles_available() -> bool:
    return tiles_available()


@lru_cache(maxsize=1)
def _narrow_tiles_available() -> bool:
    return narrow_tiles_available()


def packed_available() -> bool:
    """Whether the target runs the re-laid lane kernels (PackedWeights) fast: AVX-512 VNNI, or AVX2 with
    each product as two 256-bit halves. On AVX2, 2 threads, LOCALLLM_REPACK=1 against 0 (tok/s, three
    alternations on Gemma 3 270M, two on the 8B-shaped Q4_0 file): Gemma Q4_K_M pp256 876-957 against
    827-884, tg64 92-116 / 85-113; Gemma Q4_0 even (pp256 805-874 / 812-852); 8B Q4_0 pp128 14.4-14.9
    against 12.4-12.7, tg32 even (5.8-6.2)."""
    return _tiles_available() or _narrow_tiles_available()


class PackedWeights:
    """A matrix whose first N - N % 16 rows are re-laid for a lane kernel (the kernel record's `packed`:
    for Q4_K quant_kernels.q4_k_x16, each record the transpose of 16 rows' super-block, word by word),
    the last rows left as they are, for the row
    kernels. Products equal the row kernels' bit for bit at every batch size, so a model computes the
    same with or without it.

    Made once per weight, at its first product (CPUBackend._layout_of); the mapped file's pages under
    the re-laid rows are then released (gguf.reader.release_pages), so the process holds the weight's
    bytes once, as llama.cpp does with its repacked CPU buffers."""

    def __init__(self, qt: QuantType, weights: np.ndarray, arena=None):
        packed = kernel_record(qt).packed
        self.qt = qt
        self.shape = weights.shape
        self.n_blocks = weights.shape[1] // qt.type_size
        self.n_packed = weights.shape[0] - weights.shape[0] % TILE
        self.kernel = packed.matvec
        self.packed = _placed(packed.pack(weights), arena)
        self.tail = weights[self.n_packed :]
        release_pages(weights[: self.n_packed])

    @staticmethod
    def suits(qt: QuantType, weights: np.ndarray) -> bool:
        """Whether a weight gains from the layout: a type with a packed kernel, on a target where the
        lane kernels are fast (packed_available; AVX-512 VNNI for the kernels marked `wide`, AVX2 for
        those marked `narrow`), with at least one tile of rows."""
        packed = kernel_record(qt).packed
        if packed is None or weights.ndim != 2 or weights.shape[0] < TILE:
            return False
        if _tiles_available():
            return packed.wide
        return packed.narrow and _narrow_tiles_available()

    def matmul(self, x: np.ndarray, out: np.ndarray, scratch: MatmulScratch, threads: int) -> None:
        """out[T, N] = x[T, K] @ W.T, each row as the one-row kernel computes it; `threads`: Numba's
        current thread count (the kernel splits the tiles in that many runs)."""
        rows = x.shape[0]
        args = scratch.batch_activation(self.qt.act, rows, x.shape[1]).quantize(x)
        self.kernel(self.packed, self.n_blocks, threads, out, *args)
        if self.tail.shape[0]:
            rest = scratch.tail(rows, self.tail.shape[0])
            row_drivers(self.qt).matvec_rows(self.tail, rest, *args)
            out[:, self.n_packed :] = rest


class TiledWeights:
    """A matrix re-laid for its type's matrix kernel (the kernel record's `matrix`: the float types' 16-row
    panels, float_panels.pack; BF16 on AMX, each tile's 1 KiB contiguous; either way decode streams the
    matrix in order), made once per weight at its first
    product as PackedWeights is, the mapped pages then released. Products equal the matrix kernel's on
    the file's rows bit for bit (the tiles hold the same bytes), so the basic tier, which re-lays
    nothing, computes the same."""

    def __init__(self, qt: QuantType, weights: np.ndarray, arena=None):
        self.qt = qt
        self.shape = weights.shape
        self.kernel = kernel_record(qt).matrix
        self.rows = weights  # N and K for the kernel, and the last N % 16 rows of the float panels
        self.packed = _placed(self.kernel.pack(weights), arena)
        release_pages(weights)

    @staticmethod
    def suits(qt: QuantType, weights: np.ndarray) -> bool:
        kernel = kernel_record(qt).matrix
        return kernel is not None and kernel.suits(weights)

    def matmul(self, x: np.ndarray, out: np.ndarray, scratch: MatmulScratch, threads: int) -> None:
        """out[T, N] = x[T, K] @ W.T (PackedWeights.matmul's form)."""
        self.kernel.matmul(self.rows, x, out, threads, self.packed)


RELAID = (PackedWeights, TiledWeights)  # the layouts that take their products themselves (.matmul)


def _placed(packed: np.ndarray, arena) -> np.ndarray:
    """A re-laid copy, moved into the backend's huge-page memory where it has some (weight_memory: a
    decode step streams every matrix, and 2 MiB pages read faster than 4 KiB ones)."""
    return packed if arena is None else arena.place(packed)


def relaid_layout(qt: QuantType, weights: np.ndarray):
    """The re-laid layout class a weight takes where the backend repacks (None: its file's rows)."""
    for layout in RELAID:
        if layout.suits(qt, weights):
            return layout
    return None


class ExpertPack:
    """An expert tensor (n_expert matrices of N rows, stacked) re-laid for the type's grouped packed
    kernel: every expert's rows 16 at a time, all experts in one array so that one call multiplies any
    set of them. An expert is re-laid the first time it is routed to, and its mapped pages then released
    (as PackedWeights does), so experts never chosen cost nothing; the array is reserved whole but its
    memory is only taken as experts are written."""

    def __init__(self, qt: QuantType, weights: np.ndarray, n_expert: int):
        record = kernel_record(qt).packed
        self.qt, self.weights, self.n_expert = qt, weights, n_expert
        self.rows = weights.shape[0] // n_expert
        self.n_blocks = weights.shape[1] // qt.type_size
        self.tiles = self.rows // TILE
        self.pack, self.kernel = record.pack, record.grouped
        probe = record.pack(weights[:TILE])  # the record layout: records per tile and words per record
        self.packed = np.empty((n_expert * self.tiles * probe.shape[0], probe.shape[1]), dtype=probe.dtype)
        self.per_expert = self.tiles * probe.shape[0]
        self.ready = np.zeros(n_expert, dtype=bool)

    @staticmethod
    def suits(qt: QuantType, weights: np.ndarray, n_expert: int) -> bool:
        """A type with a grouped packed kernel, on a target where the lane kernels are fast (AVX-512 VNNI:
        the grouped kernel is not measured on AVX2), with whole tiles per expert."""
        record = kernel_record(qt).packed
        rows = weights.shape[0] // n_expert
        return record is not None and record.grouped is not None and rows % TILE == 0 and _tiles_available()

    def matmul(self, x: np.ndarray, groups: np.ndarray, bounds: np.ndarray, out: np.ndarray, scratch: MatmulScratch,
               threads: int) -> None:
        """Backend.matmul_experts on the re-laid experts; rows as the one-row kernel computes them."""
        for e in groups[~self.ready[groups]]:
            self._relay(int(e))
        args = scratch.batch_activation(self.qt.act, x.shape[0], x.shape[1]).quantize(x)
        self.kernel(self.packed, self.n_blocks, self.tiles, groups, bounds, threads, out, *args)

    def _relay(self, e: int) -> None:
        rows = self.weights[e * self.rows : (e + 1) * self.rows]
        self.packed[e * self.per_expert : (e + 1) * self.per_expert] = self.pack(rows)
        release_pages(rows)
        self.ready[e] = True
