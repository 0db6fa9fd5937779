"""The batched path on the CUDA backend: the take_rows op, and the batching engine (Decoder.forward_batch
over the paged cache) on a device model.

Not collected by a plain `pytest` run: tests/backends/cuda/test_cuda_sim.py runs it in a child process under numba's
CUDA simulator, as tests/backends/cuda/test_cuda_sim.py runs cuda_checks.py (whose tiny model dimensions it reuses).
On a machine with an NVIDIA GPU and numba-cuda: LOCALLLM_CUDA_FULL=1 python -m pytest tests/backends/cuda/cuda_engine_checks.py
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from cuda_checks import FULL, model_dimensions, on_device  # raises unless simulated or FULL

import tiny_models  # noqa: E402
from localllm.backends import create_backend  # noqa: E402


@pytest.fixture(scope="module")
def gpu():
    return create_backend("cuda")


def test_take_rows_equals_np_take(gpu):
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (7, 12)).astype(np.float32)
    rows = np.array([3, 0, 6, 6], dtype=np.int32)  # any order, repeats allowed
    out = gpu.alloc((4, 12))
    gpu.take_rows(on_device(gpu, x), rows, out)
    np.testing.assert_array_equal(gpu.to_host(out), np.take(x, rows, axis=0))
    gpu.take_rows(on_device(gpu, x), rows[:1], out[:1])  # a view of a larger buffer, one row
    np.testing.assert_array_equal(gpu.to_host(out)[0], x[3])


def engine_tokens(model, prompts, max_tokens) -> list:
    """Each prompt's greedy tokens from one batching Engine running them together (8 KV blocks)."""
    from localllm.engine.batching import Engine, GenerationRequest
    from localllm.model.kv_paged import PagedKVCache
    from localllm.sampling import SamplingConfig

    cache_mb = 8 * PagedKVCache.bytes_per_block(model.decoder.hp) / 2**20
    engine = Engine(model, parallel=len(prompts), cache_mb=cache_mb)
    loop = asyncio.new_event_loop()
    try:
        handles = [engine.submit(GenerationRequest(list(p), SamplingConfig(temperature=0.0), max_tokens=max_tokens,
                                                   top_logprobs=0), loop) for p in prompts]

        async def collect(handle):
            return [(e.token, e.logprob) async for e in handle.events() if e.kind == "token"]

        async def all_events():
            return await asyncio.gather(*(collect(h) for h in handles))

        engine.start()
        try:
            return loop.run_until_complete(asyncio.wait_for(all_events(), 600))
        finally:
            engine.stop()
    finally:
        loop.close()


def test_the_batching_engine_runs_on_the_device(tmp_path):
    """Two requests batched on the CUDA backend (a decode row beside the other's prompt rows, paged
    cache, take_rows) give each the tokens and logprobs that Model.generate gives it alone there."""
    import localllm

    with model_dimensions():
        tiny_models.N_VOCAB = 260 if not FULL else tiny_models.N_VOCAB  # the tokenizer's 260 base pieces
        path = tiny_models.write_tiny_model(tmp_path / "m.gguf", "llama", "Q8_0", seed=2)
    prompts = [[2, 100, 200], [2, 7, 30, 99, 150]]
    with localllm.load(path, n_ctx=16, backend="cuda") as model:
        assert model.backend.name == "cuda"
        batched = engine_tokens(model, prompts, max_tokens=2)
        for prompt, got in zip(prompts, batched):
            events = model.generate(prompt, max_tokens=2, temperature=0.0, top_logprobs=0, session=model.new_session())
            alone = [(e.token, e.logprob) for e in events if e.kind == "token"]
            assert got == alone and len(alone) == 2


def test_verified_rows_equal_decode_steps_on_the_device(tmp_path):
    """Speculative decoding's Decoder.verify on the CUDA backend: each of its rows' logits equal, bit for
    bit, those of the one-token steps that would decode the same tokens (localllm/speculative.py)."""
    import localllm
    from localllm.model.kv_cache import KVCache

    with model_dimensions():
        tiny_models.N_VOCAB = 260 if not FULL else tiny_models.N_VOCAB
        path = tiny_models.write_tiny_model(tmp_path / "m.gguf", "llama", "Q8_0", seed=5)
    prompt, tokens = np.array([2, 100, 200, 37], np.int32), np.array([5, 61, 7, 140], np.int32)
    with localllm.load(path, n_ctx=16, backend="cuda") as model:
        dec = model.decoder
        steps_cache, verify_cache = (KVCache(model.backend, dec.hp, 16, dec.kv_layout()) for _ in range(2))
        dec.forward(prompt, 0, steps_cache)
        dec.forward(prompt, 0, verify_cache)
        steps = [np.array(dec.forward(tokens[i : i + 1], len(prompt) + i, steps_cache)[0]) for i in range(len(tokens))]
        rows = np.array(dec.verify(tokens, len(prompt), verify_cache))
        for i, row in enumerate(steps):
            np.testing.assert_array_equal(rows[i], row)
