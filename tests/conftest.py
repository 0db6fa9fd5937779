"""Shared fixtures: the real Gemma 3 270M file, llama.cpp's reference outputs, and llama.cpp's tokenizer
test vocabularies.

tests/data/reference/ is a copy of the team's shared/reference/ (llama.cpp's outputs on the Gemma model
and its quantization of test vectors; its README says what each file holds), kept in the repository so
that a clean clone tests against the same facts.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
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
# Under pytest-xdist (the README's command) two worker processes share the cores, and an OpenMP worker that
# spins between parallel regions (localllm's bounded GOMP_SPINCOUNT, right for one process) takes the CPU
# the other process is waiting for (docs/performance.md, thirty-eighth session, has the timings). Unless the
# environment already says how OpenMP should wait; tests/test_runtime.py checks the default policy in clean
# children.
if os.environ.get("PYTEST_XDIST_WORKER") and "GOMP_SPINCOUNT" not in os.environ:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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


# llama.cpp's tokenizer test suite (models/ggml-vocab-*.gguf with .inp/.out cases, as its
# tests/test-tokenizer-0.cpp reads them) travels in llama-cpp-python's sdist: 75 MB the repository does not carry.
LLAMA_CPP_PYTHON = "0.3.36"


# Folders of the sdist the tests read: name -> which members go into it (matched on the member's path).
_SDIST_FOLDERS = {
    "models": lambda path: path.name.startswith("ggml-vocab-") and path.parent.as_posix().endswith("/vendor/llama.cpp/models"),
    "grammars": lambda path: path.suffix == ".gbnf" and path.parent.as_posix().endswith("/vendor/llama.cpp/grammars"),
}


def llama_cpp_test_data(folder: str) -> Path:
    """A folder of files from llama-cpp-python's sdist (see _SDIST_FOLDERS): pip downloads the sdist on first
    use, and the files are extracted once into ~/.cache/localllm/test-data/ ($XDG_CACHE_HOME honoured), then
    reused."""
    from localllm.host import user_cache_dir

    root = user_cache_dir(os.environ) / "localllm" / "test-data" / f"llama-cpp-python-{LLAMA_CPP_PYTHON}"
    if (root / folder).is_dir():
        return root / folder
    root.mkdir(parents=True, exist_ok=True)
    # One process fetches at a time (pytest-xdist's workers ask at once); the others then find the folders.
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / folder).is_dir():
            _fetch_sdist_folders(root)
    return root / folder


def _fetch_sdist_folders(root: Path) -> None:
    """Download the sdist into root and extract the missing _SDIST_FOLDERS from it (llama_cpp_test_data)."""
    sdist = root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not sdist.is_file():  # one left by an interrupted run is reused: pip writes it whole or not at all
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(root),
                   f"llama-cpp-python=={LLAMA_CPP_PYTHON}"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode or not sdist.is_file():
            pytest.fail(f"could not download llama-cpp-python {LLAMA_CPP_PYTHON}'s sdist (or put it at {sdist}):\n"
                        + (done.stderr or done.stdout)[-2000:])
    # Each missing folder is extracted beside its target and renamed into place, so that an interrupted run
    # leaves no half folder.
    missing = {name: Path(tempfile.mkdtemp(dir=root)) for name in _SDIST_FOLDERS if not (root / name).is_dir()}
    try:
        with tarfile.open(sdist, "r|gz") as archive:
            for member in archive:  # streamed: one pass over the archive
                path = Path(member.name)
                for name, tmp in missing.items():
                    if member.isfile() and _SDIST_FOLDERS[name](path):
                        with archive.extractfile(member) as src, open(tmp / path.name, "wb") as dst:
                            shutil.copyfileobj(src, dst)
        for name, tmp in missing.items():
            tmp.rename(root / name)
    finally:
        for tmp in missing.values():
            shutil.rmtree(tmp, ignore_errors=True)
    sdist.unlink()  # the extracted files are all the tests read


@pytest.fixture(scope="session")
def llama_cpp_vocab_dir() -> Path:
    """The folder of llama.cpp's ggml-vocab-* files (llama_cpp_test_data)."""
    return llama_cpp_test_data("models")


@pytest.fixture(scope="session")
def llama_cpp_grammars_dir() -> Path:
    """llama.cpp's example GBNF grammars (its grammars/*.gbnf; llama_cpp_test_data)."""
    return llama_cpp_test_data("grammars")
