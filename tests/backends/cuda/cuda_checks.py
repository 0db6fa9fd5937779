"""CUDA backend checks that are not op conformance: what upload does with a type the device has no kernel
for, embed's range check, and whole models (tiny llama and gemma3 files, `localllm.load`) giving the CPU
backend's greedy tokens. The ops themselves, every type and every backend against NumPy, are in
tests/backends/test_conformance.py.

Not collected by a plain `pytest` run (the name does not match test_*.py): tests/backends/cuda/test_cuda_sim.py runs it
in a subprocess under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1 must be set before numba.cuda is
imported, and must not reach the other tests' process), on small shapes and launch.SIMULATOR's tiny
blocks. On a machine with an NVIDIA GPU and numba-cuda, the same checks run at full size:

    LOCALLLM_CUDA_FULL=1 python -m pytest tests/backends/cuda/cuda_checks.py      # or: pytest tests/backends/cuda/test_cuda_sim.py

Tolerance: logits and products within normalized MSE sum((gpu-cpu)^2)/sum(cpu^2) <= 5e-4 of the CPU's,
llama.cpp's test-backend-ops bound (the device keeps the activation in float32 where the CPU quantizes it
to 8 bits for an integer dot).
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

FULL = os.environ.get("LOCALLLM_CUDA_FULL") == "1"
if not FULL and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    raise RuntimeError("run through tests/backends/cuda/test_cuda_sim.py, or set LOCALLLM_CUDA_FULL=1 on a GPU machine")

import reference_forward  # noqa: E402
import tiny_models  # noqa: E402
from localllm.backends import Weight, create_backend  # noqa: E402

# Matmul shape (N out, K in) of the upload check.
N, K = (2048, 4096) if FULL else (8, 256)
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


# ----- upload and embed -----------------------------------------------------------------------------------------


def test_type_without_kernel_is_converted_to_f16_at_upload(cpu, gpu, caplog):
    rng = np.random.default_rng(11)
    w = weight("Q4_1", raw_matrix(rng, "Q4_1", N, K), K)
    with caplog.at_level("WARNING", logger="localllm.cuda"):
        uploaded = gpu.upload(w)
    assert uploaded.qtype == "F16" and "Q4_1" in caplog.text and "F16" in caplog.text
    x = rng.normal(0, 1, (1, K)).astype(np.float32)
    assert nmse(run_matmul(gpu, uploaded, x), run_matmul(cpu, cpu.upload(w), x)) <= NMSE_BOUND


def test_embed_rejects_out_of_range_ids(gpu):
    from localllm.errors import LocalLLMError

    w = gpu.upload(weight("F32", np.zeros((4, 32), np.float32).view(np.uint8), 32))
    with pytest.raises(LocalLLMError, match="out of range"):
        gpu.embed(w, np.array([4], np.int32), gpu.alloc((1, 32)))


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
    from localllm.model.kv_cache import KVCache

    cache = KVCache(decoder.ops, decoder.hp, n_ctx, decoder.kv_layout())
    logits = decoder.forward(np.array(prompt, np.int32), 0, cache)[-1].copy()
    tokens, rows = [], [logits]
    for step in range(n_new):
        tokens.append(int(np.argmax(logits)))
        logits = decoder.forward(np.array(tokens[-1:], np.int32), len(prompt) + step, cache)[0].copy()
        rows.append(logits)
    return tokens, np.array(rows)


@pytest.mark.parametrize("arch,qtype", [("llama", "Q8_0"), ("gemma3", "Q4_0"), ("qwen35", "Q8_0")])
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
        # the float64 reference's logits at the same positions (the prompt's last, then each step's)
        exact = reference_forward.forward(reader, prompt + ref_tokens)[len(prompt) - 1 :]
    assert tokens == ref_tokens
    # Within the bound of the CPU's logits, or no further from the exact ones than the CPU's are: the CPU
    # rounds activations to 8 bits before a quantized product, the device multiplies them in float32, and
    # through a whole model that alone can exceed the bound (gemma3-Q4_0 on a GPU: 5.3e-4 from the CPU).
    assert nmse(logits, ref_logits) <= NMSE_BOUND or nmse(logits, exact) <= nmse(ref_logits, exact), (
        nmse(logits, ref_logits), nmse(logits, exact), nmse(ref_logits, exact))
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
