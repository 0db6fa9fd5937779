"""What a user types for a Hub model, and which file of a repository it means.

`parse_hub_ref` turns 'hf.co/USER/REPO[:QUANT]', 'USER/REPO:QUANT' or a file URL into a `HubRef`;
`choose_file` picks the repository file a ref means among the repo's paths (by exact name, or by the quant
matched as a whole token of the GGUF names). No network here: `pull.py` asks the Hub for the paths.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from ..errors import ModelNotFound, UnsupportedModelFile

DEFAULT_QUANT = "Q4_K_M"  # picked when a repo has several GGUFs and none was asked for (as Ollama does)


# --- references -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubRef:
    repo_id: str  # "USER/REPO"
    filename: str | None = None  # exact GGUF path in the repo, when known (aliases know it)
    quant: str | None = None  # e.g. "Q4_K_M", matched case-insensitively when filename is None
    revision: str | None = None  # None = the default branch

    def __str__(self) -> str:
        if self.filename:
            return f"hf.co/{self.repo_id}/{self.filename}"
        return f"hf.co/{self.repo_id}" + (f":{self.quant}" if self.quant else "")


_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO = rf"(?P<repo>{_NAME}/{_NAME})"
_QUANT = r"(?::(?P<quant>[A-Za-z0-9][A-Za-z0-9._-]*))"
_HOST = r"(?:https?://)?(?:www\.)?(?:hf\.co|huggingface\.co)/"
_HOSTED_REF = re.compile(rf"{_HOST}{_REPO}{_QUANT}?/?")
_FILE_URL = re.compile(rf"{_HOST}{_REPO}/(?:blob|resolve)/(?P<rev>[^/]+)/(?P<file>[^?#]+\.gguf)(?:\?.*)?", re.I)
_SHORT_REF = re.compile(rf"{_REPO}{_QUANT}")


def parse_hub_ref(text: str) -> HubRef | None:
    """A Hub reference, or None when `text` is not one (a local path, an alias name).

    Accepted: hf.co/USER/REPO[:QUANT], huggingface.co/USER/REPO[:QUANT] (with or without https://),
    USER/REPO:QUANT, and a file's URL https://huggingface.co/USER/REPO/(blob|resolve)/REV/FILE.gguf.
    A bare USER/REPO is not one: it is also what a relative directory path looks like (Ollama asks for
    hf.co/ there too). ':latest' means no quant (Ollama's spelling of the default).
    """
    text = text.strip()
    if match := _FILE_URL.fullmatch(text):
        return HubRef(match["repo"], filename=unquote(match["file"]), revision=unquote(match["rev"]))
    match = _HOSTED_REF.fullmatch(text) or _SHORT_REF.fullmatch(text)
    if match is None:
        return None
    quant = match["quant"]
    return HubRef(match["repo"], quant=None if quant is None or quant.lower() == "latest" else quant)


def looks_like_bare_repo(text: str) -> bool:
    """USER/REPO without hf.co/ or a quant: not a reference, but worth a hint."""
    return re.fullmatch(_REPO, text.strip()) is not None


# --- choosing the file in a repository --------------------------------------------------------------------

_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)
_QUANT_NAME = re.compile(r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q\d[A-Z0-9_]*|TQ\d_\d|B?F16|F32|MXFP4[A-Z0-9_]*))(?![A-Za-z0-9])", re.I)


def _stem(path: str) -> str:
    """The file path without .gguf and without a split suffix."""
    return _SPLIT.sub("", path) if _SPLIT.search(path) else path[: -len(".gguf")]


def quant_matches(path: str, quant: str) -> bool:
    """QUANT appears in the GGUF path as a whole token, any case: Q4_K matches x-Q4_K.gguf, not x-Q4_K_M.gguf.

    Left of it any non-alphanumeric may stand (model_q8_0.gguf is common); right of it only the end, '-',
    '.' or '/', since '_' continues a quant name.
    """
    pattern = rf"(?<![A-Za-z0-9]){re.escape(quant)}(?=$|[-./])"
    return re.search(pattern, _stem(path), re.I) is not None


def _quant_label(path: str) -> str:
    found = _QUANT_NAME.findall(_stem(Path(path).name))
    return found[-1].upper() if found else Path(_stem(path)).name


def _model_files(paths: list[str]) -> list[str]:
    """GGUF models in a repo listing: whole files plus the first part of each split set; not projectors."""
    files = []
    for path in paths:
        if not path.lower().endswith(".gguf") or "mmproj" in Path(path).name.lower():
            continue
        split = _SPLIT.search(path)
        if split is None or split[1] == "00001":
            files.append(path)
    return sorted(files)


def _check_supported(path: str) -> None:
    if _SPLIT.search(path):
        raise UnsupportedModelFile(f"{path} is a split GGUF (several -0000N-of-0000M parts): not supported yet")
    if not path.lower().endswith(".gguf"):
        raise UnsupportedModelFile(f"{path} is not a .gguf file")


def choose_file(ref: HubRef, paths: list[str]) -> str:
    """The repo path `ref` means, among the repo's `paths`; errors list what the repo has."""
    if ref.filename is not None:
        if ref.filename not in paths:
            raise ModelNotFound(f"{ref.repo_id} has no file {ref.filename}")
        _check_supported(ref.filename)
        return ref.filename
    models = _model_files(paths)
    if not models:
        raise ModelNotFound(f"{ref.repo_id} has no GGUF files")
    available = ", ".join(dict.fromkeys(_quant_label(p) for p in models))
    if ref.quant is not None:
        found = [p for p in models if quant_matches(p, ref.quant)]
        if not found:
            raise ModelNotFound(f"{ref.repo_id} has no {ref.quant} GGUF; available: {available}")
    elif len(models) == 1:
        found = models
    else:
        found = [p for p in models if quant_matches(p, DEFAULT_QUANT)]
        if len(found) != 1:
            raise ModelNotFound(
                f"{ref.repo_id} has several GGUF files; name one as hf.co/{ref.repo_id}:QUANT, QUANT one of: {available}"
            )
    if len(found) > 1:
        raise ModelNotFound(f"{ref} matches several files ({', '.join(found)}); give the file name")
    _check_supported(found[0])
    return found[0]
