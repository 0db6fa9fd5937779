"""BF16 weight products on AMX's tile unit (`tdpbf16ps`), on the CPUs that have it (Intel Xeon from
Sapphire Rapids on), at every batch size: decode, batched decode and prefill.

Why: float weights are bound by the fused multiply-adds (float_panels, where llama.cpp's F16 and BF16
paths sit too), while one `tdpbf16ps` multiplies a 16 x 32 tile of bfloat16 by a 32 x 16 one into 16 x
16 float32 sums in about the time of a dozen of those fused multiply-adds, whatever the tiles' shapes
(docs/performance.md has the figures).

The operands are bfloat16. A BF16 weight is one; an activation x enters as two parts, x = x_hi + x_mid
+ e: x_hi the bfloat16 nearest x, x_mid the one nearest x - x_hi (exact in float32), the rest e (|e| <=
2^-17 |x|) dropped: about 17 significant bits, where llama.cpp rounds BF16's activations to 8. Every
product of a weight and a part is exact in float32.

The order, the same for every output element at every batch size: two float32 sums per (weight row,
activation row), S_hi over w * x_hi and S_mid over w * x_mid, each zero at first and then taking, for
each chunk of CHUNK = 32 elements along K in order, one `tdpbf16ps`; the value is S_hi + S_mid. How the
unit adds the 32 products of one instruction into a sum is its own (not float32 additions in any element
order we tried: measured), but it is the same for every element of every tile shape, so a row's value
does not depend on the batch it is in, nor on the layout the weights are read from
(tests/backends/cpu/test_amx.py).

Operands: weights are the A operand (16 weight rows x 64 bytes), read from the file's rows (stride: the
row's bytes) or from `pack`'s re-laid copy, where each tile's 1 KiB is contiguous and decode streams the
matrix in order, as fast as the fused multiply-adds' one-row kernel of the time (from the rows, 16 rows at a time, it does not
keep up); the activations are the B operand (K/2 rows of pairs, up to 16 activation rows across:
`split_activations`); the sums are C tiles (16 weight rows x up to 16 activation rows). K must be a
multiple of CHUNK (every matrix of the models we run; the others take float_panels' kernels, at every
batch size: bf16.py decides).

F16 weights take float_panels' kernels everywhere: an F16 weight is two bfloat16 parts (8 + 3 significant
bits), and splitting them on the fly costs more than the products save in decode (docs/performance.md).

The tile instructions, and the OS's grant of the tile registers that must come before them, are in
amx_tiles.py; `matmul` runs nothing before `available()` said yes.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ....jit import cached_kernel, exact_kernel, f32_bits, u32_as_f32
from .amx_tiles import (  # noqa: F401 (available, target_has_amx: this module's interface too)
    available,
    prefetch_line,
    set_tile,
    target_has_amx,
    tile_configure,
    tile_dot,
    tile_move,
    tile_release,
    tile_zero,
)

CHUNK = 32  # K elements per tile step: 64 bytes of bfloat16 per weight row
CHUNK_BYTES = 2 * CHUNK
ROWS = 16  # weight rows per A tile (the C tiles' rows)
STEP_ROWS = 2 * ROWS  # weight rows per step: two A tiles
GROUP = 16  # activation rows per B tile (the C tiles' columns)
PARTS = 2  # bfloat16 parts per activation (x_hi, x_mid)
PREFETCH_AHEAD = 4096  # bytes ahead of a tile in the re-laid copy (four tiles)

# Tile registers, two ways of using the eight:
# - the grid (two activation groups or more: prefill): four sums, two weight tiles (rows r0.. and
#   r0 + 16..), the two activation tiles (x_hi, x_mid) of one group: S0 = A0 x_hi, S1 = A0 x_mid,
#   S2 = A1 x_hi, S3 = A1 x_mid;
# - the stream (one group: decode): two sums over 16 weight rows (S_hi, S_mid), and the weight and
#   activation tiles twice, for even and odd chunks: a tile register is not renamed, so the next chunk's
#   loads would wait for the products still reading this chunk's tiles (with one set, decode streamed
#   ~15% slower than the fused multiply-adds' one-row kernel of the time).
T_S0, T_S1, T_S2, T_S3, T_A0, T_A1, T_B0, T_B1 = range(8)
T_HI, T_MID, T_A_EVEN, T_A_ODD, T_BH_EVEN, T_BM_EVEN, T_BH_ODD, T_BM_ODD = range(8)

# The helpers of the tile loops, inlined into them (called, the decode stream ran ~20% slower).
inline_kernel = cached_kernel(nogil=True, error_model="numpy", inline="always")

zero_s0, zero_s1, zero_s2, zero_s3 = (tile_zero(t) for t in (T_S0, T_S1, T_S2, T_S3))
store_s0, store_s1, store_s2, store_s3 = (tile_move(t, "llvm.x86.tilestored64") for t in (T_S0, T_S1, T_S2, T_S3))
load_t2, load_t3, load_t4, load_t5, load_t6, load_t7 = (tile_move(t, "llvm.x86.tileloadd64") for t in range(2, 8))
load_a0, load_a1, load_b0, load_b1 = load_t4, load_t5, load_t6, load_t7  # the grid's operands
dot_s0, dot_s1, dot_s2, dot_s3 = (tile_dot(s, a, b) for s, a, b in (
    (T_S0, T_A0, T_B0), (T_S1, T_A0, T_B1), (T_S2, T_A1, T_B0), (T_S3, T_A1, T_B1)))
dot_hi_even, dot_mid_even, dot_hi_odd, dot_mid_odd = (tile_dot(s, a, b) for s, a, b in (
    (T_HI, T_A_EVEN, T_BH_EVEN), (T_MID, T_A_EVEN, T_BM_EVEN), (T_HI, T_A_ODD, T_BH_ODD), (T_MID, T_A_ODD, T_BM_ODD)))


# ----- the operands -----


@exact_kernel
def _bfloat16_nearest(bits):
    """The bfloat16 (16 bits, as an int) nearest a float32 given by its bits, ties to even."""
    word = np.int64(bits) & 0xFFFFFFFF
    return ((word + 0x7FFF + ((word >> 16) & 1)) >> 16) & 0xFFFF


@exact_kernel(parallel=True)
def split_activations(x, parts):
    """x float32[T, K] -> parts uint32[PARTS, ceil(T / GROUP), K / 2, min(T, GROUP)]: word (kk, j) of
    group g holds activation row t = g * GROUP + j's elements 2kk (low half) and 2kk + 1 (high half) as
    bfloat16, [0] the x_hi parts, [1] the x_mid parts. Words of rows past T are not written (the tiles of
    the last group read only its rows). Groups in parallel."""
    for g in prange(parts.shape[1]):
        _split_group(x, parts, g)


@exact_kernel
def _split_group(x, parts, g):
    n_rows, k = x.shape
    for j in range(min(GROUP, n_rows - g * GROUP)):
        row = x[g * GROUP + j]
        for kk in range(k // 2):
            hi_word = 0
            mid_word = 0
            for e in range(2):
                value = row[2 * kk + e]
                hi = _bfloat16_nearest(f32_bits(value))
                rest = value - u32_as_f32(hi << 16)  # exact: |rest| <= 2^-9 |value|
                hi_word |= hi << (16 * e)
                mid_word |= _bfloat16_nearest(f32_bits(rest)) << (16 * e)
            parts[0, g, kk, j] = hi_word
            parts[1, g, kk, j] = mid_word


def pack(weights: np.ndarray) -> np.ndarray:
    """BF16 rows uint8[N, row_bytes] -> uint8[ceil(N / ROWS), chunks, ROWS, CHUNK_BYTES]: each tile (16
    rows of a chunk, 1 KiB) contiguous, a group of 16 rows' tiles in chunk order; rows past N zero (never
    read: the last group's tiles have only its rows). Allocated by NumPy, which advises huge pages for
    large arrays (a copy in 4 KiB pages streams ~15% slower in decode)."""
    n_weights, row_bytes = weights.shape
    packed = np.empty((-(-n_weights // ROWS), row_bytes // CHUNK_BYTES, ROWS, CHUNK_BYTES), dtype=np.uint8)
    _pack_into(weights, packed)
    return packed


@exact_kernel(parallel=True)
def _pack_into(weights, packed):
    n_weights = weights.shape[0]
    for group in prange(packed.shape[0]):
        for i in range(ROWS):
            r = group * ROWS + i
            for c in range(packed.shape[1]):
                for b in range(CHUNK_BYTES):
                    packed[group, c, i, b] = weights[r, c * CHUNK_BYTES + b] if r < n_weights else 0


# ----- the product -----


@exact_kernel
def _configure_grid(config, m0, m1, n):
    """Palette 1; A0 m0 weight rows and A1 m1 (0: unused) of 64 bytes; B0, B1 16 rows (pairs along K) of
    n words; the sums on A0 (S0, S1) m0 rows and on A1 (S2, S3) m1 rows of n floats."""
    config[:] = 0
    config[0] = 1
    for tile, rows in ((T_S0, m0), (T_S1, m0), (T_S2, m1), (T_S3, m1)):
        if rows:
            set_tile(config, tile, rows, 4 * n)
    set_tile(config, T_A0, m0, CHUNK_BYTES)
    if m1:
        set_tile(config, T_A1, m1, CHUNK_BYTES)
    set_tile(config, T_B0, CHUNK // 2, 4 * n)
    set_tile(config, T_B1, CHUNK // 2, 4 * n)


@exact_kernel
def _configure_stream(config, m, n):
    """Palette 1; the sums m rows of n floats, the weight tiles m rows of 64 bytes, the activation tiles
    16 rows of n words."""
    config[:] = 0
    config[0] = 1
    for tile in (T_HI, T_MID):
        set_tile(config, tile, m, 4 * n)
    for tile in (T_A_EVEN, T_A_ODD):
        set_tile(config, tile, m, CHUNK_BYTES)
    for tile in (T_BH_EVEN, T_BM_EVEN, T_BH_ODD, T_BM_ODD):
        set_tile(config, tile, CHUNK // 2, 4 * n)


@inline_kernel
def _prefetch_packed(packed, r, c):
    """Ask for the 16 lines PREFETCH_AHEAD bytes past the re-laid tile of rows r.. at chunk c."""
    at = (r // ROWS) * packed.strides[0] + c * packed.strides[1] + PREFETCH_AHEAD
    for line in range(0, ROWS * CHUNK_BYTES, 64):
        prefetch_line(packed, at + line)


@inline_kernel
def _prefetch_rows(weights, r, count, c):
    """Ask for line c of the file's rows r..r+count-1 (those that exist): the tiles read 16 or 32 rows
    at once, more streams than the hardware prefetchers follow."""
    for i in range(min(count, weights.shape[0] - r)):
        prefetch_line(weights, (r + i) * weights.strides[0] + c * CHUNK_BYTES)


@inline_kernel
def _grid_sums(weights, packed, r0, m0, m1, parts, g, prefetch, sums):
    """The grid's four sums (weight rows r0.. and r0 + 16.., activation group g) into sums float32[4,
    ROWS, GROUP]: the weight tiles from `packed` (pack's layout) where it has rows, else from the rows of
    `weights`; `prefetch`: ask for the lines the next chunks read."""
    chunks = parts.shape[2] * 2 // CHUNK
    tiled = packed.shape[0] > 0
    row_bytes = weights.strides[0]
    zero_s0()
    zero_s1()
    if m1:
        zero_s2()
        zero_s3()
    for c in range(chunks):
        if prefetch and tiled:
            _prefetch_packed(packed, r0, c)
            if m1:
                _prefetch_packed(packed, r0 + ROWS, c)
        elif prefetch:
            _prefetch_rows(weights, r0 + 2 * ROWS, 2 * ROWS, c)
        x_at = g * parts.strides[1] + c * parts.strides[2] * (CHUNK // 2)
        load_b0(parts, x_at, parts.strides[2])
        load_b1(parts, parts.strides[0] + x_at, parts.strides[2])
        if tiled:
            load_a0(packed, (r0 // ROWS) * packed.strides[0] + c * packed.strides[1], CHUNK_BYTES)
            if m1:
                load_a1(packed, (r0 // ROWS + 1) * packed.strides[0] + c * packed.strides[1], CHUNK_BYTES)
        else:
            load_a0(weights, r0 * row_bytes + c * CHUNK_BYTES, row_bytes)
            if m1:
                load_a1(weights, (r0 + ROWS) * row_bytes + c * CHUNK_BYTES, row_bytes)
        dot_s0()
        dot_s1()
        if m1:
            dot_s2()
            dot_s3()
    group_bytes = 4 * GROUP
    store_s0(sums, 0, group_bytes)
    store_s1(sums, ROWS * group_bytes, group_bytes)
    if m1:
        store_s2(sums, 2 * ROWS * group_bytes, group_bytes)
        store_s3(sums, 3 * ROWS * group_bytes, group_bytes)


@inline_kernel
def _stream_sums(weights, packed, r0, parts, sums):
    """The stream's two sums (weight rows r0.., the one activation group) into sums[0] (S_hi) and
    sums[1] (S_mid): chunk by chunk in order, even chunks on one set of operand tiles, odd on the other.
    Always asks for the lines ahead (decode reads its matrices from memory)."""
    chunks = parts.shape[2] * 2 // CHUNK
    tiled = packed.shape[0] > 0
    zero_s0()
    zero_s1()
    for c in range(0, chunks, 2):
        _stream_chunk_even(weights, packed, tiled, r0, c, parts)
        if c + 1 < chunks:
            _stream_chunk_odd(weights, packed, tiled, r0, c + 1, parts)
    group_bytes = 4 * GROUP
    store_s0(sums, 0, group_bytes)
    store_s1(sums, ROWS * group_bytes, group_bytes)


@inline_kernel
def _stream_weight_at(weights, packed, tiled, r0, c):
    """The byte offset of the weight tile of rows r0.. at chunk c (in `packed` where `tiled`, else in
    `weights`), the lines ahead of it asked for."""
    if tiled:
        _prefetch_packed(packed, r0, c)
        return (r0 // ROWS) * packed.strides[0] + c * packed.strides[1]
    _prefetch_rows(weights, r0 + ROWS, ROWS, c)
    return r0 * weights.strides[0] + c * CHUNK_BYTES


# The stream's even and odd chunks: the same steps on the two sets of operand registers (tile numbers
# are immediates, so each set has its own intrinsics).
@inline_kernel
def _stream_chunk_even(weights, packed, tiled, r0, c, parts):
    at = _stream_weight_at(weights, packed, tiled, r0, c)
    x_at, word_rows = c * parts.strides[2] * (CHUNK // 2), parts.strides[2]
    load_t4(parts, x_at, word_rows)
    load_t5(parts, parts.strides[0] + x_at, word_rows)
    if tiled:
        load_t2(packed, at, CHUNK_BYTES)
    else:
        load_t2(weights, at, weights.strides[0])
    dot_hi_even()
    dot_mid_even()


@inline_kernel
def _stream_chunk_odd(weights, packed, tiled, r0, c, parts):
    at = _stream_weight_at(weights, packed, tiled, r0, c)
    x_at, word_rows = c * parts.strides[2] * (CHUNK // 2), parts.strides[2]
    load_t6(parts, x_at, word_rows)
    load_t7(parts, parts.strides[0] + x_at, word_rows)
    if tiled:
        load_t3(packed, at, CHUNK_BYTES)
    else:
        load_t3(weights, at, weights.strides[0])
    dot_hi_odd()
    dot_mid_odd()


@exact_kernel
def _add_stream_sums(out, sums, r0, m):
    """out[t, r0 + i] = S_hi + S_mid of weight row r0 + i, activation row t, for i < m."""
    for j in range(out.shape[0]):
        for i in range(m):
            out[j, r0 + i] = sums[0, i, j] + sums[1, i, j]


@exact_kernel(parallel=True)
def stream_matmul(weights, packed, n_weights, x, out, runs):
    """out[t, r] = weight row r . activation row t for every r < n_weights and t < T <= GROUP (the
    module's order), by the stream: the weights as BF16 rows uint8[N, row_bytes] (K % CHUNK == 0), or
    re-laid by `pack` (then `weights` is unused), x float32[T, K], split by each thread for itself (for
    so few rows that costs less than another parallel region), out float32[T, N]. The groups of 16
    weight rows split into `runs` contiguous runs, one per thread."""
    n_rows = out.shape[0]
    tiles = (n_weights + ROWS - 1) // ROWS
    for run in prange(runs):
        config = np.zeros(64, dtype=np.uint8)
        sums = np.empty((2, ROWS, GROUP), dtype=np.float32)
        parts = np.empty((PARTS, 1, x.shape[1] // 2, n_rows), dtype=np.uint32)
        _split_group(x, parts, 0)
        configured = -1
        for tile in range(run * tiles // runs, (run + 1) * tiles // runs):
            r0 = tile * ROWS
            m = min(ROWS, n_weights - r0)
            if m != configured:
                _configure_stream(config, m, n_rows)
                tile_configure(config)
                configured = m
            _stream_sums(weights, packed, r0, parts, sums)
            if n_rows == 1 and m == ROWS:  # decode: a loop of known length, in line (with the lengths
                for i in range(ROWS):  # known only at run time, the whole stream ran ~10% slower)
                    out[0, r0 + i] = sums[0, i, 0] + sums[1, i, 0]
            else:
                _add_stream_sums(out, sums, r0, m)
        tile_release()


@exact_kernel(parallel=True)
def grid_matmul(weights, packed, n_weights, parts, out, runs):
    """stream_matmul's values for any T, by the grid (two activation groups or more: prefill), from
    parts split beforehand; the steps of 32 weight rows split into `runs` contiguous runs."""
    n_rows = out.shape[0]
    steps = (n_weights + STEP_ROWS - 1) // STEP_ROWS
    for run in prange(runs):
        config = np.zeros(64, dtype=np.uint8)
        sums = np.empty((4, ROWS, GROUP), dtype=np.float32)
        configured = (-1, -1, -1)
        for step in range(run * steps // runs, (run + 1) * steps // runs):
            r0 = step * STEP_ROWS
            m0 = min(ROWS, n_weights - r0)
            m1 = min(ROWS, max(0, n_weights - r0 - ROWS))
            for g in range(parts.shape[1]):
                n = min(GROUP, n_rows - g * GROUP)
                if (m0, m1, n) != configured:
                    _configure_grid(config, m0, m1, n)
                    tile_configure(config)
                    configured = (m0, m1, n)
                _grid_sums(weights, packed, r0, m0, m1, parts, g, g == 0, sums)
                for j in range(n):
                    t = g * GROUP + j
                    for i in range(m0):
                        out[t, r0 + i] = sums[0, i, j] + sums[1, i, j]
                    for i in range(m1):
                        out[t, r0 + ROWS + i] = sums[2, i, j] + sums[3, i, j]
        tile_release()


NOT_PACKED = np.zeros((0, 0, ROWS, CHUNK_BYTES), dtype=np.uint8)


def suits(weights: np.ndarray) -> bool:
    """Whether a matrix of BF16 rows takes the tile kernels: rows of a multiple of CHUNK elements, on a
    machine that has them."""
    return weights.ndim == 2 and weights.shape[1] % CHUNK_BYTES == 0 and available()


def matmul(weights: np.ndarray, x: np.ndarray, out: np.ndarray, threads: int, packed: np.ndarray = NOT_PACKED) -> None:
    """out[T, N] = x[T, K] @ W.T from the rows of `weights` (uint8[N, row_bytes]), or from their `pack`ed
    copy (then `weights` only gives N and K): the stream for up to GROUP activation rows, else the grid.
    Only after available() said yes."""
    if not available():
        raise RuntimeError("the AMX kernels were called in a process without the tile registers")
    rows = x.shape[0]
    if rows <= GROUP:
        stream_matmul(weights, packed, weights.shape[0], x, out, max(1, threads))
        return
    parts = np.empty((PARTS, -(-rows // GROUP), x.shape[1] // 2, GROUP), dtype=np.uint32)
    split_activations(x, parts)
    grid_matmul(weights, packed, weights.shape[0], parts, out, max(1, threads))
