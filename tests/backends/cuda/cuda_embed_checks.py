"""The encoders (BERT, nomic-bert) on the CUDA backend: every token's hidden state as the CPU backend's,
and Model.embed through localllm.load(backend="cuda") giving the CPU's vectors. Run by
tests/backends/cuda/test_cuda_sim.py under numba's CUDA simulator (micro sizes), or with
LOCALLLM_CUDA_FULL=1 on a GPU at tests/tiny_encoders.py's own sizes; tolerance as cuda_checks.py's."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

FULL = os.environ.get("LOCALLLM_CUDA_FULL") == "1"
if not FULL and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    raise RuntimeError("run through tests/backends/cuda/test_cuda_sim.py, or set LOCALLLM_CUDA_FULL=1 on a GPU machine")

import tiny_encoders  # noqa: E402

NMSE_BOUND = 5e-4
MICRO = dict(N_EMBD=32, N_HEAD=2, HEAD_DIM=16, N_FF=64, N_LAYER=1, N_CTX=16)


@contextlib.contextmanager
def model_dimensions():
    if FULL:
        yield
        return
    saved = {name: getattr(tiny_encoders, name) for name in MICRO}
    for name, value in MICRO.items():
        setattr(tiny_encoders, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(tiny_encoders, name, value)


def nmse(got: np.ndarray, ref: np.ndarray) -> float:
    return float(((got.astype(np.float64) - ref) ** 2).sum() / (ref.astype(np.float64) ** 2).sum())


@pytest.mark.parametrize("name,qtype", [("bert", "Q8_0"), ("nomic-bert", "F32")])
def test_encoder_embeddings_equal_cpu(tmp_path, name, qtype):
    import localllm

    with model_dimensions():
        path = tiny_encoders.write_tiny_encoder(tmp_path / "m.gguf", name, qtype)
    texts = ["the quick brown fox", "a"] if not FULL else list(tiny_encoders.EMBED_TEXTS)
    runs = {}
    for backend in ("cpu", "cuda"):
        with localllm.load(path, backend=backend) as model:
            ids = model.tokenize(texts[0])
            hidden = model.decoder.hidden_states(np.array(ids, np.int32), model.embedding_cache(len(ids)))
            runs[backend] = (hidden, model.embed(texts, normalize=False))
    assert nmse(runs["cuda"][0], runs["cpu"][0]) <= NMSE_BOUND
    assert nmse(runs["cuda"][1], runs["cpu"][1]) <= NMSE_BOUND
    assert np.ptp(runs["cpu"][0]) > 0
