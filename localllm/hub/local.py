"""The models already on this machine: the .gguf files in the models directory (see store.py).

A file's NAME is what `localllm chat NAME` and `localllm rm NAME` accept: `gemma-3-270m` for the built-in
default, the registry name for a file pulled through the registry (llama-3.1-8b-instruct-q4_k_m for
Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf), else the file name without .gguf.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from ..errors import LocalLLMError
from .default_model import DEFAULT_MODEL_NAME, FILE_NAME as DEFAULT_FILE_NAME
from .store import models_dir


@dataclass
class LocalModel:
    name: str
    path: Path
    size: int  # bytes
    modified: Optional[datetime]  # None: the default model, not assembled yet
    quant: Optional[str]  # general.file_type as llama.cpp names it (Q4_K_M, ...); None if unknown
    arch: Optional[str]
    problem: Optional[str] = None  # why the header could not be read, for a file that is not a valid GGUF
    default: bool = False

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "path": str(self.path),
            "size": self.size,
            "quant": self.quant,
            "arch": self.arch,
            "modified": self.modified.isoformat(timespec="seconds") if self.modified else None,
            "problem": self.problem,
            "default": self.default,
        }


def local_model_files(directory: Optional[Path] = None) -> list[Path]:
    """Finished models only: hidden files (partial downloads, temporaries, indexes) are not models."""
    directory = directory or models_dir()
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.gguf") if p.is_file() and not p.name.startswith("."))


def local_name(path: Path, records: Optional[dict] = None) -> str:
    """The name `path` (a file in the models directory) is listed and removed under. `records` is the
    pull index (pull.pulled_records), read here when not given."""
    if path.name == DEFAULT_FILE_NAME:
        return DEFAULT_MODEL_NAME
    from .pull import pulled_records
    from .registry import default_registry

    record = (pulled_records(path.parent) if records is None else records).get(path.name)
    try:
        registry = default_registry()
    except LocalLLMError:  # a broken registry must not hide the files themselves
        return path.stem
    # A file pulled by a registry name knows its repository; one copied in by hand is matched by file name.
    choice = registry.by_file(record.repo_id, record.filename) if record else registry.by_file(None, path.name)
    return choice.name if choice is not None else path.stem


def describe_local(path: Path, records: Optional[dict] = None) -> LocalModel:
    """Name, size, date, and from the header the quant and architecture (a bad file is listed, not fatal)."""
    from ..gguf import GGUFReader
    from ..gguf.constants import FILE_TYPES

    stat = path.stat()
    quant = arch = problem = None
    try:
        with GGUFReader(path) as reader:
            arch = reader.metadata.get_str("general.architecture", None)  # wrong types: GGUFError, listed as the problem
            file_type = reader.metadata.get_int("general.file_type", None)
            if file_type is not None:
                quant = FILE_TYPES.get(file_type, f"type {file_type}").removeprefix("MOSTLY_")
    except LocalLLMError as exc:
        problem = str(exc)
    except OSError as exc:
        problem = f"cannot read: {exc.strerror or exc}"
    return LocalModel(
        name=local_name(path, records),
        path=path,
        size=stat.st_size,
        modified=datetime.fromtimestamp(stat.st_mtime, tz=timezone.utc),
        quant=quant,
        arch=arch,
        problem=problem,
        default=path.name == DEFAULT_FILE_NAME,
    )


def list_local(directory: Optional[Path] = None) -> list[LocalModel]:
    """Every model file in the models directory, and the default model once (listed even before its
    first use assembles it: it is installed, as chunks of its PyPI package)."""
    from .pull import pulled_records

    directory = directory or models_dir()
    records = pulled_records(directory)
    models = [describe_local(p, records) for p in local_model_files(directory)]
    if not any(m.default for m in models):
        models.append(_default_not_assembled(directory))
    return sorted(models, key=lambda m: (not m.default, m.name.lower()))


def _default_not_assembled(directory: Path) -> LocalModel:
    from . import default_model

    try:
        size, problem = sum(p.stat().st_size for p in default_model._chunks()), "assembled on first use"
    except (LocalLLMError, OSError) as exc:
        size, problem = 0, str(exc)
    return LocalModel(DEFAULT_MODEL_NAME, directory / DEFAULT_FILE_NAME, size, None, "Q4_K_M", "gemma3",
                      problem=problem, default=True)


def find_local(name: str, directory: Optional[Path] = None) -> Optional[Path]:
    """The models-directory file that NAME means (its listed name, or its file name with or without
    .gguf; any case), or None."""
    from .pull import pulled_records

    directory = directory or models_dir()
    wanted = name.strip().lower()
    records = pulled_records(directory)
    for path in local_model_files(directory):
        if wanted in (path.stem.lower(), path.name.lower(), local_name(path, records).lower()):
            return path
    return None


def remove_local(path: Path) -> None:
    """Delete a model file and its entry in the pull index (kept consistent: find_pulled must not
    report a file that is gone; it checks the size, but a stale entry would also keep its name taken)."""
    from .pull import forget_pulled

    path.unlink()
    forget_pulled(path.name, path.parent)
