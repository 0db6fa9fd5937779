"""Every architecture against llama.cpp's own logits on the same tiny random files.

scripts/llamacpp_arch_logits.py recorded llama.cpp's (llama-cpp-python 0.3.36) logits at every position
of two prompts (36 and 12 tokens from position 0) on the tiny models tests/tiny_models.py writes
(`oracle_model`), in F32, F16, Q8_0, Q4_K and the Q4_K_M mix; tests/data/llamacpp_archs/<arch>.npz holds
them, float16, with each model file's SHA-256. Here each file is rebuilt (the digest says it is the same
file), loaded through the public API, and its logits compared.

Tolerances, relative to the largest |logit| of the prompt rows (the tiny models' logits run to 5-90):
- F32 and F16 weights: 2e-3. Both engines multiply in float32 (llama.cpp rounds activations to F16 for
  F16 weights), and both round the KV cache to F16; the rest is float32 summation order. Measured on
  this data: at most 7.7e-4 (F16), 5.3e-4 (F32); float16 storage adds up to 2.4e-4.
- Quantized weights: 4e-2. Both quantize each activation row to 8 bits per block (Q8_0 or Q8_K) before
  the integer dot products; a float32 sum that differs in its last bit flips a rounding of one 8-bit
  value (amax/254), and a few layers carry that to about 1-3% of the logit scale on these tiny models
  with small logits. Measured: at most 2.7e-2 (gemma3 Q4_K_M).
- The argmax is the same wherever llama.cpp's top two logits are at least 0.5 apart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import localllm
from localllm.model.archs import ARCHITECTURES

from tiny_models import ORACLE_PROMPTS, ORACLE_TYPES, file_sha256, oracle_model

DATA = Path(__file__).resolve().parent.parent / "data" / "llamacpp_archs"
FLOAT_RTOL = 2e-3
QUANT_RTOL = 4e-2
CLEAR_MARGIN = 0.5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("oracle")


def test_every_architecture_has_llamacpp_logits():
    assert sorted(p.stem for p in DATA.glob("*.npz")) == sorted(ARCHITECTURES)


@pytest.mark.parametrize("qtype", ORACLE_TYPES)
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_logits_match_llamacpp(model_dir, arch, qtype):
    recorded = np.load(DATA / f"{arch}.npz")
    assert [int(n) for n in recorded["prompt_lengths"]] == [len(p) for p in ORACLE_PROMPTS]
    path = model_dir / f"{arch}-{qtype}.gguf"
    if not path.exists():
        path = oracle_model(model_dir, arch, qtype)
    assert file_sha256(path) == str(recorded[f"sha256_{qtype}"]), (
        "the tiny model is no longer the file llama.cpp saw: re-run scripts/llamacpp_arch_logits.py")
    model = localllm.load(str(path), n_ctx=64, threads=2)
    ours = np.concatenate([model.logits(p) for p in ORACLE_PROMPTS])
    ref = recorded[f"logits_{qtype}"].astype(np.float32)
    rtol = FLOAT_RTOL if qtype in ("F32", "F16") else QUANT_RTOL
    assert np.abs(ours - ref).max() <= rtol * np.abs(ref).max()
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= CLEAR_MARGIN
    assert (ours.argmax(-1) == ref.argmax(-1))[clear].all()
