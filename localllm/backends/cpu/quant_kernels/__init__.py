"""The CPU kernels of every quant type, declared in ONE table: `kernel_record(name)`.

A type's record names everything the CPU backend runs for it (formats: localllm/quant):
- `vec_dot`: the one-row dot product of a weight row with an activation in the type's pairing format
  (`qt.act`; see quant/activation.py):
    act "f32":  vec_dot(w: uint8[row_bytes], x: float32[n]) -> float32
    act "q8_0": vec_dot(w, qs: int8[n], d: float32[n/32], s: int32[n/32]) -> float32   (s = sum of qs per block)
    act "q8_k": vec_dot(w, qs: int8[n], d: float32[n/256], s: int32[n/16]) -> float32  (s = sum of qs per 16)
- `dequantize_row`: the exact row dequantizer the prefill's tiles and the row gathers use (vector code
  where the type has one, else quant's plain one; the same bits either way);
- the multi-row kernels, by strategy (docs/architecture.md has the glossary):
    grid:   several dot products at once (dot_4x1: four weight rows x one activation, the decode matvec:
            four independent float add chains instead of one, as the Q8_0 output projection of Gemma 3
            270M is bound by that chain's latency, not by memory; dot_1x4: one weight row x four
            activations, each weight block unpacked once for the four), and where the type has them
            dot_apart (four rows a quarter of the matrix apart) with apart_min_bytes, the matrix size
            from which the matvec takes it instead of dot_4x1;
    pairs:  four weight rows against activation rows taken in pairs, two rows to a 512-bit vector where
            the target has AVX-512 (the batched decode of the 32-element types, pairs.py);
    rows:   one K-quant weight row against 16, 8, 4 or 2 activation rows, each super-block unpacked
            once (kquant_rows.py);
    tiles:  16 weight rows as the lanes of a vector, for batches of at least `min_rows` rows where the
            target has AVX-512 VNNI, `narrow_min_rows` on AVX2;
    packed: the tile kernel on rows re-laid 16 at a time at load (x16), at every batch size.
Every multi-row result equals vec_dot's bit for bit, so a row's value does not depend on the batch.
- `matrix`: a kernel that takes a matrix's products at every batch size, the one-row ones included, in
  its own order: every product of such a matrix goes through it, so a row's value still does not depend
  on the batch. The float types (F32, F16, BF16: float_panels.py, 16 rows as the lanes of a vector, one
  chain of fused multiply-adds per output, vec_dot's order; BF16 on AMX's tiles where the CPU has them:
  amx.py) take every matrix (`suits`); the quantized types have none.

The generated drivers (drivers.py) take every kernel from the record. Adding a type: its kernel module
here and one entry in `_TABLE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Mapping, Optional

from .... import quant
from ....jit import configure_numba
from ....quant import QuantType

APART_NEVER = 1 << 62  # GridKernels.apart_min_bytes of the types whose matvec always takes dot_4x1


@dataclass(frozen=True)
class GridKernels:
    """Intrinsics of several dot products at once (vector.grid_dot_intrinsic), each equal to vec_dot's."""

    dot_4x1: Callable  # (weights uint8[N, row_bytes], r0, qs, d, s, t0, n_blocks) -> 4 float32
    dot_1x4: Callable  # (weights, r, qs[T, n], d[T, ...], s[T, ...], t0, n_blocks) -> 4 float32
    # From this matrix size the matvec takes dot_apart: Q8_0's matrices far larger than the caches stream
    # faster as four runs side by side than as dot_4x1's four neighbouring rows (Gemma 3's 178 MB output
    # matrix, 1 thread: one row at a time 41 against dot_4x1's 36 GB/s; four runs ~5% a token over one
    # row at a time), while dot_4x1 stays ahead on matrices that fit and on the other types measured
    # (Q5_0); Q4_0 takes it too, on its block sums (q4_0.APART_MIN_BYTES).
    apart_min_bytes: int = APART_NEVER
    # (weights, r0, step, qs, d, s, n_blocks) -> 4 float32: rows r0 + k * step (vector.apart_dot_intrinsic)
    dot_apart: Optional[Callable] = None


@dataclass(frozen=True)
class PairKernels:
    """The batched decode on activation pairs (pairs.py): the kernels by name (pairs.pair_kernel_names),
    and the type's zero point and per-lane start for pairs.pair_activations."""

    kernels: Mapping[str, Callable]
    zero_point: int
    quad_zero: int


@dataclass(frozen=True)
class RowKernels:
    """A K-quant's multi-row intrinsics (kquant_rows.py) and the packing of the activations they read."""

    pack: Callable
    rows_2: Callable
    rows_4: Callable
    rows_8: Callable
    rows_16: Callable


@dataclass(frozen=True)
class TileKernel:
    """matvec(weights, out, qs, d, s) over the first N - N % 16 weight rows, 16 rows as vector lanes."""

    matvec: Callable
    min_rows: int  # fewer activation rows: the row kernels (targets with AVX-512 VNNI)
    # The same on AVX2 targets (legacy_tiles' unsigned types, the K-quants and IQ4_XS: each product
    # as two 256-bit halves); None: the row kernels at every batch size there (matmul.tile_rows_from).
    narrow_min_rows: Optional[int] = None


@dataclass(frozen=True)
class PackedKernel:
    """pack(weights) -> the rows re-laid 16 at a time; matvec(packed, n_blocks, n_parts, out, qs, d, s);
    grouped (routed experts, where the type has it): grouped(packed, n_blocks, tiles_per_expert, groups,
    bounds, n_parts, out, qs, d, s) over the records of several experts stacked."""

    pack: Callable
    matvec: Callable
    grouped: Optional[Callable] = None
    narrow: bool = True  # also on AVX2 targets (each product as two 256-bit halves), not only AVX-512 VNNI
    wide: bool = True  # also on AVX-512 VNNI targets


@dataclass(frozen=True)
class MatrixKernel:
    """matmul(weights, x, out, threads, packed=<none>): out[T, N] = x[T, K] @ W.T for every T >= 1 and
    all N rows, on `threads` threads, from the rows of `weights` or from their re-laid copy
    `pack(weights)` (the same bits: the copy only streams faster); suits(weights): whether it takes this
    matrix on this machine (decided by the matrix's shape and the target alone, so every product of a
    matrix takes the same kernel)."""

    matmul: Callable
    suits: Callable
    pack: Callable


@dataclass(frozen=True)
class KernelRecord:
    qt: QuantType
    vec_dot: Callable
    dequantize_row: Callable
    grid: Optional[GridKernels] = None
    pairs: Optional[PairKernels] = None
    rows: Optional[RowKernels] = None
    tiles: Optional[TileKernel] = None
    packed: Optional[PackedKernel] = None
    matrix: Optional[MatrixKernel] = None

    @property
    def name(self) -> str:
        return self.qt.name

    @property
    def act(self) -> str:
        return self.qt.act

    @property
    def multirow(self) -> str:
        """The batched matvec's strategy: "pairs", "rows", "grid" (dot_1x4) or "one" (a vec_dot per
        weight and activation row)."""
        return "pairs" if self.pairs else "rows" if self.rows else "grid" if self.grid else "one"

    @property
    def has_multirow_kernels(self) -> bool:
        """Whether the batched matvec unpacks each weight block once for many activation rows."""
        return self.multirow in ("pairs", "rows")


# ----- the table: one entry per type, each importing only its own kernel modules -----


def _f32() -> KernelRecord:
    from . import f32 as k
    from .float_panels import suits

    return KernelRecord(quant.get("F32"), k.vec_dot, quant.get("F32").dequantize_row, matrix=MatrixKernel(k.matmul, suits, k.pack))


def _f16() -> KernelRecord:
    from . import f16 as k
    from .float_panels import suits

    return KernelRecord(quant.get("F16"), k.vec_dot, quant.get("F16").dequantize_row, matrix=MatrixKernel(k.matmul, suits, k.pack))


def _bf16() -> KernelRecord:
    from . import bf16 as k

    return KernelRecord(quant.get("BF16"), k.vec_dot, quant.get("BF16").dequantize_row, matrix=MatrixKernel(k.matmul, k.suits, k.pack))


def _q4_0() -> KernelRecord:
    from . import q4_0 as k

    from . import legacy_tiles, q4_0_x16

    pairs = PairKernels(k.PAIR_KERNELS, k.ZERO_POINT, k.QUAD_ZERO)
    tiles = TileKernel(legacy_tiles.q4_0_tiles, legacy_tiles.MIN_ROWS["Q4_0"], legacy_tiles.NARROW_MIN_ROWS["Q4_0"])
    packed = PackedKernel(q4_0_x16.pack, q4_0_x16.matvec_packed)
    grid = GridKernels(k.dot_4x1, k.dot_1x4, apart_min_bytes=k.APART_MIN_BYTES, dot_apart=k.dot_apart)
    return KernelRecord(
        quant.get("Q4_0"), k.vec_dot, k.dequantize_row, grid=grid, pairs=pairs, tiles=tiles, packed=packed,
    )


def _q4_1() -> KernelRecord:
    from . import legacy_tiles
    from . import q4_1 as k

    tiles = TileKernel(legacy_tiles.q4_1_tiles, legacy_tiles.MIN_ROWS["Q4_1"], legacy_tiles.NARROW_MIN_ROWS["Q4_1"])
    return KernelRecord(quant.get("Q4_1"), k.vec_dot, k.dequantize_row, grid=GridKernels(k.dot_4x1, k.dot_1x4), tiles=tiles)


def _q5_0() -> KernelRecord:
    from . import q5_0 as k

    from . import legacy_tiles

    pairs = PairKernels(k.PAIR_KERNELS, k.ZERO_POINT, k.QUAD_ZERO)
    tiles = TileKernel(legacy_tiles.q5_0_tiles, legacy_tiles.MIN_ROWS["Q5_0"], legacy_tiles.NARROW_MIN_ROWS["Q5_0"])
    return KernelRecord(quant.get("Q5_0"), k.vec_dot, k.dequantize_row, grid=GridKernels(k.dot_4x1, k.dot_1x4), pairs=pairs, tiles=tiles)


def _q5_1() -> KernelRecord:
    from . import legacy_tiles
    from . import q5_1 as k

    tiles = TileKernel(legacy_tiles.q5_1_tiles, legacy_tiles.MIN_ROWS["Q5_1"], legacy_tiles.NARROW_MIN_ROWS["Q5_1"])
    return KernelRecord(quant.get("Q5_1"), k.vec_dot, k.dequantize_row, grid=GridKernels(k.dot_4x1, k.dot_1x4), tiles=tiles)


def _q8_0() -> KernelRecord:
    from . import q8_0 as k

    grid = GridKernels(k.dot_4x1, k.dot_1x4, apart_min_bytes=k.APART_MIN_BYTES, dot_apart=k.dot_apart)
    from . import legacy_tiles

    pairs = PairKernels(k.PAIR_KERNELS, k.ZERO_POINT, k.QUAD_ZERO)
    tiles = TileKernel(legacy_tiles.q8_0_tiles, legacy_tiles.MIN_ROWS["Q8_0"], legacy_tiles.NARROW_MIN_ROWS["Q8_0"])
    return KernelRecord(quant.get("Q8_0"), k.vec_dot, quant.get("Q8_0").dequantize_row, grid=grid, pairs=pairs, tiles=tiles)


def _q2_k() -> KernelRecord:
    from . import q2_k, q2_k_tiles, q2_k_x16

    tiles = TileKernel(q2_k_tiles.matvec_tiles, q2_k_tiles.MIN_ROWS, q2_k_tiles.NARROW_MIN_ROWS)
    # AVX-512 VNNI only: on a native AVX2 Zen 3 Gemma's decode was 6-14% slower re-laid than on the file's
    # rows in three sessions (prompts even); on Zen 4 compiled for Haswell it had been ahead
    # (docs/performance.md, thirty-seventh session)
    packed = PackedKernel(q2_k_x16.pack, q2_k_x16.matvec_packed, narrow=False)
    return KernelRecord(quant.get("Q2_K"), q2_k.vec_dot, quant.get("Q2_K").dequantize_row, tiles=tiles, packed=packed)


def _q3_k() -> KernelRecord:
    from . import q3_k, q3_k_tiles, q3_k_x16

    tiles = TileKernel(q3_k_tiles.matvec_tiles, q3_k_tiles.MIN_ROWS, q3_k_tiles.NARROW_MIN_ROWS)
    packed = PackedKernel(q3_k_x16.pack, q3_k_x16.matvec_packed)
    return KernelRecord(quant.get("Q3_K"), q3_k.vec_dot, quant.get("Q3_K").dequantize_row, tiles=tiles, packed=packed)


def _q4_k() -> KernelRecord:
    from . import kquant_rows as r
    from . import q4_k, q4_k_tiles, q4_k_x16

    rows = RowKernels(r.q4_k_pack, r.q4_k_rows_2, r.q4_k_rows_4, r.q4_k_rows_8, r.q4_k_rows_16)
    return KernelRecord(
        quant.get("Q4_K"), q4_k.vec_dot, q4_k.dequantize_row, rows=rows,
        tiles=TileKernel(q4_k_tiles.matvec_tiles, q4_k_tiles.MIN_ROWS, q4_k_tiles.NARROW_MIN_ROWS),
        packed=PackedKernel(q4_k_x16.pack, q4_k_x16.matvec_packed, q4_k_x16.matvec_packed_grouped),
    )


def _q5_k() -> KernelRecord:
    from . import kquant_rows as r
    from . import q5_k, q5_k_tiles, q5_k_x16

    rows = RowKernels(r.q5_k_pack, r.q5_k_rows_2, r.q5_k_rows_4, r.q5_k_rows_8, r.q5_k_rows_16)
    tiles = TileKernel(q5_k_tiles.matvec_tiles, q5_k_tiles.MIN_ROWS, q5_k_tiles.NARROW_MIN_ROWS)
    # AVX-512 VNNI only: compiled for Haswell its decode read 7-8 GB/s a thread from memory (in cache 20-25,
    # the row kernel 16.5 either way; docs/performance.md, thirty-fourth session)
    packed = PackedKernel(q5_k_x16.pack, q5_k_x16.matvec_packed, narrow=False)
    return KernelRecord(quant.get("Q5_K"), q5_k.vec_dot, q5_k.dequantize_row, rows=rows, tiles=tiles, packed=packed)


def _q6_k() -> KernelRecord:
    from . import kquant_rows as r
    from . import q4_k_tiles, q6_k, q6_k_tiles, q6_k_x16

    rows = RowKernels(r.q6_k_pack, r.q6_k_rows_2, r.q6_k_rows_4, r.q6_k_rows_8, r.q6_k_rows_16)
    tiles = TileKernel(q6_k_tiles.matvec_tiles, q4_k_tiles.MIN_ROWS, q4_k_tiles.NARROW_MIN_ROWS)
    # Not picked on either target yet (docs/performance.md, thirty-fifth session): made on an AVX2-only
    # Zen 3, where its prompts beat the file's rows (Gemma Q6_K pp256 +21%) but Gemma's decode took its
    # Q6_K matrices ~25% slower in the model (alone, from memory: even), not understood; AVX-512 is not
    # measured. Its products are exact on every target (test_quant_packed.py).
    packed = PackedKernel(q6_k_x16.pack, q6_k_x16.matvec_packed, narrow=False, wide=False)
    return KernelRecord(quant.get("Q6_K"), q6_k.vec_dot, q6_k.dequantize_row, rows=rows, tiles=tiles, packed=packed)


def _q8_k() -> KernelRecord:
    from . import q8_k

    return KernelRecord(quant.get("Q8_K"), q8_k.vec_dot, quant.get("Q8_K").dequantize_row)


def _iq4_nl() -> KernelRecord:
    from . import iq4_nl as k
    from . import iq4_nl_x16, legacy_tiles

    pairs = PairKernels(k.PAIR_KERNELS, k.ZERO_POINT, k.QUAD_ZERO)
    tiles = TileKernel(legacy_tiles.iq4_nl_tiles, legacy_tiles.MIN_ROWS["IQ4_NL"], legacy_tiles.NARROW_MIN_ROWS["IQ4_NL"])
    packed = PackedKernel(iq4_nl_x16.pack, iq4_nl_x16.matvec_packed)
    return KernelRecord(
        quant.get("IQ4_NL"), k.vec_dot, k.dequantize_row, grid=GridKernels(k.dot_4x1, k.dot_1x4), pairs=pairs, tiles=tiles,
        packed=packed,
    )


def _iq4_xs() -> KernelRecord:
    from . import iq4_tiles, iq4_xs, iq4_xs_x16

    tiles = TileKernel(iq4_tiles.matvec_tiles_xs, iq4_tiles.MIN_ROWS, iq4_tiles.NARROW_MIN_ROWS)
    packed = PackedKernel(iq4_xs_x16.pack, iq4_xs_x16.matvec_packed)
    return KernelRecord(quant.get("IQ4_XS"), iq4_xs.vec_dot, iq4_xs.dequantize_row, tiles=tiles, packed=packed)


def _mxfp4() -> KernelRecord:
    from . import mxfp4 as k

    pairs = PairKernels(k.PAIR_KERNELS, k.ZERO_POINT, k.QUAD_ZERO)
    return KernelRecord(quant.get("MXFP4"), k.vec_dot, k.dequantize_row, grid=GridKernels(k.dot_4x1, k.dot_1x4), pairs=pairs)


_TABLE: dict[str, Callable[[], KernelRecord]] = {
    "F32": _f32, "F16": _f16, "BF16": _bf16,
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k, "Q8_K": _q8_k,
    "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs, "MXFP4": _mxfp4,
}


def kernel_record(qt: QuantType | str) -> KernelRecord:
    """The CPU kernels of a quant type (a QuantType or its name). Configures Numba first (idempotent), so
    every kernel is compiled as the backend compiles it."""
    return _record(qt.name if isinstance(qt, QuantType) else quant.get(qt).name)


@lru_cache(maxsize=None)
def _record(name: str) -> KernelRecord:
    configure_numba()
    return _TABLE[name]()


def kernel_records() -> list[KernelRecord]:
    """Every type's record, in quant's order (tests are parametrised over it)."""
    return [kernel_record(name) for name in quant.supported_names()]
