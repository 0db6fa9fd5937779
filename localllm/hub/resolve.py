"""Turn what a user typed as MODEL into a local file path, downloading it first if they agree.

Order (the first that applies wins):
  1. nothing, or `gemma-3-270m`            -> the default model, assembled from its PyPI package
  2. an existing path                       -> itself (a directory or an unreadable file is an error)
  3. a file in the models directory         -> it (its name with or without .gguf, any case)
  4. a registry name (models/*.toml), or an Ollama name (llama3.2:1b, models/ollama.toml)
                                            -> its Hub file: already pulled, or pulled now
  5. hf.co/USER/REPO[:QUANT], USER/REPO:QUANT -> the same
  6. anything else: a missing path gets "no such file", a name gets the closest known names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from ..errors import LocalLLMError, ModelNotFound, UnsupportedArchitecture
from .default_model import DEFAULT_MODEL_NAME, default_model_path


@dataclass(frozen=True)
class Download:
    """A file that resolution would download: what to ask the user about."""

    name: str  # as the user typed it
    ref: object  # localllm.hub.pull.HubRef
    size_gb: Optional[float]  # from the registry; None for a hub reference we know nothing about

    @property
    def source(self) -> str:
        return str(self.ref)


# allow_pull: None/False = never download; True = download without asking; a callable is asked first.
AllowPull = Union[None, bool, Callable[[Download], bool]]


class DownloadDeclined(LocalLLMError):
    """The user said no to downloading a model (or could not be asked)."""


def is_default(name: Optional[str]) -> bool:
    return name is None or name.strip().lower() == DEFAULT_MODEL_NAME


def resolve_model(name: Optional[str], *, allow_pull: AllowPull = None, progress=None) -> Path:
    """The local .gguf file that `name` means (see the module docstring for the order). `progress` is
    handed to pull (see pull.ProgressFactory) when a download happens."""
    if is_default(name):
        return default_model_path()
    if name.strip().lower().startswith("remote:"):  # remote/config.py's references
        raise ModelNotFound(f"'{name}' is a remote model, and this needs a local .gguf file (remote models work "
                            "with chat, run, bench, embed, show and serve --route)")
    found = resolve_local(name)
    if found is not None:
        return found
    download = _remote(name)
    if download is None:
        raise not_found_error(name)
    return _pull(download, allow_pull, progress)


def resolve_local(name: str) -> Optional[Path]:
    """Steps 2-5 without any download: the file if it is on this machine, None if it would have to be
    pulled. Raises for a directory, an unreadable file, or an unsupported registry model."""
    path = Path(name).expanduser()
    if path.exists():
        return _readable_file(path)
    from .local import find_local

    local = find_local(name)
    if local is not None:
        return local
    download = _remote(name)
    if download is None:
        return None
    from .pull import find_pulled

    return find_pulled(download.ref)


def remote_ref(name: str):
    """The HubRef that `localllm pull NAME` downloads: a registry name's file, or a parsed hub
    reference; None for anything else."""
    download = _remote(name)
    return download.ref if download is not None else None


PULLABLE = (
    "a registry name, hf.co/USER/REPO[:QUANT], USER/REPO:QUANT, a huggingface.co/USER/REPO/blob/REV/FILE.gguf URL "
    "or an Ollama name (llama3.2:1b)"
)


def pull_ref(name: str):
    """What `name` names on the Hub, for `pull` (the CLI's and the server's /api/pull): a registry or
    Ollama name's file (models/*.toml), else a parsed Hub reference. A name close to known ones fails with
    them, as `run` does."""
    from .pull import looks_like_bare_repo

    ref = remote_ref(name)
    if ref is not None:
        return ref
    if looks_like_bare_repo(name):
        raise ModelNotFound(f"'{name}' is not a Hub reference: write hf.co/{name} (or {name}:QUANT)")
    candidates = [] if name.lower().endswith(".gguf") else close_names(name)
    if candidates:
        raise ModelNotFound(f"unknown model '{name}'; did you mean {', '.join(candidates)}?")
    raise ModelNotFound(f"cannot pull '{name}': give {PULLABLE}")


def registry_choice(name: str):
    """The registry entry and quant that `name` means, or None."""
    from .registry import default_registry

    return default_registry().lookup(name)


def _remote(name: str) -> Optional[Download]:
    from .refs import HubRef, parse_hub_ref

    choice = registry_choice(name)
    if choice is not None:
        entry = choice.entry
        if not entry.supported:
            from ..model.archs import ARCHITECTURES

            raise UnsupportedArchitecture(
                f"{choice.name} uses architecture '{entry.arch}', which localllm does not run yet "
                f"(supported: {', '.join(sorted(ARCHITECTURES))})"
            )
        ref = HubRef(repo_id=entry.repo, filename=choice.filename, quant=choice.quant.quant)
        return Download(name, ref, choice.size_gb)
    ref = parse_hub_ref(name)
    if ref is None:
        return None
    from .registry import default_registry

    known = default_registry().by_file(ref.repo_id, ref.filename) if ref.filename else None
    return Download(name, ref, known.size_gb if known else None)


def _pull(download: Download, allow_pull: AllowPull, progress) -> Path:
    from .pull import find_pulled, pull

    found = find_pulled(download.ref)
    if found is not None:
        return found
    if not allow_pull:
        raise ModelNotFound(
            f"'{download.name}' is not downloaded yet: `localllm pull {download.name}` fetches it from {download.source}"
        )
    if callable(allow_pull) and not allow_pull(download):
        raise DownloadDeclined(f"not downloading '{download.name}'")
    return pull(download.ref, progress=progress)


def _readable_file(path: Path) -> Path:
    if path.is_dir():
        raise ModelNotFound(f"{path} is a directory, not a .gguf file")
    if not os.access(path, os.R_OK):
        raise ModelNotFound(f"cannot read {path}: permission denied")
    return path


def _looks_like_path(name: str) -> bool:
    return name.lower().endswith(".gguf") or name.startswith((".", "~", os.sep)) or os.sep in name


def not_found_error(name: str) -> ModelNotFound:
    """The error for a name nothing matches: "no such file" for a path, else the closest names."""
    from .refs import looks_like_bare_repo

    if looks_like_bare_repo(name) and not name.lower().endswith(".gguf"):
        return ModelNotFound(f"no such file: {name} (for a Hub model write hf.co/{name} or {name}:QUANT)")
    if _looks_like_path(name):
        return ModelNotFound(f"no such file: {name}")
    candidates = close_names(name)
    hint = f"; did you mean {', '.join(candidates)}?" if candidates else " (`localllm list` shows local models)"
    return ModelNotFound(f"unknown model '{name}'{hint}")


def close_names(name: str) -> list[str]:
    """Up to three known names closest to `name` (registry, Ollama and the default model's), best first."""
    import difflib

    from .registry import default_registry

    candidates = default_registry().suggest(name)
    if difflib.SequenceMatcher(None, name.strip().lower(), DEFAULT_MODEL_NAME).ratio() >= 0.6:
        candidates = [DEFAULT_MODEL_NAME, *candidates][:3]
    return candidates
