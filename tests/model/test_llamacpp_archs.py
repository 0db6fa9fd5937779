"""Every architecture against llama.cpp's own logits on the same tiny random files.

scripts/llamacpp_arch_logits.py recorded llama.cpp's (llama-cpp-python 0.3.36) logits at every position
of two prompts (36 and 12 tokens from position 0) on the tiny models tests/tiny_models.py writes
(`oracle_model`), in F32, F16, Q8_0, Q4_K and the Q4_K_M mix (mixtures of experts also in the MXFP4_MOE
mix); tests/data/llamacpp_archs/<arch>.npz holds
them, float16, with each model file's SHA-256. Here each file is rebuilt (the digest says it is the same
file), loaded through the public API, and its logits compared.

Tolerances, relative to the largest |logit| of the prompt rows (the tiny models' logits run to 5-90):
- F32 and F16 weights: 2e-3. Both engines multiply in float32 (llama.cpp rounds activations to F16 for
  F16 weights), and both round the KV cache to F16; the rest is float32 summation order. Measured on
  this data: at most 1.9e-3 (OLMoE F16, whose logits are small: |logit| <= 6.2; 7.7e-4 for the dense
  families), 9.0e-4 (OLMoE F32); float16 storage adds up to 2.4e-4.
- Quantized weights: 4e-2. Both quantize each activation row to 8 bits per block (Q8_0 or Q8_K) before
  the integer dot products; a float32 sum that differs in its last bit flips a rounding of one 8-bit
  value (amax/254), and a few layers carry that to about 1-3% of the logit scale on these tiny models
  with small logits. Measured: at most 3.75e-2 (OLMoE Q4_K; 2.7e-2 for the dense families, gemma3 Q4_K_M).
- The argmax is the same wherever llama.cpp's top two logits are at least 0.5 apart.
- Mixtures of experts: a token whose router scores put its last chosen expert within a margin of the
  best one left out, in any layer, is left out of both checks: there a last-bit difference in either
  engine picks the other expert, as it flips a near-tie argmax. The margin is our engine's (its scores
  are llama.cpp's but for rounding; the float64 reference's differ more, by the activations' 8-bit
  quantization): 1e-3 with float weights, ROUTE_MARGIN with quantized ones (measured: 0.028 flipped on
  the Q4_K Qwen3-MoE file; scores run to about +-20). At most MAX_UNCLEAR_ROUTES of the rows may be
  left out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import localllm
from localllm.model import moe
from localllm.model.archs import ARCHITECTURES

from tiny_models import ORACLE_PROMPTS, TINY_ARCHS, file_sha256, oracle_model, oracle_types

DATA = Path(__file__).resolve().parent.parent / "data" / "llamacpp_archs"
FLOAT_RTOL = 2e-3
QUANT_RTOL = 4e-2
CLEAR_MARGIN = 0.5
ROUTE_MARGIN = 0.1
FLOAT_ROUTE_MARGIN = 1e-3
MAX_UNCLEAR_ROUTES = 0.1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("oracle")


def test_every_architecture_has_llamacpp_logits():
    """One recording per tiny model, and a tiny model of every architecture (Mixtral's is a llama file; the
    encoders, which give no logits, are checked on their embeddings: test_embeddings.py)."""
    from tiny_encoders import TINY_ENCODERS

    assert sorted(p.stem for p in DATA.glob("*.npz")) == sorted(TINY_ARCHS)
    assert {spec.architecture or name for name, spec in TINY_ARCHS.items()} | set(TINY_ENCODERS) == set(ARCHITECTURES)


@pytest.mark.parametrize("arch,qtype", [(a, t) for a in sorted(TINY_ARCHS) for t in oracle_types(a)])
def test_logits_match_llamacpp(model_dir, arch, qtype):
    recorded = np.load(DATA / f"{arch}.npz")
    assert [int(n) for n in recorded["prompt_lengths"]] == [len(p) for p in ORACLE_PROMPTS]
    path = model_dir / f"{arch}-{qtype}.gguf"
    if not path.exists():
        path = oracle_model(model_dir, arch, qtype)
    assert file_sha256(path) == str(recorded[f"sha256_{qtype}"]), (
        "the tiny model is no longer the file llama.cpp saw: re-run scripts/llamacpp_arch_logits.py")
    model = localllm.load(str(path), n_ctx=64, threads=2)
    rel, agree, compared = compare_logits(model, recorded, arch, qtype)
    assert compared >= 1.0 - MAX_UNCLEAR_ROUTES
    assert rel <= (FLOAT_RTOL if qtype in ("F32", "F16") else QUANT_RTOL)
    assert agree


def compare_logits(model, recorded, arch: str, qtype: str) -> tuple[float, bool, float]:
    """Our logits on the oracle prompts against llama.cpp's: (the largest |difference| over the largest
    |logit|, whether the argmax is the same wherever llama.cpp's top two are CLEAR_MARGIN apart, the
    share of rows compared: all but a mixture of experts' unclear routes). Also run by
    scripts/check_archs_on_backend.py for other backends."""
    ref = recorded[f"logits_{qtype}"].astype(np.float32)
    routed = routed_rows(model, arch, qtype, len(ref))
    ours = np.concatenate([model.logits(p) for p in ORACLE_PROMPTS])
    ours, ref = ours[routed], ref[routed]
    rel = float(np.abs(ours - ref).max() / np.abs(ref).max())
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= CLEAR_MARGIN
    return rel, bool((ours.argmax(-1) == ref.argmax(-1))[clear].all()), float(routed.mean())


def routed_rows(model, arch: str, qtype: str, n_rows: int) -> np.ndarray:
    """bool[n_rows] over the oracle prompts' rows: all of them, but for a mixture of experts only the rows
    whose every route is clear as our engine routes them (route_margins)."""
    if not TINY_ARCHS[arch].n_expert:
        return np.ones(n_rows, dtype=bool)
    margin = FLOAT_ROUTE_MARGIN if qtype in ("F32", "F16") else ROUTE_MARGIN
    return np.concatenate([np.min(m, axis=0) for m in route_margins(model)]) >= margin


def route_margins(model) -> list:
    """Per prompt of ORACLE_PROMPTS, per layer, each token's margin [T] between the router scores of its
    last chosen expert and the best one left out, as our engine routes the prompt (a forward of its own)."""
    per_prompt = []
    original = moe.expert_weights

    def recording(scores, params):
        ranked = np.sort(np.asarray(scores), axis=1)
        margins.append(ranked[:, -params.n_used] - ranked[:, -params.n_used - 1])
        return original(scores, params)

    moe.expert_weights = recording
    try:
        for prompt in ORACLE_PROMPTS:
            margins: list = []
            model.logits(prompt)
            per_prompt.append(margins)
    finally:
        moe.expert_weights = original
    return per_prompt
