"""The Numba CPU backend: the default. Weights stay quantized in the memory-mapped file (Q4_K matrices
re-laid 16 rows at a time at their first product, their file pages then released: matmul.PackedWeights)."""

from __future__ import annotations

import logging
import os

import numba
import numpy as np

from ... import quant
from ...errors import LocalLLMError
from ..base import Backend, Weight
from . import attention_decode, kernels
from .attention_blas import BlasAttention
from .matmul import (
    BLAS_MIN_ROWS,
    INTEGER_ALWAYS,
    MatmulScratch,
    PackedWeights,
    blas_min_rows,
    gather_rows_kernel,
    matmul,
    matmul_rows,
    matmul_segments,
    matvec_kernel,
)
from .threads import DecodeThreads, configure_openmp_waiting
from .tiers import BackgroundCompile, compile_mode, fits_basic_tier, prepared

log = logging.getLogger(__name__)


class _FailedCompile:
    """Stands for a background compile that failed and was reported: never finished again."""

    finished = ready = False

    def wait(self, timeout=None) -> bool:
        return False


# Bounded spinning for idle OpenMP workers, before Numba starts its pool (see threads.py).
configure_openmp_waiting()


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


def _numba_threads_now() -> int:
    """numba.get_num_threads() without its lock: that function first makes sure the thread pool is
    launched (taking a lock, ~4 us), then reads a thread-local through the threading layer. Once the pool
    is up (any CPUBackend launches it) the read alone is what we need; Numba's public function is the
    fallback if its internals move."""
    return _read_numba_threads()


_read_numba_threads = None


def _resolve_numba_threads_reader():
    numba.get_num_threads()  # launches the pool, which sets the reader up
    from numba.np.ufunc import parallel

    reader = getattr(parallel, "_get_num_threads", None)
    if reader is None:
        return numba.get_num_threads
    try:
        if int(reader()) == numba.get_num_threads():
            return reader
    except Exception:  # pragma: no cover - depends on Numba internals
        pass
    return numba.get_num_threads


# Ops smaller than this many elements, and matrix-vector products over fewer weight bytes, run on one
# thread (see CPUBackend._threads_for): waking a worker costs more than they take. Gemma 3 270M decode,
# 2 threads, quiet machine, one process per setting of the OpenMP workers, alternating thresholds
# (tok/s, two passes): with the workers spinning briefly between regions (GOMP_SPINCOUNT=30000, see
# threads.py) 94/91 with matrices over 1 MiB on both threads (all its per-layer matrices but
# ffn_down on one), 108/97 over 256 KiB, 104/100 over 64 KiB; with sleeping workers
# (OMP_WAIT_POLICY=PASSIVE) the order reverses: 79-87 over 1 MiB, 74-75 over 256 KiB, 66-68 over 64 KiB.
SMALL_OP_WORK = 1 << 16
SMALL_MATVEC_BYTES = 1 << 16
SMALL_ATTENTION_WORK = 1 << 18
PARALLEL_STORE_ROWS = 16  # from this many rows kv_store converts to float16 in a kernel (a prefill's)


_blas_threads = None  # the OpenBLAS thread count last set by _limit_blas_threads


def _limit_blas_threads(n: int) -> None:
    """BLAS's thread count, process-wide (set only when it changes: threadpoolctl takes ~1 ms).
    A model whose matrix products all run on the integer kernels uses BLAS only for prefill attention,
    and there OpenBLAS's second thread costs more than it brings: its idle workers keep polling, and
    the two-thread Numba products next to them slow down (Gemma 3 270M pp512, 2 threads: 680-720
    tok/s with 2 BLAS threads, 1170-1230 with 1; with 1 Numba thread 920-940 against 840-890)."""
    global _blas_threads
    if n != _blas_threads:
        import threadpoolctl

        threadpoolctl.threadpool_limits(limits=n, user_api="blas")
        _blas_threads = n


class CPUBackend(Backend):
    name = "cpu"

    def __init__(self, threads: int | None = None, repack: bool | None = None):
        self.threads = threads or physical_cores()
        # Re-lay Q4_K matrices 16 rows at a time at their first product (matmul.PackedWeights), as
        # llama.cpp repacks; LOCALLLM_REPACK=0 keeps every weight in the file's layout.
        self.repack = os.environ.get("LOCALLLM_REPACK", "1") != "0" if repack is None else repack
        self._layouts: dict[int, tuple] = {}  # id(weight) -> (weight, its PackedWeights or its data)
        if self.threads < 1:
            raise LocalLLMError(f"threads must be >= 1, got {self.threads}")
        self._numba_threads = min(self.threads, numba.config.NUMBA_NUM_THREADS)
        numba.set_num_threads(self._numba_threads)
        global _read_numba_threads
        if _read_numba_threads is None:
            _read_numba_threads = _resolve_numba_threads_reader()
        # BLAS (prefill of types without multi-row kernels, prefill attention) gets the same thread count
        # as our kernels, or one once the model's weights show it is used for attention only (begin_step).
        _limit_blas_threads(self.threads)
        self._matmuls_use_blas = False  # set by upload() for a matrix of a type without multi-row kernels
        self.scratch = MatmulScratch()
        self._inv_freq: dict[tuple, np.ndarray] = {}
        self._rope_cache: dict[tuple, tuple] = {}  # RoPE setting -> (positions bytes, cos, sin) of the last step
        self._scores = np.empty(0, dtype=np.float32)
        self._blas_attention = BlasAttention()
        self._gelu_table = None
        self._paged_rows = np.empty(0, dtype=np.int32)
        self._decode = DecodeThreads(self._numba_threads)  # the thread count of each decode step
        self._matvec_plans: dict[int, tuple] = {}  # id(weight) -> what _matvec needs (see there)
        # While a BackgroundCompile is running, the basic tier (tiers.py): no re-laid matrices, products
        # of several rows row by row, serial small ops, our kernels on one thread (the compile has the
        # other cores). A plain attribute: the ops read it ~300 times a decode step.
        self.basic_tier = False
        self.background: BackgroundCompile | None = None

    def prepare_kernels(self, model_path) -> None:
        """Called once the model is bound: on a cold start (no marker for this model, LOCALLLM_COMPILE
        not "foreground") of a model small enough that its prompts go fast row by row, start the
        background compile and run in the basic tier until it is done."""
        if compile_mode() == "foreground" or prepared(model_path, self.repack) or not fits_basic_tier(model_path):
            return
        background = BackgroundCompile(model_path, self.repack)
        try:
            background.start()
        except OSError:  # no process or no kernel folder to be had: compile when first called, as before
            return
        self.background = background
        self.basic_tier = True

    def wait_for_kernels(self) -> None:
        if self.background is not None:
            self.background.wait()
            self._leave_basic_tier()

    def _leave_basic_tier(self) -> None:
        """The full tier from now on: its kernels are in the cache (or, if the background compile failed,
        compile when first called). Between two forward passes: the results are the same bits."""
        self.basic_tier = False
        self.background = None
        self._matvec_plans.clear()  # planned on the file's layout; the full tier re-lays matrices
        self._decode = DecodeThreads(self._numba_threads)  # what it measured was one-thread steps

    def begin_step(self, rows: int) -> None:
        if self.basic_tier and self.background.finished:
            if self.background.ready:
                self._leave_basic_tier()
            else:  # stay in the basic tier: slower, but no compile in the middle of a reply
                log.warning("warning: compiling the faster kernels in the background failed (%s); this "
                            "session keeps the basic ones", self.background.marker.with_suffix(".log"))
                self.background = _FailedCompile()
        # Every step is measured, keyed by its row count: in a prefill only the one-row ops (the output
        # projection of the last row) take this count, in the server's batched steps every decode row.
        self._decode.begin(rows)
        _limit_blas_threads(self.threads if self._matmuls_use_blas else 1)
        self._blas_attention.workers = 1 if self._matmuls_use_blas else self.threads

    def end_step(self) -> None:
        self._decode.end()

    def supports(self, qtype: str) -> bool:
        return quant.is_supported(qtype)

    def upload(self, weight: Weight) -> Weight:
        if len(weight.shape) >= 2 and quant.is_supported(weight.qtype):
            self._matmuls_use_blas |= blas_min_rows(quant.get(weight.qtype)) < INTEGER_ALWAYS
        return weight

    def alloc(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype=dtype)

    def to_host(self, buffer):
        return buffer

    def matmul(self, w: Weight, x, out, bias=None) -> None:
        if x.shape[0] == 1:
            self._matvec(w, x, out)
        else:
            qt = quant.get(w.qtype)
            rows = x.shape[0]
            if self.basic_tier and rows < blas_min_rows(qt):
                for t in range(rows):  # each row as the multi-row kernels would compute it
                    self._matvec(w, x[t : t + 1], out[t : t + 1])
                if bias is not None:
                    out += bias
                return
            self._threads_for(rows, rows * w.data.nbytes, SMALL_MATVEC_BYTES, blas=rows >= blas_min_rows(qt))
            matmul(qt, self._layout_of(w), x, out, self.scratch)
        if bias is not None:
            out += bias

    def _matvec(self, w: Weight, x, out) -> None:
        """out[0] = W @ x[0], as matmul computes one row (matmul._integer_rows), with what it looks up
        per call (type, kernel, activation buffers, thread rule) kept per weight: a decode step of
        Gemma 3 270M makes ~130 of these calls, and the lookups were ~4 us of each (~5% of the step)."""
        plan = self._matvec_plans.get(id(w))
        if plan is None:
            qt = quant.get(w.qtype)
            small = w.data.nbytes < SMALL_MATVEC_BYTES
            layout = self._layout_of(w)
            packed = layout if isinstance(layout, PackedWeights) else None
            # the plan holds w, so its id cannot be reused by another weight while the entry lives
            plan = self._matvec_plans[id(w)] = (w, matvec_kernel(qt), self.scratch.activation(qt.act, x.shape[1]), small, packed)
        _, kernel, activation, small, packed = plan
        wanted = 1 if small or self.basic_tier else self._decode.now()
        if _numba_threads_now() != wanted:
            numba.set_num_threads(wanted)
        if packed is not None:
            packed.matmul(x, out, self.scratch, wanted)
            return
        kernel(w.data, out[0], *activation.quantize(x[0]))

    def _layout_of(self, w: Weight):
        """What the matrix products read for w: its re-laid rows (PackedWeights, made at the first
        product, when the backend repacks and the type and target gain from it), else the mapped bytes."""
        entry = self._layouts.get(id(w))
        if entry is None:
            if self.basic_tier:
                return w.data  # not recorded: the full tier may re-lay it
            data = w.data
            if self.repack and quant.is_supported(w.qtype) and PackedWeights.suits(quant.get(w.qtype), data):
                data = PackedWeights(quant.get(w.qtype), data)
            entry = self._layouts[id(w)] = (w, data)  # holds w: its id is not reused while the entry lives
        return entry[1]

    def matmul_segments(self, w: Weight, x, out, bounds, bias=None) -> None:
        qt = quant.get(w.qtype)
        longest = int(max(b - a for a, b in zip(bounds[:-1], bounds[1:])))
        self._threads_for(x.shape[0], blas=longest >= blas_min_rows(qt))
        matmul_segments(qt, self._layout_of(w), x, out, bounds, self.scratch)
        if bias is not None:
            out += bias

    def matmul_rows(self, w: Weight, x, out, bias=None) -> None:
        qt = quant.get(w.qtype)
        self._threads_for(1)  # the decode path's thread count, whatever the number of rows
        matmul_rows(qt, self._layout_of(w), x, out, self.scratch)
        if bias is not None:
            out += bias

    def embed(self, w: Weight, ids, out) -> None:
        gather_rows_kernel(quant.get(w.qtype))(w.data, ids, out)

    def _threads_for(self, rows: int, work: int | None = None, limit: int = 0, blas: bool | None = None) -> None:
        """Numba's thread count for an op over `rows` rows. Batches of BLAS_MIN_ROWS rows or more are a
        prefill; where the model has matrices whose prefill products run in BLAS (types without
        multi-row kernels), BLAS has all the backend's threads and its workers spin between calls, so
        parallel Numba kernels in between would fight them for the cores (measured on Gemma 3 270M
        pp512, 2 threads, when its products went through BLAS: 272 tok/s with 2-thread kernels, 546
        with 1-thread ones): those run on one thread. Without such matrices BLAS has one thread (begin_step)
        and the norms, RoPE and activations of a prefill get the governor's count (Gemma 3 270M pp512,
        2 threads, seven alternating runs: median +4%).

        work: the op's size in elements, for the small ops of a decode step (a norm or activation of one
        row, attention over a short context): under `limit` (default SMALL_OP_WORK) they run on the
        calling thread alone (the norms, RoPE, activations and attention through their serial twins
        without coming here: _parallel); a matrix-vector product passes its weight bytes and
        SMALL_MATVEC_BYTES.
        Waking the pool costs more than such an op: measured, rms_norm of 1x640 took 7-70 us on 2 threads
        (the second thread's wake-up, and worse when another process holds that core) against 1.6 us
        on one, and a decode step of Gemma 3 270M runs ~200 of them. Same kernel either way: the
        results do not depend on the thread count.

        blas: whether the op hands its work to BLAS (default: a batch of BLAS_MIN_ROWS rows or more);
        a matrix product of a type with multi-row integer kernels never does (matmul.blas_min_rows), and
        gets the governor's count at any size."""
        small = work is not None and work < (limit or SMALL_OP_WORK)
        if blas is None:
            blas = rows >= BLAS_MIN_ROWS and self._matmuls_use_blas
        wanted = 1 if blas or small or self.basic_tier else self._decode.now()
        # The setting is per calling thread (and others may change it), so it is read back rather than
        # remembered here; both calls cost microseconds with Numba's locking, and a token runs ~300 ops.
        if _numba_threads_now() != wanted:
            numba.set_num_threads(wanted)

    def _parallel(self, rows: int, work: int, limit: int = 0) -> bool:
        """Whether an op runs its parallel kernel (on the thread count _threads_for sets) rather than its
        serial twin on the calling thread, which a small op (_threads_for's `work` under `limit`) does
        without touching the thread count (kernels.rms_norm_serial)."""
        if work < (limit or SMALL_OP_WORK) or self.basic_tier:
            return False
        self._threads_for(rows, work, limit)
        return True

    def rms_norm(self, x, weight, eps, out) -> None:
        d = weight.shape[0]
        kernel = kernels.rms_norm if self._parallel(x.shape[0], x.size) else kernels.rms_norm_serial
        kernel(x.reshape(-1, d), weight, np.float32(eps), out.reshape(-1, d))

    def rope(self, x, positions, n_rot, base, neox, freq_factors=None, freq_scale=1.0) -> None:
        key = (n_rot, float(base), float(freq_scale), id(freq_factors))
        inv_freq = self._inv_freq.get(key)
        if inv_freq is None:
            inv_freq = np.empty(n_rot // 2, dtype=np.float32)
            factors = np.asarray(freq_factors, dtype=np.float32) if freq_factors is not None else np.empty(0, np.float32)
            kernels.rope_inv_freqs(n_rot, float(base), float(freq_scale), factors, inv_freq)
            self._inv_freq[key] = inv_freq
        cos, sin = self._rope_angles(key, inv_freq, positions)
        kernel = kernels.rope if self._parallel(x.shape[0], x.size) else kernels.rope_serial
        kernel(x, cos, sin, bool(neox))

    def _rope_angles(self, key, inv_freq, positions):
        """The (cos, sin) table of these positions, computed once per step and RoPE setting: a step
        rotates q and k of every layer at the same positions (Gemma 3: 36 rotations, 2 settings), and
        the sines and cosines were most of a rotation's time (17 of ~20 us for 8 rows)."""
        tag = positions.tobytes()
        cached = self._rope_cache.get(key)
        if cached is not None and cached[0] == tag:
            return cached[1], cached[2]
        cos = np.empty((positions.shape[0], inv_freq.shape[0]), dtype=np.float32)
        sin = np.empty_like(cos)
        kernels.rope_table(positions, inv_freq, cos, sin)
        self._rope_cache[key] = (tag, cos, sin)
        return cos, sin

    def kv_store(self, cache_k, cache_v, k, v, start) -> None:
        n = k.shape[0]
        if n < PARALLEL_STORE_ROWS:
            cache_k[start : start + n] = k  # numpy rounds float32 -> float16 to nearest even, in place
            cache_v[start : start + n] = v
            return
        self._threads_for(n)
        for src, cache in ((k, cache_k), (v, cache_v)):
            kernels.store_f16_block(src.reshape(n, *cache.shape[1:]), cache.view(np.uint16), start)

    def attention(self, q, cache_k, cache_v, start, scale, window, out) -> None:
        n_tokens, n_head, _ = q.shape
        if n_tokens >= BLAS_MIN_ROWS:  # prefill: matrix products through BLAS
            self._blas_attention(q, cache_k, cache_v, start, scale, window, out)
            return
        needed = n_tokens * n_head * (start + n_tokens)
        # work: scores times head_dim (Gemma 3 270M: one thread up to 256 cached positions)
        parallel = self._parallel(n_tokens, needed * q.shape[2], SMALL_ATTENTION_WORK)
        if self._scores.size < needed:
            self._scores = np.empty(needed, dtype=np.float32)
        scores = self._scores[:needed].reshape(n_tokens * n_head, start + n_tokens)
        if self.basic_tier:
            attention_decode.attention_by_head(q, cache_k.view(np.uint16), cache_v.view(np.uint16), start,
                                               np.float32(scale), int(window), out, scores)
            return
        kernel = attention_decode.attention if parallel else attention_decode.attention_serial
        heads_per_job = self._heads_per_job(n_tokens, n_head, cache_k.shape[1], parallel)
        kernel(q, cache_k.view(np.uint16), cache_v.view(np.uint16), start, np.float32(scale), int(window), out, scores,
               heads_per_job)

    def _heads_per_job(self, n_rows: int, n_head: int, n_head_kv: int, parallel: bool) -> int:
        """4 (the query heads of a key head attend together, each cached row read once for four) unless
        that leaves fewer jobs than threads: Gemma 3 270M has one key head for its four query heads, and
        its four heads on two threads beat four together on one. Results are the same either way."""
        # py_func: the same arithmetic without a Numba dispatch from Python (a few us, per layer and step)
        if not parallel or attention_decode.attention_jobs.py_func(n_rows, n_head, n_head_kv, 4) >= _numba_threads_now():
            return 4
        return 1

    def kv_store_paged(self, cache_k, cache_v, k, v, slots) -> None:
        flat_k = cache_k.reshape(-1, *cache_k.shape[2:])  # views: [NB*BS, Hkv, D]
        flat_v = cache_v.reshape(-1, *cache_v.shape[2:])
        kernels.store_f16_rows(k, flat_k.view(np.uint16), slots)  # rounded to float16 as kv_store rounds
        kernels.store_f16_rows(v, flat_v.view(np.uint16), slots)

    def attention_paged(self, q, cache_k, cache_v, layout, scale, window, out) -> None:
        """A sequence with BLAS_MIN_ROWS rows or more in this step (a prefill chunk) goes through BLAS
        on a contiguous copy of its keys, as `attention` sends such a batch; all other rows (decode rows,
        short chunks) through one Numba kernel call."""
        if self._paged_rows.size < q.shape[0]:
            self._paged_rows = np.empty(2 * q.shape[0], dtype=np.int32)
        kernel_rows = self._paged_rows  # int32[R]: the rows the Numba kernel computes
        n_kernel = 0
        for s in range(layout.seq_rows.shape[0]):
            first, n = int(layout.seq_first[s]), int(layout.seq_rows[s])
            if n >= BLAS_MIN_ROWS:
                self._paged_blas(q, cache_k, cache_v, layout, s, scale, window, out)
                continue
            for row in range(first, first + n):
                kernel_rows[n_kernel] = row
                n_kernel += 1
        if n_kernel == 0:
            return
        self._threads_for(1)
        n_head = q.shape[1]
        n_keys = int(layout.positions[: q.shape[0]].max()) + 1
        needed = n_kernel * n_head * n_keys
        if self._scores.size < needed:
            self._scores = np.empty(needed, dtype=np.float32)
        scores = self._scores[:needed].reshape(n_kernel * n_head, n_keys)
        attention_decode.attention_paged(
            q, cache_k.view(np.uint16), cache_v.view(np.uint16), layout.tables, layout.row_seq,
            layout.positions, kernel_rows[:n_kernel], np.float32(scale), int(window), out, scores,
            self._heads_per_job(n_kernel, n_head, cache_k.shape[2], True),
        )

    def _paged_blas(self, q, cache_k, cache_v, layout, s, scale, window, out) -> None:
        first, n, start = int(layout.seq_first[s]), int(layout.seq_rows[s]), int(layout.seq_start[s])
        n_blocks = -(-(start + n) // cache_k.shape[1])
        table = layout.tables[s, :n_blocks]
        keys = cache_k[table].reshape(-1, *cache_k.shape[2:])  # contiguous float16 copies [n_blocks*BS, Hkv, D]
        values = cache_v[table].reshape(-1, *cache_v.shape[2:])
        self._blas_attention(q[first : first + n], keys, values, start, scale, window, out[first : first + n])

    def gated_act(self, gate, up, out, kind) -> None:
        if kind not in ("silu", "gelu_tanh"):
            raise LocalLLMError(f"unknown activation {kind!r}")
        kernel = kernels.gated_act if self._parallel(gate.shape[0], gate.size) else kernels.gated_act_serial
        if self._gelu_table is None:
            self._gelu_table = kernels.gelu_table()
        kernel(gate, up, out, kind == "gelu_tanh", self._gelu_table)

    def add(self, a, b, out) -> None:
        np.add(a, b, out=out)

    def scale(self, x, factor, out) -> None:
        np.multiply(x, np.float32(factor), out=out)
