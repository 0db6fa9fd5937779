"""The CUDA backend (numba.cuda): weights uploaded once, activations and the KV cache on the device,
only the logits copied back per step.

Quantized weights stay in their ggml blocks on the device and are decoded inside the kernels
(blocks.py); a type without a device kernel is dequantized to float16 once, at upload, with a log line.
Host-side vectors the architecture code passes (norm weights, biases, RoPE frequency factors, positions,
token ids) are copied to the device on first use and cached. Under numba's CUDA simulator
(NUMBA_ENABLE_CUDASIM=1) the same kernels run on the tiny launch geometry of launch.SIMULATOR.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import numpy as np

from ...errors import LocalLLMError
from ..base import Backend, Weight
from .launch import MAX_HEAD_DIM, MAX_VEC_T, SIMULATOR, Launch, blocks_for

log = logging.getLogger("localllm.cuda")

INSTALL_HINT = "pip install 'localllm[cuda]'"
# Attention scores scratch above which a prefill's query rows are processed in chunks (float32 elements).
SCORES_ELEMENTS = 16 * 1024 * 1024


def simulating() -> bool:
    """Whether numba.cuda is (or will be) numba's CUDA simulator."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _import_cuda():
    """numba.cuda, or a LocalLLMError saying what to install. The simulator also runs on the numba.cuda
    that ships inside numba; a real device needs NVIDIA's numba-cuda package (the `cuda` extra)."""
    if not simulating() and importlib.util.find_spec("numba_cuda") is None:
        raise LocalLLMError(f"the cuda backend needs the numba-cuda package: {INSTALL_HINT}")
    try:
        from numba import cuda
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise LocalLLMError(f"numba.cuda cannot be imported ({exc}): {INSTALL_HINT}") from None
    return cuda


def device_available() -> bool:
    """A real CUDA device usable through numba-cuda (never the simulator): what backend 'auto' asks."""
    if simulating() or importlib.util.find_spec("numba_cuda") is None:
        return False
    try:
        from numba import cuda

        return bool(cuda.is_available()) and len(cuda.gpus) > 0
    except Exception:  # a broken driver or toolkit means: no usable device
        return False


class CUDABackend(Backend):
    name = "cuda"
    host_buffers = False

    def __init__(self, threads: int | None = None, launch: Launch | None = None):
        cuda = _import_cuda()
        if not cuda.is_available():
            raise LocalLLMError(f"no CUDA device is available (numba.cuda.is_available() is False); use --backend cpu")
        self.cuda = cuda
        self.threads = threads or 1  # host threads play no part; kept for the bench report
        self.launch = (launch or (SIMULATOR if simulating() else Launch())).check()
        from . import kernels
        from .matmul import kernels_for

        self._k = kernels
        self._kernels_for = kernels_for
        self._vectors: dict[int, tuple[np.ndarray, object]] = {}  # id(host array) -> (array, device copy)
        self._zero_vectors: dict[int, np.ndarray] = {}  # D -> float32[D] of zeros: layer_norm without a bias
        self._deltas = None  # delta_net_chunks' scratch [Hv, DELTA_CHUNK, S], kept between calls
        self._no_sinks: dict[int, np.ndarray] = {}  # Hq -> float32[Hq] of -inf: attention without sinks
        self._inv_freq: dict[tuple, object] = {}
        self._positions = (np.empty(0, np.int32), None)  # last uploaded positions (host copy, device array)
        self._zero_table = cuda.to_device(np.zeros(1, dtype=np.int32))
        self._no_bias = cuda.to_device(np.zeros(1, dtype=np.float32))
        self._slab = cuda.device_array(0, dtype=np.float32)
        self._scores = cuda.device_array(0, dtype=np.float32)
        self.uploaded_bytes = 0

    # -- memory ---------------------------------------------------------------------------------------------
    def device_name(self) -> str:
        if simulating():
            return "the CUDA simulator"
        if not hasattr(self.cuda, "get_current_device"):
            return "the GPU"
        name = self.cuda.get_current_device().name  # bytes in numba's numba.cuda, str in numba-cuda 0.30
        return name.decode() if isinstance(name, bytes) else str(name)

    def memory_info(self) -> tuple[int, int]:
        """(free, total) device bytes; under the simulator (which reports infinity) the host's."""
        if simulating():
            from ...host import available_memory

            return available_memory(), available_memory()
        free, total = self.cuda.current_context().get_memory_info()
        return int(free), int(total)

    def plan_memory(self, reader, memory, hp, ctx_given: bool) -> None:
        """Raise DeviceOutOfMemory unless weights (as uploaded), KV cache and buffers fit the free device
        memory; a context the user did not choose is first lowered to what fits (not below 256)."""
        from .memory import RESERVE_BYTES, check_fits, plan

        free, total = self.memory_info()
        device_plan = plan(reader, memory.kv_bytes, memory.n_ctx, hp)
        per_token = memory.kv_bytes // max(memory.n_ctx, 1)
        if not ctx_given and device_plan.total_bytes + RESERVE_BYTES > free and per_token:
            room = free - RESERVE_BYTES - device_plan.weights_bytes - device_plan.scratch_bytes
            memory.n_ctx = max(256, min(memory.n_ctx, room // per_token))
            memory.kv_bytes = per_token * memory.n_ctx
            device_plan = plan(reader, memory.kv_bytes, memory.n_ctx, hp)
        memory.device_bytes = device_plan.total_bytes
        check_fits(device_plan, free, total, self.device_name())

    def supports(self, qtype: str) -> bool:
        from ... import quant

        return quant.is_supported(qtype)  # types without a device kernel are converted at upload

    def upload(self, weight: Weight) -> Weight:
        from .blocks import UNIT_DECODERS

        raw = np.asarray(weight.data)  # uint8[N, row_bytes], the file's bytes
        n_out, n_in = weight.n_out, weight.n_in
        qtype = weight.qtype
        if qtype not in UNIT_DECODERS:
            from ... import quant

            log.warning("%s: no CUDA kernel for %s; dequantized to F16 at upload", weight.name, qtype)
            values = quant.get(qtype).dequantize(raw).reshape(n_out, n_in)
            raw, qtype = values.astype(np.float16).view(np.uint8), "F16"
        kind = UNIT_DECODERS[qtype][1]
        host = raw.view(np.float32) if kind == "f32" else raw.view(np.uint16) if kind == "u16" else raw
        device = self.cuda.to_device(np.ascontiguousarray(host).reshape(n_out, -1))
        self.uploaded_bytes += device.nbytes
        return Weight(weight.name, qtype, weight.shape, device)

    def alloc(self, shape, dtype=np.float32):
        buffer = self.cuda.device_array(shape, dtype=dtype)
        flat = buffer.reshape(-1).view(np.uint8) if buffer.size else None
        if flat is not None:
            threads = self.launch.threads
            self._k.fill_zero[blocks_for(flat.shape[0], threads, self.launch.max_blocks), threads](flat)
        return buffer

    def to_host(self, buffer) -> np.ndarray:
        return buffer if isinstance(buffer, np.ndarray) else buffer.copy_to_host()

    def _device(self, array):
        """A device copy of a host float32 vector or small matrix (norm weights, biases, a convolution's
        weights), made once; device arrays pass."""
        if not isinstance(array, np.ndarray):
            return array
        entry = self._vectors.get(id(array))
        if entry is None or entry[0] is not array:
            entry = self._vectors[id(array)] = (array, self.cuda.to_device(np.ascontiguousarray(array, dtype=np.float32)))
        return entry[1]

    def _ints(self, values) -> object:
        """int32 indices (token ids, slots, positions) copied to the device for one call."""
        return self.cuda.to_device(np.ascontiguousarray(values, dtype=np.int32))

    def _grid(self, n: int) -> tuple[int, int]:
        return blocks_for(n, self.launch.threads, self.launch.max_blocks), self.launch.threads

    # -- matmul -----------------------------------------------------------------------------------------------
    def matmul(self, w: Weight, x, out, bias=None) -> None:
        if x.shape[0] >= self.launch.gemm_min_rows:
            self._gemm(w, x, out, bias)
        else:
            self.matmul_rows(w, x, out, bias)

    def matmul_rows(self, w: Weight, x, out, bias=None) -> None:
        """Each row exactly as T=1 computes it: matvec sums every activation row in the same order."""
        matvec = self._kernels_for(w.qtype)[0]
        k, n_out = w.n_in, w.n_out
        b = self._device(bias) if bias is not None else self._no_bias
        lanes, rows = self.launch.lanes, self.launch.rows_per_block
        grid = -(-n_out // rows)
        for t0 in range(0, x.shape[0], MAX_VEC_T):
            t1 = min(x.shape[0], t0 + MAX_VEC_T)
            matvec[grid, (lanes, rows)](w.data, k, -(-k // 32), x[t0:t1], out[t0:t1], b, bias is not None)

    def _gemm(self, w: Weight, x, out, bias) -> None:
        """Dequantize slabs of weight rows into float32 scratch, multiply each with a tiled GEMM."""
        dequant = self._kernels_for(w.qtype)[1]
        from .matmul import SLAB_ELEMENTS, gemm_xwt

        k, n_out, tile = w.n_in, w.n_out, self.launch.tile
        n_units = -(-k // 32)
        slab_rows = max(tile, min(n_out, SLAB_ELEMENTS // k // tile * tile))
        if self._slab.size < slab_rows * k:
            self._slab = self.cuda.device_array(slab_rows * k, dtype=np.float32)
        b = self._device(bias) if bias is not None else self._no_bias
        for r0 in range(0, n_out, slab_rows):
            n_rows = min(slab_rows, n_out - r0)
            slab = self._slab[: n_rows * k].reshape(n_rows, k)
            dequant[self._grid(n_rows * n_units)](w.data, k, n_units, r0, slab)
            grid = (-(-n_rows // tile), -(-x.shape[0] // tile))
            gemm_xwt[grid, (tile, tile)](x, slab, out, r0, b, bias is not None)

    def embed(self, w: Weight, ids, out) -> None:
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= w.n_out):
            raise LocalLLMError(f"token id out of range 0..{w.n_out - 1}")
        gather = self._kernels_for(w.qtype)[2]
        n_units = -(-w.n_in // 32)
        gather[self._grid(ids.shape[0] * n_units)](w.data, w.n_in, n_units, self._ints(ids), out)

    # -- row and elementwise ops ---------------------------------------------------------------------------------
    def take_rows(self, x, rows, out) -> None:
        self._k.take_rows[self._grid(len(rows) * x.shape[1])](x, self._ints(rows), out)

    def combine_experts(self, src, slots, weights, out) -> None:
        slots_device = self._ints(slots)
        weights_device = self.cuda.to_device(np.ascontiguousarray(weights, dtype=np.float32))
        self._k.combine_experts[self._grid(out.shape[0] * out.shape[1])](src, slots_device, weights_device, out)

    def rms_norm(self, x, weight, eps, out) -> None:
        d = weight.shape[0]
        rows = x.reshape(-1, d)
        self._k.rms_norm[rows.shape[0], self.launch.threads](rows, self._device(weight), np.float32(eps), out.reshape(-1, d))

    def layer_norm(self, x, weight, bias, eps, out) -> None:
        d = weight.shape[0]
        rows = x.reshape(-1, d)
        bias = self._zero_vector(d) if bias is None else bias
        self._k.layer_norm[rows.shape[0], self.launch.threads](rows, self._device(weight), self._device(bias),
                                                               np.float32(eps), out.reshape(-1, d))

    def _zero_vector(self, d: int) -> np.ndarray:
        """A host float32[D] of zeros, the same array each time (so _device uploads it once)."""
        zeros = self._zero_vectors.get(d)
        if zeros is None:
            zeros = self._zero_vectors[d] = np.zeros(d, dtype=np.float32)
        return zeros

    def _inv_freqs(self, n_rot, base, freq_factors, freq_scale):
        """float32[n_rot/2] = freq_scale * base^(-2i/n_rot) / freq_factors[i], in float64 as the CPU does."""
        key = (n_rot, float(base), float(freq_scale), id(freq_factors))
        cached = self._inv_freq.get(key)
        if cached is None or cached[0] is not freq_factors:
            i = np.arange(n_rot // 2, dtype=np.float64)
            values = float(freq_scale) * float(base) ** (-2.0 * i / n_rot)
            if freq_factors is not None:
                values = values / np.asarray(self.to_host(freq_factors), dtype=np.float32).astype(np.float64)
            cached = self._inv_freq[key] = (freq_factors, self.cuda.to_device(values.astype(np.float32)))
        return cached[1]

    def _device_positions(self, positions):
        """Positions change every step but are used by every layer's two RoPE calls: uploaded once per change."""
        host, device = self._positions
        if host.shape != positions.shape or not np.array_equal(host, positions):
            host = np.array(positions, dtype=np.int32)
            device = self.cuda.to_device(host)
            self._positions = (host, device)
        return device

    def rope(self, x, positions, n_rot, base, neox, freq_factors=None, freq_scale=1.0, mscale=1.0) -> None:
        if n_rot > x.shape[2]:
            raise LocalLLMError(f"n_rot {n_rot} exceeds the head dimension {x.shape[2]}")
        inv_freq = self._inv_freqs(n_rot, base, freq_factors, freq_scale)
        n = x.shape[0] * x.shape[1] * (n_rot // 2)
        self._k.rope[self._grid(n)](x, self._device_positions(np.asarray(positions)), inv_freq, bool(neox),
                                    np.float32(mscale))

    def kv_store(self, cache_k, cache_v, k, v, start) -> None:
        grid = self._grid(k.size)
        self._k.kv_store_range[grid](cache_k.view(np.uint16), k, int(start))
        self._k.kv_store_range[grid](cache_v.view(np.uint16), v, int(start))

    def _scores_buffer(self, rows: int, n_keys: int):
        if self._scores.size < rows * n_keys:
            self._scores = self.cuda.device_array(rows * n_keys, dtype=np.float32)
        return self._scores[: rows * n_keys].reshape(rows, n_keys)

    def _sinks(self, sinks, n_head: int):
        """The heads' attention sinks on the device: the given float32[Hq], or -inf each (made once)."""
        if sinks is None:
            sinks = self._no_sinks.get(n_head)
            if sinks is None:
                sinks = self._no_sinks[n_head] = np.full(n_head, -np.inf, dtype=np.float32)
        return self._device(sinks)

    def attention(self, q, cache_k, cache_v, start, scale, window, out, softcap=0.0, sinks=None) -> None:
        n_tokens, n_head, head_dim = q.shape
        sinks = self._sinks(sinks, n_head)
        if head_dim > MAX_HEAD_DIM:
            raise LocalLLMError(f"head dimension {head_dim} exceeds the CUDA kernels' {MAX_HEAD_DIM}")
        n_keys = start + n_tokens
        keys = cache_k.view(np.uint16).reshape(1, *cache_k.shape)
        values = cache_v.view(np.uint16).reshape(1, *cache_v.shape)
        chunk = max(1, min(n_tokens, SCORES_ELEMENTS // (n_head * n_keys)))  # query rows per launch
        for t0 in range(0, n_tokens, chunk):
            rows = min(chunk, n_tokens - t0)
            scores = self._scores_buffer(rows * n_head, n_keys)
            self._k.attention[rows * n_head, self.launch.threads](
                q, keys, values, self._zero_table, int(start), t0, np.float32(scale), np.float32(softcap), sinks, int(window),
                out, scores,
            )

    def kv_store_paged(self, cache_k, cache_v, k, v, slots) -> None:
        flat = (-1, *cache_k.shape[2:])  # [NB*BS, Hkv, D]
        slots = self._ints(np.asarray(slots)[: k.shape[0]])
        grid = self._grid(k.size)
        self._k.kv_store[grid](cache_k.view(np.uint16).reshape(*flat), k, slots)
        self._k.kv_store[grid](cache_v.view(np.uint16).reshape(*flat), v, slots)

    def attention_paged(self, q, cache_k, cache_v, layout, scale, window, out, softcap=0.0, sinks=None) -> None:
        n_tokens, n_head, _ = q.shape
        sinks = self._sinks(sinks, n_head)
        positions = np.asarray(layout.positions[:n_tokens])
        scores = self._scores_buffer(n_tokens * n_head, int(positions.max()) + 1)
        self._k.attention_paged[n_tokens * n_head, self.launch.threads](
            q, cache_k.view(np.uint16), cache_v.view(np.uint16), self._ints(layout.tables),
            self._ints(np.asarray(layout.row_seq)[:n_tokens]), self._ints(positions),
            np.float32(scale), np.float32(softcap), sinks, int(window), out, scores,
        )

    def gated_act(self, gate, up, out, kind) -> None:
        if kind not in ("silu", "gelu_tanh", "swiglu_oai", "sigmoid"):
            raise LocalLLMError(f"unknown activation {kind!r}")
        if kind == "swiglu_oai":
            self._k.swiglu_oai[self._grid(gate.size)](gate, up, out, np.float32(1.702), np.float32(7.0))
            return
        if kind == "sigmoid":
            self._k.sigmoid_gate[self._grid(gate.size)](gate, up, out)
            return
        self._k.gated_act[self._grid(gate.size)](gate, up, out, kind == "gelu_tanh")

    def short_conv(self, x, weight, window, out, silu) -> None:
        self._k.short_conv[self._grid(x.shape[1])](x, self._device(weight), window, out, bool(silu))

    def delta_net(self, q, k, v, g, beta, state, out, grouped=False, stepwise=False) -> None:
        """Decode (and `stepwise` rows): a thread per state row, token by token. A prompt: in chunks
        (kernels.delta_net_chunks, a block per head), the same rule in another order."""
        g_device = self.cuda.to_device(np.ascontiguousarray(g, dtype=np.float32))
        beta_device = self.cuda.to_device(np.ascontiguousarray(beta, dtype=np.float32))
        scale = np.float32(1.0 / np.sqrt(q.shape[2]))
        group = state.shape[0] // q.shape[1] if grouped else 0
        if stepwise or q.shape[0] == 1:
            self._k.delta_net[self._grid(state.shape[0] * state.shape[1])](q, k, v, g_device, beta_device, state, out,
                                                                            scale, group)
            return
        shape = (state.shape[0], self._k.DELTA_CHUNK, state.shape[1])
        if self._deltas is None or self._deltas.shape != shape:
            self._deltas = self.cuda.device_array(shape, dtype=np.float32)
        self._k.delta_net_chunks[state.shape[0], self.launch.threads](q, k, v, g_device, beta_device, state, out, scale,
                                                                      group, self._deltas)

    def add(self, a, b, out) -> None:
        self._k.add[self._grid(a.size)](_rows(a), _rows(b), _rows(out))

    def scale(self, x, factor, out) -> None:
        self._k.scale[self._grid(x.size)](_rows(x), np.float32(factor), _rows(out))

    def softcap(self, x, cap, out) -> None:
        self._k.softcap[self._grid(x.size)](_rows(x), np.float32(cap), _rows(out))


def _rows(a):
    """The 2-D [rows, last dim] view the elementwise kernels take."""
    return a if a.ndim == 2 else a.reshape(-1, a.shape[a.ndim - 1])  # (the simulator's shapes take no negative index)
