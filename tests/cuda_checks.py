"""CUDA backend conformance: every op against the CPU backend.

Not collected by a plain `pytest` run (the name does not match test_*.py): tests/test_cuda_sim.py runs it
in a subprocess under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1 must be set before numba.cuda is
imported, and must not reach the other tests' process), on small shapes and launch.SIMULATOR's tiny
blocks. On a machine with an NVIDIA GPU and numba-cuda, the same checks run at full size:

    LOCALLLM_CUDA_FULL=1 python -m pytest tests/cuda_checks.py      # or: pytest tests/test_cuda_sim.py

Tolerances, and why:
- matmul: normalized MSE sum((gpu-cpu)^2)/sum(cpu^2) <= 5e-4, llama.cpp's test-backend-ops bound. The
  device keeps the activation in float32 where the CPU quantizes it to 8 bits for an integer dot.
- embed, add, scale, kv_store (float16 rounding, compared bit for bit): exact.
- rms_norm, rope, attention, SiLU: float32 rounding differences (summation order, exp/sin/cos of
  another libm), 1e-5 relative (1e-5 absolute near 0).
- GELU: 2e-3 relative: the CPU reads a float16-rounded table (ggml's), the device computes in float32.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

FULL = os.environ.get("LOCALLLM_CUDA_FULL") == "1"
if not FULL and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    raise RuntimeError("run through tests/test_cuda_sim.py, or set LOCALLLM_CUDA_FULL=1 on a GPU machine")

import tiny_models  # noqa: E402
from localllm import quant  # noqa: E402
from localllm.backends import Weight, create_backend  # noqa: E402

MATMUL_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q8_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]
# Matmul shape (N out, K in) and batch sizes: T < 8 is the matvec path, T >= 8 dequantize + GEMM.
N, K = (2048, 4096) if FULL else (8, 256)
BATCHES = (1, 3, 9, 512) if FULL else (1, 3)
GEMM_TYPES = MATMUL_TYPES if FULL else ["F32", "Q8_0", "Q4_K"]  # the simulator's GEMM is slow
NMSE_BOUND = 5e-4


@pytest.fixture(scope="module")
def cpu():
    return create_backend("cpu", 1)


@pytest.fixture(scope="module")
def gpu():
    return create_backend("cuda")


def nmse(got: np.ndarray, ref: np.ndarray) -> float:
    return float(((got.astype(np.float64) - ref) ** 2).sum() / (ref.astype(np.float64) ** 2).sum())


def raw_matrix(rng, qtype: str, n: int, k: int) -> np.ndarray:
    """uint8[n, row_bytes] of a random matrix in qtype (values ~N(0, 0.05))."""
    values = rng.normal(0, 0.05, (n, k)).astype(np.float32)
    if qtype == "F32":
        return values.view(np.uint8)
    if qtype == "F16":
        return values.astype(np.float16).view(np.uint8)
    if qtype == "BF16":
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return tiny_models.quantized_matrix(rng, n, k, qtype)


def weight(qtype: str, raw: np.ndarray, k: int) -> Weight:
    return Weight("w", qtype, (k, raw.shape[0]), raw)


def on_device(gpu, host: np.ndarray):
    return gpu.cuda.to_device(np.ascontiguousarray(host))


def run_matmul(backend, w, x, bias=None, rows=False):
    out = backend.alloc((x.shape[0], w.n_out))
    dev_x = x if backend.name == "cpu" else on_device(backend, x)
    (backend.matmul_rows if rows else backend.matmul)(w, dev_x, out, bias)
    return backend.to_host(out)


# ----- matmul ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", MATMUL_TYPES)
@pytest.mark.parametrize("n_tokens", BATCHES)
def test_matmul_within_nmse_of_cpu(cpu, gpu, qtype, n_tokens):
    rng = np.random.default_rng(100 * MATMUL_TYPES.index(qtype) + n_tokens)  # str hashes vary per process
    w = weight(qtype, raw_matrix(rng, qtype, N, K), K)
    x = rng.normal(0, 1, (n_tokens, K)).astype(np.float32)
    bias = rng.normal(0, 0.1, N).astype(np.float32) if n_tokens == 3 else None  # qwen2's q/k/v biases
    ref = run_matmul(cpu, cpu.upload(w), x, bias)
    got = run_matmul(gpu, gpu.upload(w), x, bias)
    assert nmse(got, ref) <= NMSE_BOUND, f"{qtype} T={n_tokens}: NMSE {nmse(got, ref):.2e}"


@pytest.mark.parametrize("qtype", GEMM_TYPES)
def test_prefill_gemm_path_within_nmse_of_cpu(cpu, gpu, qtype):
    """9 rows (> the 8-row matvec limit, and not a multiple of the GEMM tile) with a bias."""
    rng = np.random.default_rng(7)
    w = weight(qtype, raw_matrix(rng, qtype, N, K), K)
    x = rng.normal(0, 1, (9, K)).astype(np.float32)
    bias = rng.normal(0, 1, N).astype(np.float32)
    ref = run_matmul(cpu, cpu.upload(w), x, bias)
    got = run_matmul(gpu, gpu.upload(w), x, bias)
    assert nmse(got, ref) <= NMSE_BOUND


def test_matmul_catches_a_wrong_weight(cpu, gpu):
    """Negative control: one changed block of a Q4_K matrix moves the result past the bound."""
    rng = np.random.default_rng(3)
    raw = raw_matrix(rng, "Q4_K", N, K)
    x = rng.normal(0, 1, (1, K)).astype(np.float32)
    ref = run_matmul(cpu, cpu.upload(weight("Q4_K", raw, K)), x)
    broken = raw.copy()
    broken[:, 16:144] ^= 0x11  # every nibble of the first super-block's quants of every row changed
    got = run_matmul(gpu, gpu.upload(weight("Q4_K", broken, K)), x)
    assert nmse(got, ref) > NMSE_BOUND


@pytest.mark.parametrize("qtype", ["Q8_0", "Q6_K"])
def test_matmul_rows_equal_single_row_matmuls(gpu, qtype):
    """matmul_rows promises each row exactly as a T=1 matmul computes it (the server's batched decode)."""
    rng = np.random.default_rng(5)
    w = gpu.upload(weight(qtype, raw_matrix(rng, qtype, N, K), K))
    x = rng.normal(0, 1, (10, K)).astype(np.float32)  # more than one 8-row launch
    together = run_matmul(gpu, w, x, rows=True)
    for t in (0, 9):
        np.testing.assert_array_equal(together[t], run_matmul(gpu, w, x[t : t + 1])[0])


def test_type_without_kernel_is_converted_to_f16_at_upload(cpu, gpu, caplog):
    rng = np.random.default_rng(11)
    w = weight("Q4_1", raw_matrix(rng, "Q4_1", N, K), K)
    with caplog.at_level("WARNING", logger="localllm.cuda"):
        uploaded = gpu.upload(w)
    assert uploaded.qtype == "F16" and "Q4_1" in caplog.text and "F16" in caplog.text
    x = rng.normal(0, 1, (1, K)).astype(np.float32)
    assert nmse(run_matmul(gpu, uploaded, x), run_matmul(cpu, cpu.upload(w), x)) <= NMSE_BOUND


# ----- embedding, norms, RoPE ---------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", MATMUL_TYPES)
def test_embed_equals_cpu(cpu, gpu, qtype):
    rng = np.random.default_rng(13)
    w = weight(qtype, raw_matrix(rng, qtype, N, K), K)
    ids = np.array([N - 1, 0, 3, 3], dtype=np.int32)
    ref = np.zeros((4, K), np.float32)
    cpu.embed(cpu.upload(w), ids, ref)
    out = gpu.alloc((4, K))
    gpu.embed(gpu.upload(w), ids, out)
    np.testing.assert_array_equal(gpu.to_host(out), ref)


def test_embed_rejects_out_of_range_ids(gpu):
    from localllm.errors import LocalLLMError

    w = gpu.upload(weight("F32", np.zeros((4, 32), np.float32).view(np.uint8), 32))
    with pytest.raises(LocalLLMError, match="out of range"):
        gpu.embed(w, np.array([4], np.int32), gpu.alloc((1, 32)))


def test_rms_norm(cpu, gpu):
    rng = np.random.default_rng(17)
    d = 4096 if FULL else 48
    x = rng.normal(0, 2, (3, 2, d)).astype(np.float32)  # [T, H, D]: rows are T*H
    weight_ = rng.normal(1, 0.1, d).astype(np.float32)
    ref = np.zeros_like(x)
    cpu.rms_norm(x, weight_, 1e-6, ref)
    dev = on_device(gpu, x)
    gpu.rms_norm(dev, weight_, 1e-6, dev)  # in place, as the Q/K norms run
    np.testing.assert_allclose(gpu.to_host(dev), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
def test_rope(cpu, gpu, neox):
    rng = np.random.default_rng(19)
    n_tok, n_head, d, n_rot = (5, 32, 128, 128) if FULL else (3, 2, 16, 12)  # partial rotation
    x = rng.normal(0, 1, (n_tok, n_head, d)).astype(np.float32)
    positions = np.array([0, 7, 1000, 3, 9][:n_tok], dtype=np.int32)
    factors = rng.uniform(1, 4, n_rot // 2).astype(np.float32)
    ref = x.copy()
    cpu.rope(ref, positions, n_rot, 10000.0, neox, factors, 0.5)
    dev = on_device(gpu, x)
    gpu.rope(dev, positions, n_rot, 10000.0, neox, factors, 0.5)
    np.testing.assert_allclose(gpu.to_host(dev), ref, rtol=1e-5, atol=1e-5)
    assert not np.allclose(ref, x)  # the rotation did something


# ----- KV cache and attention -----------------------------------------------------------------------------------


def test_kv_store_rounds_to_float16_as_numpy(gpu):
    """Bit-exact float32 -> float16: ties to even, subnormals, overflow to inf, largest half."""
    special = np.array(
        [0.0, -0.0, 1.0, -2.5, 65504.0, 65519.0, 65520.0, 1e6, -1e6, 6.1e-5, 6.0e-5, 3e-8, 2.98e-8, 1e-9,
         1.0 + 2**-11, 1.0 + 3 * 2**-11, 2049.0, 2051.0, 0.1, -0.3333, 1e-4, 5.96e-8, 2.0**-24, 2.0**-25],
        dtype=np.float32,
    )
    rng = np.random.default_rng(23)
    values = np.concatenate([special, rng.normal(0, 3, 40).astype(np.float32)])
    k = np.resize(values, 4 * 2 * 8).reshape(4, 2, 8)
    cache_k, cache_v = gpu.alloc((6, 2, 8), np.float16), gpu.alloc((6, 2, 8), np.float16)
    gpu.kv_store(cache_k, cache_v, on_device(gpu, k), on_device(gpu, -k), 2)
    got = gpu.to_host(cache_k)
    with np.errstate(over="ignore"):  # 1e6 -> inf is one of the cases
        np.testing.assert_array_equal(got[2:6].view(np.uint16), k.astype(np.float16).view(np.uint16))
        np.testing.assert_array_equal(gpu.to_host(cache_v)[2:6].view(np.uint16), (-k).astype(np.float16).view(np.uint16))
    assert not got[:2].any()  # rows before start untouched (zero-filled by alloc)


def test_float16_and_bfloat16_decoding_is_exact(gpu):
    """Every float16 bit pattern, and a spread of bfloat16 ones, against NumPy's widening."""
    from localllm.backends.cuda.blocks import UNIT_DECODERS

    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    if not FULL:
        bits = bits[np.random.default_rng(29).choice(65536, 2048, replace=False)]
    bits = np.concatenate([bits, np.array([0, 1, 1023, 1024, 0x7BFF, 0x7C00, 0xFC00, 0x8001], np.uint16)])
    bits = np.resize(bits, (len(bits) + 31) // 32 * 32).reshape(-1, 32)
    halves = bits.view(np.float16).astype(np.float32)
    brains = (bits.astype(np.uint32) << 16).view(np.float32)
    for qtype, expected in (("F16", halves), ("BF16", brains)):
        w = gpu.upload(weight(qtype, bits.view(np.uint8), 32))
        out = gpu.alloc(expected.shape)
        gpu.embed(w, np.arange(expected.shape[0], dtype=np.int32), out)
        got = gpu.to_host(out)
        finite = np.isfinite(expected)
        np.testing.assert_array_equal(got[finite], expected[finite])
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        np.testing.assert_array_equal(got[np.isinf(expected)], expected[np.isinf(expected)])
    assert "F16" in UNIT_DECODERS


def fill_cache(rng, n_ctx, n_kv, d):
    return (rng.normal(0, 1, (n_ctx, n_kv, d)).astype(np.float16), rng.normal(0, 1, (n_ctx, n_kv, d)).astype(np.float16))


ATTN = dict(n_head=32, n_kv=8, d=128, n_tok=7, start=300) if FULL else dict(n_head=4, n_kv=2, d=16, n_tok=3, start=6)


@pytest.mark.parametrize("window", [0, 4], ids=["causal", "window"])
@pytest.mark.parametrize("n_tok", [1, ATTN["n_tok"]], ids=["decode", "batch"])
def test_attention_gqa(cpu, gpu, window, n_tok):
    rng = np.random.default_rng(31)
    n_head, n_kv, d, start = ATTN["n_head"], ATTN["n_kv"], ATTN["d"], ATTN["start"]
    n_ctx = start + n_tok + 2
    k, v = fill_cache(rng, n_ctx, n_kv, d)
    q = rng.normal(0, 1, (n_tok, n_head, d)).astype(np.float32)
    ref = np.zeros_like(q)
    cpu.attention(q, k, v, start, 0.25, window, ref)
    out = gpu.alloc(q.shape)
    gpu.attention(on_device(gpu, q), on_device(gpu, k), on_device(gpu, v), start, 0.25, window, out)
    np.testing.assert_allclose(gpu.to_host(out), ref, rtol=1e-5, atol=1e-5)


class Layout:
    """The fields of model/kv_paged.BatchLayout that the paged ops read."""

    def __init__(self, tables, row_seq, positions):
        self.tables, self.row_seq, self.positions = tables, row_seq, positions
        n_seq = tables.shape[0]
        self.seq_first = np.array([np.flatnonzero(row_seq == s)[0] for s in range(n_seq)], np.int32)
        self.seq_rows = np.array([(row_seq == s).sum() for s in range(n_seq)], np.int32)
        self.seq_start = np.array([positions[row_seq == s].min() for s in range(n_seq)], np.int32)


def test_paged_store_and_attention(cpu, gpu):
    """Two sequences over shuffled blocks of 4 positions: a decode row and a 2-row chunk, window 3."""
    rng = np.random.default_rng(37)
    n_head, n_kv, d, bs, nb = 4, 2, 16, 4, 6
    tables = np.array([[5, 1, 0], [2, 4, 3]], dtype=np.int32)
    row_seq = np.array([0, 1, 1], dtype=np.int32)
    positions = np.array([6, 8, 9], dtype=np.int32)
    slots = np.array([tables[s, p // bs] * bs + p % bs for s, p in zip(row_seq, positions)], np.int32)
    cache = [rng.normal(0, 1, (nb, bs, n_kv, d)).astype(np.float16) for _ in range(2)]
    k = rng.normal(0, 1, (3, n_kv, d)).astype(np.float32)
    v = rng.normal(0, 1, (3, n_kv, d)).astype(np.float32)
    q = rng.normal(0, 1, (3, n_head, d)).astype(np.float32)
    layout = Layout(tables, row_seq, positions)
    ref_k, ref_v = cache[0].copy(), cache[1].copy()
    cpu.kv_store_paged(ref_k, ref_v, k, v, slots)
    ref = np.zeros_like(q)
    cpu.attention_paged(q, ref_k, ref_v, layout, 0.3, 3, ref)
    dev_k, dev_v = on_device(gpu, cache[0]), on_device(gpu, cache[1])
    gpu.kv_store_paged(dev_k, dev_v, on_device(gpu, k), on_device(gpu, v), slots)
    np.testing.assert_array_equal(gpu.to_host(dev_k), ref_k)
    np.testing.assert_array_equal(gpu.to_host(dev_v), ref_v)
    out = gpu.alloc(q.shape)
    gpu.attention_paged(on_device(gpu, q), dev_k, dev_v, layout, 0.3, 3, out)
    np.testing.assert_allclose(gpu.to_host(out), ref, rtol=1e-5, atol=1e-5)


# ----- elementwise ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,rtol", [("silu", 1e-5), ("gelu_tanh", 2e-3)])
def test_gated_act(cpu, gpu, kind, rtol):
    rng = np.random.default_rng(41)
    gate = np.concatenate([rng.normal(0, 3, (2, 40)), np.full((1, 40), 12.0)]).astype(np.float32)
    up = rng.normal(0, 1, gate.shape).astype(np.float32)
    ref = np.zeros_like(gate)
    cpu.gated_act(gate, up, ref, kind)
    out = gpu.alloc(gate.shape)
    gpu.gated_act(on_device(gpu, gate), on_device(gpu, up), out, kind)
    np.testing.assert_allclose(gpu.to_host(out), ref, rtol=rtol, atol=1e-5)


def test_add_and_scale(cpu, gpu):
    rng = np.random.default_rng(43)
    a, b = rng.normal(0, 1, (2, 3, 40)).astype(np.float32)
    dev_a, dev_b = on_device(gpu, a), on_device(gpu, b)
    gpu.add(dev_a, dev_b, dev_a)  # in place, as the residual adds run
    np.testing.assert_array_equal(gpu.to_host(dev_a), a + b)
    out = gpu.alloc(a.shape)
    gpu.scale(dev_b, 3.5, out)
    np.testing.assert_array_equal(gpu.to_host(out), b * np.float32(3.5))


# ----- whole models ------------------------------------------------------------------------------------------------

# Simulator-sized models: tiny_models' writer with smaller dimensions (every feature kept: GQA 2:1,
# windows, Q/K norms, biases, RoPE factors); on a GPU, tiny_models' own sizes.
MICRO = dict(N_EMBD=32, N_HEAD=2, N_KV=1, HEAD_DIM=16, N_FF=64, N_VOCAB=48, WINDOW=3)
MICRO_LAYERS = {"llama": 2, "gemma3": 1}


@contextlib.contextmanager
def model_dimensions():
    if FULL:
        yield
        return
    saved = {name: getattr(tiny_models, name) for name in MICRO}
    saved_layers = dict(tiny_models.ARCH_LAYERS)
    for name, value in MICRO.items():
        setattr(tiny_models, name, value)
    tiny_models.ARCH_LAYERS.update(MICRO_LAYERS)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(tiny_models, name, value)
        tiny_models.ARCH_LAYERS.clear()
        tiny_models.ARCH_LAYERS.update(saved_layers)


def greedy(decoder, prompt, n_new, n_ctx=16):
    """Greedy tokens after `prompt` (batched prefill, then one token per step) and every step's logits."""
    from localllm.model.decoder import KVCache

    cache = KVCache(decoder.ops, decoder.hp, n_ctx)
    logits = decoder.forward(np.array(prompt, np.int32), 0, cache)[-1].copy()
    tokens, rows = [], [logits]
    for step in range(n_new):
        tokens.append(int(np.argmax(logits)))
        logits = decoder.forward(np.array(tokens[-1:], np.int32), len(prompt) + step, cache)[0].copy()
        rows.append(logits)
    return tokens, np.array(rows)


@pytest.mark.parametrize("arch,qtype", [("llama", "Q8_0"), ("gemma3", "Q4_0")])
def test_tiny_model_greedy_tokens_equal_cpu(tmp_path, cpu, gpu, arch, qtype):
    from localllm.gguf import GGUFReader
    from localllm.model.archs import architecture_class

    with model_dimensions():
        path = tiny_models.write_tiny_model(tmp_path / "m.gguf", arch, qtype, seed=1)
        n_vocab = tiny_models.N_VOCAB
    prompt = [5, 17, 2, 40, 9] if FULL else [5, 17, 2]  # positions 0..4: past gemma's window of 3
    with GGUFReader(path) as reader:
        cls = architecture_class(reader.architecture)
        ref_tokens, ref_logits = greedy(cls(reader, cpu, n_vocab), prompt, 4 if FULL else 2)
        tokens, logits = greedy(cls(reader, gpu, n_vocab), prompt, 4 if FULL else 2)
    assert tokens == ref_tokens
    assert nmse(logits, ref_logits) <= NMSE_BOUND
    assert len(set(ref_tokens)) > 1 or np.ptp(ref_logits[0]) > 0  # a model that says something


def test_load_and_generate_through_the_api(tmp_path):
    """localllm.load(backend='cuda'): memory plan, upload, generate; the same greedy tokens as the CPU."""
    import localllm

    with model_dimensions():
        tiny_models.N_VOCAB = 260 if not FULL else tiny_models.N_VOCAB  # the tokenizer's 260 base pieces
        path = tiny_models.write_tiny_model(tmp_path / "m.gguf", "llama", "Q8_0", seed=2)
    runs = {}
    for backend in ("cpu", "cuda"):
        with localllm.load(path, n_ctx=16, backend=backend) as model:
            events = model.generate([2, 100, 200], max_tokens=2, temperature=0.0)
            runs[backend] = [e.token for e in events if e.kind == "token"]
            if backend == "cuda":
                assert model.memory.device_bytes > 0 and model.backend.name == "cuda"
    assert runs["cuda"] == runs["cpu"] and len(runs["cpu"]) == 2
