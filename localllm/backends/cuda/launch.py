"""Launch geometry of the CUDA kernels, one dataclass so that the simulator can run the same kernels on
a few threads.

Every kernel is written so that its result does not depend on these numbers (grid-stride loops,
reductions over however many threads a block has), only its speed does. On a GPU the defaults apply;
under numba's CUDA simulator, where each CUDA thread is a Python thread (~0.3-1.5 ms each, measured),
`SIMULATOR` keeps blocks tiny, which also makes the tests walk every grid-stride loop more than once.
"""

from __future__ import annotations

from dataclasses import dataclass

# Static shared-memory sizes (float32 elements); Launch.check keeps every geometry within them.
MAX_THREADS = 1024  # per-block reduction scratch
MAX_VEC_T = 8  # activation rows per matvec launch (more rows go through the dequantize + GEMM path)
MAX_TILE = 16  # GEMM tile edge
MAX_TILE_PADDED = 17  # a padded tile row (shared array shapes must be literal constants for numba-cuda)
MAX_HEAD_DIM = 512


@dataclass(frozen=True)
class Launch:
    lanes: int = 32  # threads cooperating on one matrix row in a matvec (a warp)
    rows_per_block: int = 4  # matrix rows (warps) per matvec block
    threads: int = 256  # threads per block of the row kernels (RMS norm, attention) and elementwise kernels
    max_blocks: int = 4096  # grid cap of the grid-stride (elementwise) kernels
    tile: int = 16  # GEMM tile edge (tile x tile threads per block)
    gemm_min_rows: int = MAX_VEC_T  # activation rows from which matmul dequantizes tiles and runs a GEMM

    def check(self) -> "Launch":
        def power_of_two(n: int) -> bool:
            return n > 0 and n & (n - 1) == 0

        if not (power_of_two(self.lanes) and power_of_two(self.threads)):
            raise ValueError("lanes and threads must be powers of two (tree reductions)")
        if self.rows_per_block * MAX_VEC_T * self.lanes > MAX_THREADS or self.threads > MAX_THREADS:
            raise ValueError("launch geometry exceeds the kernels' shared-memory scratch")
        if not 1 <= self.tile <= MAX_TILE or not 2 <= self.gemm_min_rows <= MAX_VEC_T + 1:
            raise ValueError("tile must be 1..16 and gemm_min_rows 2..9")
        return self


# A warp of 2 lanes, 8-thread blocks, 8x8 tiles: a few hundred Python threads per kernel launch. The
# simulator's per-block cost dominates (measured: 4x4 GEMM tiles 4x slower than 8x8, a tiny model's
# decode 1.8x faster with 16 rows per matvec block than with 4).
SIMULATOR = Launch(lanes=2, rows_per_block=16, threads=8, max_blocks=2, tile=8)


def blocks_for(n: int, threads: int, cap: int) -> int:
    """Grid size of a grid-stride kernel over n items."""
    return max(1, min(cap, -(-n // threads)))
