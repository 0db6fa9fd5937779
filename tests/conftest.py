"""Shared fixtures: the real Gemma 3 270M file and llama.cpp's reference outputs.

tests/data/reference/ is a copy of the team's shared/reference/ (llama.cpp's outputs on the Gemma model
and its quantization of test vectors; its README says what each file holds), kept in the repository so
that a clean clone tests against the same facts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REFERENCE_DIR = Path(__file__).parent / "data" / "reference"


@pytest.fixture(scope="session")
def gemma_path() -> str:
    """The PyPI-shipped Gemma 3 270M Q4_K_M, assembled (and checksum-verified) on first use."""
    from localllm.hub.default_model import default_model_path

    return str(default_model_path())
