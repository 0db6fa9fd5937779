"""The Numba CPU backend's ops: the default backend. Weights stay quantized as in the file: copied at
load into huge-page memory when the model fits well within the memory, else read in the file's mapping
(weight_memory.py), except matrices re-laid at their first product (16 rows at a time, or in AMX tiles),
their file pages then released (matmul.PackedWeights and TiledWeights, kept per weight by
layouts.WeightLayouts). How many threads each op runs on is
threads.ThreadPolicy's decision; the kernels are in matmul, kernels, attention_decode and attention_blas."""

from __future__ import annotations

import logging

import numba

import numpy as np

from ... import host, quant
from ...errors import LocalLLMError
from ...gguf.reader import release_pages
from ...jit import configure_numba
from ...runtime import Runtime
from ..base import Backend, Weight
from . import attention_decode, kernels, recurrent
from .attention_blas import BlasAttention
from .drivers import KERNEL_FOLDER
from .layouts import WeightLayouts
from .matmul import (
    BLAS_MIN_ROWS,
    INTEGER_ALWAYS,
    ExpertPack,
    MatmulScratch,
    blas_min_rows,
    gather_rows_kernel,
    matmul,
    matmul_rows,
    matmul_segments,
    relaid_layout,
)
from .threads import SMALL_ATTENTION_WORK, SMALL_MATVEC_BYTES, ThreadPolicy, configure_openmp_waiting
from .tiers import BackgroundCompile, fits_basic_tier, prepared
from .weight_memory import HugePageArena, copies_weights, copy_to_arena

# The package's name, as before the package was split: what users and tests filter on.
log = logging.getLogger("localllm.backends.cpu")

PARALLEL_STORE_ROWS = 16  # from this many rows kv_store converts to float16 in a kernel (a prefill's)


class _FailedCompile:
    """Stands for a background compile that failed and was reported: never finished again."""

    finished = ready = False

    def wait(self, timeout=None) -> bool:
        return False


class CPUBackend(Backend):
    name = "cpu"

    # The ops read the weights where they lie in the file's mapping, or upload copies them from it
    # (weight_memory.py): either way the file is worth reading ahead.
    reads_mapped_weights = True

    def __init__(self, threads: int | None = None, repack: bool | None = None, runtime: Runtime | None = None):
        """runtime: the settings (default: resolved from the environment now); threads and repack, when
        given, in place of its own."""
        runtime = (runtime or Runtime.resolve()).with_arguments(threads=threads, repack=repack)
        self.runtime = runtime
        self.threads = runtime.threads or host.physical_cores()
        # Re-lay Q4_K and Q4_0 matrices 16 rows at a time at their first product (matmul.PackedWeights),
        # and float ones as 16-row panels (BF16: AMX tiles where the CPU has them; TiledWeights), as
        # llama.cpp repacks;
        # LOCALLLM_REPACK=0 keeps every weight in the file's layout.
        self.repack = runtime.repack
        if self.threads < 1:
            raise LocalLLMError(f"threads must be >= 1, got {self.threads}")
        # Process-wide settings, each idempotent, before the first kernel and before Numba's pool starts
        # (ThreadPolicy sets Numba's thread count, which starts it).
        configure_openmp_waiting(runtime.openmp_spincount)  # bounded spinning for idle OpenMP workers
        configure_numba()  # before any kernel compiles (idempotent): the SLP vectorizer, the kernel cache
        KERNEL_FOLDER.use(runtime.kernel_dir)  # the generated drivers beside this runtime's tier markers
        self.thread_policy = ThreadPolicy(self.threads, BLAS_MIN_ROWS)
        self.scratch = MatmulScratch()
        self.layouts = WeightLayouts(self.repack, self.scratch)
        self._inv_freq: dict[tuple, tuple] = {}  # RoPE setting -> (its freq_factors, inv_freq float32[n_rot/2])
        self._rope_cache: dict[tuple, tuple] = {}  # RoPE setting -> (positions bytes, cos, sin) of the last step
        self._scores = np.empty(0, dtype=np.float32)
        self._blas_attention = BlasAttention()
        self._gelu_table = None
        self._zero_vectors: dict[int, np.ndarray] = {}  # D -> float32[D] of zeros: layer_norm without a bias
        self._paged_rows = np.empty(0, dtype=np.int32)
        self._expert_packs: dict[int, tuple] = {}  # id(expert tensor) -> (it, its ExpertPack or None)
        self._no_sinks: dict[int, np.ndarray] = {}  # Hq -> float32[Hq] of -inf: attention without sinks
        self.background: BackgroundCompile | None = None
        self.arena: HugePageArena | None = None  # where upload copies matrices to; None: left mapped

    # While a BackgroundCompile is running, the basic tier (tiers.py): no re-laid matrices, products of
    # several rows row by row, serial small ops, our kernels on one thread (the compile has the other
    # cores). The thread policy holds the flag (its `serial` rule); the ops read it here.
    @property
    def basic_tier(self) -> bool:
        return self.thread_policy.serial

    @basic_tier.setter
    def basic_tier(self, value: bool) -> None:
        self.thread_policy.serial = value

    def prepare_kernels(self, model_path) -> None:
        """Called once the model is bound: on a cold start (no marker for this model, LOCALLLM_COMPILE
        not "foreground") of a model small enough that its prompts go fast row by row, start the
        background compile and run in the basic tier until it is done."""
        runtime = self.runtime
        if runtime.compile_mode == "foreground" or prepared(model_path, self.repack, runtime) or not fits_basic_tier(model_path):
            return
        background = BackgroundCompile(model_path, self.repack, runtime)
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
        self.layouts.forget_plans()  # planned on the file's layout; the full tier re-lays matrices
        self.thread_policy.restart_measurements()  # what it measured was one-thread steps

    def begin_step(self, rows: int) -> None:
        if self.basic_tier and self.background.finished:
            if self.background.ready:
                self._leave_basic_tier()
            else:  # stay in the basic tier: slower, but no compile in the middle of a reply
                log.warning("warning: compiling the faster kernels in the background failed (%s); this "
                            "session keeps the basic ones", self.background.marker.with_suffix(".log"))
                self.background = _FailedCompile()
        self.thread_policy.begin_step(rows)
        self._blas_attention.workers = self.thread_policy.attention_workers()
        self._blas_attention.numpy_only = self.basic_tier  # its parallel kernel is the background compile's

    def end_step(self) -> None:
        self.thread_policy.end_step()

    def supports(self, qtype: str) -> bool:
        return quant.is_supported(qtype)

    def plan_memory(self, reader, memory, hp, ctx_given: bool) -> None:
        """Decide where the matrices are read from (weight_memory.copies_weights, on the runtime's
        `weights` setting). Either way the file is read ahead before upload (api.load)."""
        if copies_weights(self.runtime.weights, memory.weights_bytes, memory.kv_bytes):
            self.arena = self.layouts.arena = HugePageArena(self.threads)

    def upload(self, weight: Weight) -> Weight:
        if len(weight.shape) >= 2 and quant.is_supported(weight.qtype):
            qt = quant.get(weight.qtype)
            self.thread_policy.matmuls_use_blas |= blas_min_rows(qt) < INTEGER_ALWAYS
            relaid_later = self.repack and relaid_layout(qt, weight.data) is not None  # its copy is the re-laid one
            if self.arena is not None and not relaid_later and not weight.gathered:  # a table read by rows stays mapped
                return Weight(weight.name, weight.qtype, weight.shape, copy_to_arena(self.arena, weight.data))
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
            self.thread_policy.for_op(rows, rows * w.data.nbytes, SMALL_MATVEC_BYTES, blas=rows >= blas_min_rows(qt))
            matmul(qt, self._layout_of(w), x, out, self.scratch)
        if bias is not None:
            out += bias

    def _matvec(self, w: Weight, x, out) -> None:
        """out[0] = W @ x[0], as matmul computes one row (matmul._integer_rows), through w's one-row plan
        (layouts.WeightLayouts.plan_matvec: what it looks up per call, made once)."""
        plan = self.layouts.plans.get(id(w))
        if plan is None:
            plan = self.layouts.plan_matvec(w, x.shape[1], self.basic_tier)
        _, kernel, activation, small, packed = plan
        wanted = self.thread_policy.for_matvec(small)
        if packed is not None:
            packed.matmul(x, out, self.scratch, wanted)
            return
        kernel(w.data, out[0], *activation.quantize(x[0]))

    def _layout_of(self, w: Weight):
        """What the matrix products read for w (layouts.WeightLayouts.layout_of)."""
        return self.layouts.layout_of(w, self.basic_tier)

    def matmul_segments(self, w: Weight, x, out, bounds, bias=None) -> None:
        qt = quant.get(w.qtype)
        longest = int(max(b - a for a, b in zip(bounds[:-1], bounds[1:])))
        self.thread_policy.for_op(x.shape[0], blas=longest >= blas_min_rows(qt))
        matmul_segments(qt, self._layout_of(w), x, out, bounds, self.scratch)
        if bias is not None:
            out += bias

    def matmul_rows(self, w: Weight, x, out, bias=None) -> None:
        qt = quant.get(w.qtype)
        self.thread_policy.for_op(1)  # the decode path's thread count, whatever the number of rows
        matmul_rows(qt, self._layout_of(w), x, out, self.scratch)
        if bias is not None:
            out += bias

    def matmul_experts(self, w: Weight, x, groups, bounds, out, bias=None) -> None:
        """One call of the type's grouped kernel for all the groups where it has one (ExpertPack), else
        the groups one by one (Backend.matmul_experts); the basic tier (tiers.py) re-lays nothing."""
        pack = None if self.basic_tier or not self.repack else self._expert_pack(w)
        if pack is None:
            super().matmul_experts(w, x, groups, bounds, out, bias)
            return
        self.thread_policy.for_op(1)  # the decode path's thread count, whatever the number of rows
        pack.matmul(x, groups, bounds, out, self.scratch, numba.get_num_threads())
        if bias is not None:
            for g, e in enumerate(groups):
                out[bounds[g] : bounds[g + 1]] += bias[e]

    def _expert_pack(self, w: Weight):
        entry = self._expert_packs.get(id(w))
        if entry is None or entry[0] is not w:
            qt, n_expert = quant.get(w.qtype), w.shape[2]
            pack = ExpertPack(qt, w.data, n_expert) if ExpertPack.suits(qt, w.data, n_expert) else None
            entry = self._expert_packs[id(w)] = (w, pack)
        return entry[1]

    def combine_experts(self, src, slots, weights, out) -> None:
        parallel = self.thread_policy.parallel(out.shape[0], out.size * slots.shape[1])
        kernel = kernels.combine_experts if parallel else kernels.combine_experts_serial
        kernel(src, slots, weights, out)

    def embed(self, w: Weight, ids, out) -> None:
        gather_rows_kernel(quant.get(w.qtype))(w.data, ids, out)
        if w.gathered:  # a table left mapped: drop the pages just read, and the ~16 the kernel maps around
            release_pages(w.data)  # each (fault-around), so that they do not add up in the process's memory

    def rms_norm(self, x, weight, eps, out) -> None:
        d = weight.shape[0]
        kernel = kernels.rms_norm if self.thread_policy.parallel(x.shape[0], x.size) else kernels.rms_norm_serial
        kernel(x.reshape(-1, d), weight, np.float32(eps), out.reshape(-1, d))

    def layer_norm(self, x, weight, bias, eps, out) -> None:
        d = weight.shape[0]
        bias = self._no_bias(d) if bias is None else bias
        kernels.layer_norm(x.reshape(-1, d), weight, bias, np.float32(eps), out.reshape(-1, d))

    def _no_bias(self, d: int) -> np.ndarray:
        none = self._zero_vectors.get(d)
        if none is None:
            none = self._zero_vectors[d] = np.zeros(d, dtype=np.float32)
        return none

    def rope(self, x, positions, n_rot, base, neox, freq_factors=None, freq_scale=1.0, mscale=1.0) -> None:
        key = (n_rot, float(base), float(freq_scale), id(freq_factors))
        cached = self._inv_freq.get(key)
        if cached is None:
            inv_freq = np.empty(n_rot // 2, dtype=np.float32)
            factors = np.asarray(freq_factors, dtype=np.float32) if freq_factors is not None else np.empty(0, np.float32)
            kernels.rope_inv_freqs(n_rot, float(base), float(freq_scale), factors, inv_freq)
            # the entry holds freq_factors, so its id cannot be reused by another array while it lives
            cached = self._inv_freq[key] = (freq_factors, inv_freq)
        inv_freq = cached[1]
        cos, sin = self._rope_angles(key + (float(mscale),), inv_freq, positions, mscale)
        kernel = kernels.rope if self.thread_policy.parallel(x.shape[0], x.size) else kernels.rope_serial
        kernel(x, cos, sin, bool(neox))

    def _rope_angles(self, key, inv_freq, positions, mscale):
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
        if mscale != 1.0:
            cos *= np.float32(mscale)
            sin *= np.float32(mscale)
        self._rope_cache[key] = (tag, cos, sin)
        return cos, sin

    def kv_store(self, cache_k, cache_v, k, v, start) -> None:
        n = k.shape[0]
        if n < PARALLEL_STORE_ROWS:
            cache_k[start : start + n] = k  # numpy rounds float32 -> float16 to nearest even, in place
            cache_v[start : start + n] = v
            return
        self.thread_policy.for_op(n)
        for src, cache in ((k, cache_k), (v, cache_v)):
            kernels.store_f16_block(src.reshape(n, *cache.shape[1:]), cache.view(np.uint16), start)

    def _sinks(self, sinks, n_head: int) -> np.ndarray:
        """float32[Hq] of the heads' attention sinks: the given ones, or -inf for none (made once per Hq)."""
        if sinks is not None:
            return sinks
        none = self._no_sinks.get(n_head)
        if none is None:
            none = self._no_sinks[n_head] = np.full(n_head, -np.inf, dtype=np.float32)
        return none

    def attention(self, q, cache_k, cache_v, start, scale, window, out, softcap=0.0, sinks=None) -> None:
        n_tokens, n_head, _ = q.shape
        sinks = self._sinks(sinks, n_head)
        if n_tokens >= BLAS_MIN_ROWS:  # prefill: matrix products through BLAS
            self._blas_attention(q, cache_k, cache_v, start, scale, window, out, softcap, sinks)
            return
        needed = n_tokens * n_head * (start + n_tokens)
        # work: scores times head_dim (Gemma 3 270M: one thread up to 256 cached positions)
        parallel = self.thread_policy.parallel(n_tokens, needed * q.shape[2], SMALL_ATTENTION_WORK)
        if self._scores.size < needed:
            self._scores = np.empty(needed, dtype=np.float32)
        scores = self._scores[:needed].reshape(n_tokens * n_head, start + n_tokens)
        if self.basic_tier:
            attention_decode.attention_by_head(q, cache_k.view(np.uint16), cache_v.view(np.uint16), start,
                                               np.float32(scale), np.float32(softcap), sinks, int(window), out, scores)
            return
        kernel = attention_decode.attention if parallel else attention_decode.attention_serial
        heads_per_job = self._heads_per_job(n_tokens, n_head, cache_k.shape[1], parallel)
        kernel(q, cache_k.view(np.uint16), cache_v.view(np.uint16), start, np.float32(scale), np.float32(softcap), sinks,
               int(window), out, scores, heads_per_job)

    def attention_bidirectional(self, q, cache_k, cache_v, start, scale, out, sinks=None) -> None:
        """Every row through the BLAS prefill path with the causal mask off (any number of rows)."""
        self._blas_attention(q, cache_k, cache_v, start, scale, 0, out, 0.0, self._sinks(sinks, q.shape[1]), causal=False)

    def _heads_per_job(self, n_rows: int, n_head: int, n_head_kv: int, parallel: bool) -> int:
        """4 (the query heads of a key head attend together, each cached row read once for four) unless
        that leaves fewer jobs than threads: Gemma 3 270M has one key head for its four query heads, and
        its four heads on two threads beat four together on one. Results are the same either way."""
        # py_func: the same arithmetic without a Numba dispatch from Python (a few us, per layer and step)
        if not parallel or attention_decode.attention_jobs.py_func(n_rows, n_head, n_head_kv, 4) >= self.thread_policy.numba_now():
            return 4
        return 1

    def kv_store_paged(self, cache_k, cache_v, k, v, slots) -> None:
        flat_k = cache_k.reshape(-1, *cache_k.shape[2:])  # views: [NB*BS, Hkv, D]
        flat_v = cache_v.reshape(-1, *cache_v.shape[2:])
        kernels.store_f16_rows(k, flat_k.view(np.uint16), slots)  # rounded to float16 as kv_store rounds
        kernels.store_f16_rows(v, flat_v.view(np.uint16), slots)

    def attention_paged(self, q, cache_k, cache_v, layout, scale, window, out, softcap=0.0, sinks=None) -> None:
        """A sequence with BLAS_MIN_ROWS rows or more in this step (a prefill chunk) goes through BLAS
        on a contiguous copy of its keys, as `attention` sends such a batch; all other rows (decode rows,
        short chunks) through one Numba kernel call."""
        sinks = self._sinks(sinks, q.shape[1])
        if self._paged_rows.size < q.shape[0]:
            self._paged_rows = np.empty(2 * q.shape[0], dtype=np.int32)
        kernel_rows = self._paged_rows  # int32[R]: the rows the Numba kernel computes
        n_kernel = 0
        for s in range(layout.seq_rows.shape[0]):
            first, n = int(layout.seq_first[s]), int(layout.seq_rows[s])
            if n >= BLAS_MIN_ROWS:
                self._paged_blas(q, cache_k, cache_v, layout, s, scale, window, out, softcap, sinks)
                continue
            for row in range(first, first + n):
                kernel_rows[n_kernel] = row
                n_kernel += 1
        if n_kernel == 0:
            return
        self.thread_policy.for_op(1)
        n_head = q.shape[1]
        n_keys = int(layout.positions[: q.shape[0]].max()) + 1
        needed = n_kernel * n_head * n_keys
        if self._scores.size < needed:
            self._scores = np.empty(needed, dtype=np.float32)
        scores = self._scores[:needed].reshape(n_kernel * n_head, n_keys)
        attention_decode.attention_paged(
            q, cache_k.view(np.uint16), cache_v.view(np.uint16), layout.tables, layout.row_seq,
            layout.positions, kernel_rows[:n_kernel], np.float32(scale), np.float32(softcap), sinks, int(window), out, scores,
            self._heads_per_job(n_kernel, n_head, cache_k.shape[2], True),
        )

    def _paged_blas(self, q, cache_k, cache_v, layout, s, scale, window, out, softcap, sinks) -> None:
        first, n, start = int(layout.seq_first[s]), int(layout.seq_rows[s]), int(layout.seq_start[s])
        n_blocks = -(-(start + n) // cache_k.shape[1])
        table = layout.tables[s, :n_blocks]
        keys = cache_k[table].reshape(-1, *cache_k.shape[2:])  # contiguous float16 copies [n_blocks*BS, Hkv, D]
        values = cache_v[table].reshape(-1, *cache_v.shape[2:])
        self._blas_attention(q[first : first + n], keys, values, start, scale, window, out[first : first + n], softcap, sinks)

    def gated_act(self, gate, up, out, kind) -> None:
        if kind not in ("silu", "gelu_tanh", "swiglu_oai", "sigmoid"):
            raise LocalLLMError(f"unknown activation {kind!r}")
        parallel = self.thread_policy.parallel(gate.shape[0], gate.size)
        if kind == "swiglu_oai":
            (kernels.swiglu_oai if parallel else kernels.swiglu_oai_serial)(gate, up, out)
            return
        if kind == "sigmoid":
            (kernels.sigmoid_gate if parallel else kernels.sigmoid_gate_serial)(gate, up, out)
            return
        kernel = kernels.gated_act if parallel else kernels.gated_act_serial
        if self._gelu_table is None:
            self._gelu_table = kernels.gelu_table()
        kernel(gate, up, out, kind == "gelu_tanh", self._gelu_table)

    def short_conv(self, x, weight, window, out, silu) -> None:
        recurrent.short_conv(x, weight, window, out, bool(silu))
        recurrent.short_conv_window(x, window)

    def delta_net(self, q, k, v, g, beta, state, out, grouped=False, stepwise=False) -> None:
        g = np.ascontiguousarray(g, dtype=np.float32)
        beta = np.ascontiguousarray(beta, dtype=np.float32)
        scale = np.float32(1.0 / np.sqrt(q.shape[2]))
        group = state.shape[0] // q.shape[1] if grouped else 0
        stepwise = stepwise or q.shape[0] == 1
        kernel = recurrent.delta_net_steps if stepwise else recurrent.delta_net_chunks  # a prompt: chunks
        kernel(q, k, v, g, beta, state, out, scale, group)

    def add(self, a, b, out) -> None:
        np.add(a, b, out=out)

    def scale(self, x, factor, out) -> None:
        np.multiply(x, np.float32(factor), out=out)

    def softcap(self, x, cap, out) -> None:
        np.multiply(x, np.float32(1.0) / np.float32(cap), out=out)  # llama.cpp's order: scale, tanh, scale
        np.tanh(out, out=out)
        out *= np.float32(cap)
