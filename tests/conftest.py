"""Shared fixtures: the real Gemma 3 270M file and llama.cpp's reference outputs.

tests/data/reference/ is a copy of the team's shared/reference/ (llama.cpp's outputs on the Gemma model
and its quantization of test vectors; its README says what each file holds), kept in the repository so
that a clean clone tests against the same facts.
"""

from __future__ import annotations

import os
from pathlib import Path

# OpenBLAS's kernels for the tests, chosen before NumPy loads it: the AVX2 (Haswell) ones unless the
# environment already names some. Prefill attention multiplies through BLAS, and the bit-exact records
# (tests/data/golden: scripts/golden_ops.py, golden_logits.py) were taken with these kernels; OpenBLAS's own
# choice differs by CPU (SkylakeX on AVX-512 machines, others elsewhere), each summing in its own order. The
# accuracy bar against llama.cpp no longer depends on it: it is the spread over 50 prompts
# (test_gemma_reference.py), which replaced a per-prompt KL bound that this pin once decided.
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
# Kernels compiled when first called, in this process and in the CLI processes the tests start: a cold
# start's background compile (localllm/backends/cpu/tiers.py) would start one more process per model file
# the suite writes. tests/backends/cpu/test_tiers.py sets "background" where it tests that path.
os.environ.setdefault("LOCALLLM_COMPILE", "foreground")

import pytest  # noqa: E402

REFERENCE_DIR = Path(__file__).parent / "data" / "reference"


@pytest.fixture(scope="session", autouse=True)
def numba_configured():
    """Numba configured as the CPU backend configures it (localllm.jit.configure_numba), so that the
    tests that call kernels directly compile them as a model run does."""
    from localllm.jit import configure_numba

    configure_numba()


@pytest.fixture(scope="session")
def gemma_path() -> str:
    """The PyPI-shipped Gemma 3 270M Q4_K_M, assembled (and checksum-verified) on first use."""
    from localllm.hub.default_model import default_model_path

    return str(default_model_path())
