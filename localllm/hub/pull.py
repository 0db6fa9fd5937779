"""`pull`: download a GGUF file from the Hugging Face Hub into the models directory.

The steps, one function each:
  1. `parse_hub_ref` turns what a user typed into a `HubRef`;
  2. `remote_file` asks the Hub for the repository's files with their sizes and LFS SHA-256s (one
     /api/models call) and picks the file: by exact name, or by quant matched against the GGUF names;
  3. the local name is the repo file's base name (readable, e.g. Llama-3.2-1B-Instruct-Q4_K_M.gguf),
     prefixed with the repository when a file from another source already has that name;
  4. free disk space is checked against the bytes still to fetch;
  5. the bytes go to <models>/.partial/<sha256>.part through huggingface_hub's `http_get`, appended to what
     an interrupted pull left there (a Range request), so a pull resumes where it stopped;
  6. the staged file is hashed; only if it matches the Hub's LFS SHA-256 is it renamed to its final name,
     and its source recorded in <models>/.pulls.json (which `find_pulled` reads without the network).

Why not `hf_hub_download(local_dir=...)`: in huggingface_hub 2.4 it downloads to a temporary name unique to
each process and deletes it on any failure, so an interrupted download starts again from zero. `http_get`
is the same library's downloader (Range requests, retries on dropped connections, tqdm progress hook); only
the staging file is ours. It also means plain HTTP even for Xet-stored files (the Hub serves them over a
redirect), trading Xet's speed for resumability.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator, Protocol

from ..errors import (
    ChecksumMismatch,
    InsufficientDiskSpace,
    LocalLLMError,
    ModelNotFound,
    NetworkError,
    Unauthorized,
    UnsupportedModelFile,
)
from .refs import (  # noqa: F401 - re-exported: pull's public API
    DEFAULT_QUANT,
    HubRef,
    choose_file,
    looks_like_bare_repo,
    parse_hub_ref,
    quant_matches,
)
from .store import models_dir

try:  # advisory locks keep two pulls of one file from appending to the same staging file
    import fcntl
except ImportError:  # pragma: no cover - Windows: no locking
    fcntl = None

DEFAULT_ENDPOINT = "https://huggingface.co"
PARTIAL_DIR = ".partial"  # hidden: never listed as a model
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")  # an LFS object id: it names the staging file
_REPO_ID = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*")  # the Hub's rule, roughly


class PullError(LocalLLMError):
    """The Hub's answer cannot be used as it stands (e.g. an LFS object id that is not a SHA-256)."""
INDEX_NAME = ".pulls.json"


# --- what the Hub says ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteFile:
    repo_id: str
    filename: str  # path in the repo
    commit: str  # the commit the metadata was read at; the download is pinned to it
    sha256: str  # the LFS object id
    size: int  # bytes


def hub_endpoint() -> str:
    """$HF_ENDPOINT read now (huggingface_hub reads it once, at import)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def remote_file(ref: HubRef, *, endpoint: str, token: str | None = None) -> RemoteFile:
    """Name, size and SHA-256 of the file `ref` means, from one /api/models/REPO?blobs=true request."""
    from huggingface_hub import HfApi

    info = HfApi(endpoint=endpoint, token=token, library_name="localllm").model_info(
        ref.repo_id, revision=ref.revision, files_metadata=True
    )
    siblings = {s.rfilename: s for s in info.siblings or []}
    path = choose_file(ref, list(siblings))
    lfs = siblings[path].lfs
    if lfs is None:  # GGUFs are LFS objects on the Hub; a plain git blob has no SHA-256 to check against
        raise UnsupportedModelFile(f"{ref.repo_id}/{path} is not stored with Git LFS: no SHA-256 to verify it by")
    sha256 = _checked_sha256(lfs.sha256, f"{ref.repo_id}/{path}")
    repo_id = _checked_names(info.id or ref.repo_id, path)
    return RemoteFile(repo_id, path, info.sha or ref.revision or "main", sha256, lfs.size)


def _checked_names(repo_id: object, path: str) -> str:
    """The Hub's repository id, if it and the file's name can become a local file name and be printed:
    [user/]name of letters, digits and . _ -, and a printable base name that is not empty or dots only.
    Else a PullError (a hostile endpoint could answer "../x" or terminal escapes)."""
    if not isinstance(repo_id, str) or not _REPO_ID.fullmatch(repo_id):
        raise PullError(f"the Hub answered with the repository id {repo_id!r:.80}, which is not [user/]name; not pulling")
    if not path.isprintable() or not Path(path).name.lstrip("."):
        raise PullError(f"{repo_id} has a file named {path!r:.120}, which cannot be a local file name; not pulling it")
    return repo_id


def _checked_sha256(value: object, what: str) -> str:
    """The Hub's LFS SHA-256 of `what`, lower-case, if it is exactly 64 hex digits. It becomes a file name
    under <models>/.partial, so anything else ("../../outside/victim") is refused before any use."""
    if not isinstance(value, str) or not _SHA256_HEX.fullmatch(value):
        raise PullError(f"the Hub gave {what} the SHA-256 {value!r:.80}, which is not 64 hex digits; not pulling it")
    return value.lower()


# --- the record of what was pulled ------------------------------------------------------------------------


@dataclass(frozen=True)
class PullRecord:
    repo_id: str
    filename: str  # path in the repo
    revision: str | None  # as asked (None: the default branch)
    commit: str  # as resolved when pulled
    sha256: str
    size: int
    pulled_at: str  # ISO 8601, UTC


def pulled_records(directory: Path | None = None) -> dict[str, PullRecord]:
    """Local file name -> where it was pulled from. A missing or unreadable index is an empty one."""
    path = (directory or models_dir()) / INDEX_NAME
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
        return {name: PullRecord(**fields) for name, fields in files.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _write_record(directory: Path, name: str, record: PullRecord | None) -> None:
    """Set (None: drop) one entry of the index: rewritten under a temporary name, then renamed."""
    with _locked(directory / PARTIAL_DIR / "index.lock", wait=True):
        records = pulled_records(directory)
        if record is None and records.pop(name, None) is None:
            return
        if record is not None:
            records[name] = record
        tmp = directory / f"{INDEX_NAME}.{os.getpid()}.tmp"
        payload = {"version": 1, "files": {n: asdict(r) for n, r in sorted(records.items())}}
        tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, directory / INDEX_NAME)


def forget_pulled(name: str, directory: Path | None = None) -> None:
    """Drop the index entry of the file `name` (for `rm`; the file itself is the caller's to delete)."""
    _write_record(directory or models_dir(), name, None)


def _is_complete(path: Path, record: PullRecord) -> bool:
    return path.is_file() and path.stat().st_size == record.size


def _same_source(ref: HubRef, record: PullRecord) -> bool:
    if record.repo_id.lower() != ref.repo_id.lower():
        return False
    if ref.revision is not None and ref.revision not in (record.revision, record.commit):
        if not (len(ref.revision) >= 7 and record.commit.startswith(ref.revision.lower())):
            return False
    if ref.filename is not None:
        return record.filename == ref.filename
    return ref.quant is None or quant_matches(record.filename, ref.quant)


def find_pulled(ref: HubRef, directory: Path | None = None) -> Path | None:
    """The complete local file already pulled for `ref`, from the index alone (no network).

    With neither file nor quant in `ref`, the repo's only pulled file, or its Q4_K_M one (what `pull`
    would pick); several candidates and no Q4_K_M is None, as is a file whose size is not the recorded one.
    """
    directory = directory or models_dir()
    found = [
        (record.pulled_at, directory / name)
        for name, record in pulled_records(directory).items()
        if _same_source(ref, record) and _is_complete(directory / name, record)
    ]
    if len(found) > 1 and ref.filename is None and ref.quant is None:
        found = [(when, path) for when, path in found if quant_matches(path.name, DEFAULT_QUANT)]
        if len(found) > 1:
            return None
    return max(found)[1] if found else None


def _local_name(remote: RemoteFile, records: dict[str, PullRecord], directory: Path) -> str:
    """The repo file's base name; the repository-prefixed one if another source's file has that name."""
    base = Path(remote.filename).name.lstrip(".")
    for name in (base, f"{remote.repo_id.replace('/', '--')}--{base}"):
        record = records.get(name)
        if record and record.repo_id.lower() == remote.repo_id.lower() and record.filename == remote.filename:
            return name
        if not (directory / name).exists():
            return name
    raise LocalLLMError(f"{directory / base} already exists and was not pulled from {remote.repo_id}; move it away")


# --- progress ---------------------------------------------------------------------------------------------


class ProgressBar(Protocol):
    def update(self, n: int) -> None: ...  # n more bytes done (negative: a restarted transfer)

    def close(self) -> None: ...


ProgressFactory = Callable[[str, int, int], ProgressBar]
"""progress(description, total_bytes, bytes_already_done) -> a bar; one for the download, one for the check."""


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _no_progress(description: str, total: int, done: int) -> ProgressBar:
    return _NoProgress()


def _tqdm_bridge(progress: ProgressFactory, description: str):
    """A tqdm class for huggingface_hub's `tqdm_class` hook that draws nothing and forwards to `progress`."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class Bridge(hf_tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True  # tqdm itself stays silent: the library never prints
            super().__init__(*args, **kwargs)
            self._bar = progress(description, kwargs.get("total") or 0, kwargs.get("initial") or 0)

        def update(self, n=1):
            self._bar.update(n)

        def close(self):
            bar, self._bar = getattr(self, "_bar", None), None
            if bar is not None:
                bar.close()
            super().close()

    return Bridge


# --- the download -----------------------------------------------------------------------------------------


def free_disk_bytes(directory: Path) -> int:
    """Free bytes on the file system holding `directory` (the tests replace it to simulate a full disk)."""
    return shutil.disk_usage(directory).free


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@contextmanager
def _locked(path: Path, *, wait: bool) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if needed) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        if fcntl is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                raise LocalLLMError(f"another localllm pull is writing {path.with_suffix('.part')}; wait for it") from None
        yield


@contextmanager
def _hub_errors(ref: HubRef, endpoint: str, resume_hint: Callable[[], str] | None = None) -> Iterator[None]:
    """huggingface_hub's and the HTTP client's exceptions -> our typed errors, one line each.

    `resume_hint` (during a download) says, when the error happens, how much is kept for the next run.
    """
    import httpx2
    from huggingface_hub import errors as hf

    def hint() -> str:
        return resume_hint() if resume_hint else ""

    token_hint = "set HF_TOKEN to a Hugging Face access token that has access (huggingface.co/settings/tokens)"
    try:
        yield
    except hf.GatedRepoError:
        raise Unauthorized(f"{ref.repo_id} is a gated repository: accept its terms on the Hub, then {token_hint}") from None
    except hf.RepositoryNotFoundError:
        raise ModelNotFound(f"repository {ref.repo_id} not found on {endpoint} (if it is private, {token_hint})") from None
    except hf.RevisionNotFoundError:
        raise ModelNotFound(f"revision {ref.revision} not found in {ref.repo_id}") from None
    except hf.RemoteEntryNotFoundError:
        raise ModelNotFound(f"{ref} not found on {endpoint}") from None
    except hf.OfflineModeIsEnabled:
        raise NetworkError(f"HF_HUB_OFFLINE is set: cannot reach {endpoint}{hint()}") from None
    except hf.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            raise Unauthorized(f"the Hub refused access to {ref.repo_id} (HTTP {status}): {token_hint}") from None
        if status == 404:
            raise ModelNotFound(f"{ref} not found on {endpoint}") from None
        raise NetworkError(f"the Hub answered HTTP {status} for {ref}{hint() or '; try again later'}") from None
    except httpx2.HTTPError as exc:
        raise NetworkError(f"connection to {endpoint} failed ({_one_line(exc)}){hint()}") from None


def pull(
    ref: HubRef, *, directory: Path | None = None, token: str | None = None, progress: ProgressFactory | None = None
) -> Path:
    """Download the GGUF `ref` means (or find it already complete) and return models_dir()/<readable name>.gguf.

    `token` None means huggingface_hub's own (HF_TOKEN, or `hf auth login`). `progress` receives the
    download and the checksum pass; without it nothing is shown.
    """
    directory = Path(directory) if directory is not None else models_dir()
    endpoint = hub_endpoint()
    progress = progress or _no_progress
    with _hub_errors(ref, endpoint):
        remote = remote_file(ref, endpoint=endpoint, token=token)
    directory.mkdir(parents=True, exist_ok=True)
    name = _local_name(remote, pulled_records(directory), directory)
    target = directory / name
    if _up_to_date(directory, name, remote):
        return target
    staged = directory / PARTIAL_DIR / f"{remote.sha256}.part"
    with _locked(staged.with_suffix(".lock"), wait=False):
        if _up_to_date(directory, name, remote):  # another pull finished it while we looked
            return target
        _check_disk_space(directory, remote, staged)
        _download(ref, remote, staged, endpoint=endpoint, token=token, progress=progress, name=name)
        _verify(staged, remote, progress, name)
        os.replace(staged, target)  # same directory tree, so an atomic rename
        record = PullRecord(
            remote.repo_id, remote.filename, ref.revision, remote.commit, remote.sha256, remote.size,
            datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        _write_record(directory, name, record)
    staged.with_suffix(".lock").unlink(missing_ok=True)
    return target


def _up_to_date(directory: Path, name: str, remote: RemoteFile) -> bool:
    """Already pulled with the Hub's current hash: trust the index and the size (hashing GBs costs seconds)."""
    record = pulled_records(directory).get(name)
    return record is not None and record.sha256 == remote.sha256 and _is_complete(directory / name, record)


def _staged_bytes(staged: Path) -> int:
    return staged.stat().st_size if staged.exists() else 0


def _check_disk_space(directory: Path, remote: RemoteFile, staged: Path) -> None:
    needed = remote.size - _staged_bytes(staged)
    free = free_disk_bytes(directory)
    if free < needed:
        raise InsufficientDiskSpace(
            f"{Path(remote.filename).name} needs {_human(needed)} more but {directory} has {_human(free)} free"
        )


def _download(ref, remote, staged: Path, *, endpoint: str, token, progress: ProgressFactory, name: str) -> None:
    """Append the missing bytes of the file to `staged` (a Range request when part of it is there)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    done = _staged_bytes(staged)
    if done > remote.size:  # not a prefix of this file: start again
        staged.unlink()
        done = 0
    url = hf_hub_url(remote.repo_id, remote.filename, revision=remote.commit, endpoint=endpoint)
    headers = build_hf_headers(token=token, library_name="localllm")

    def resume_hint() -> str:
        return f"; {_human(_staged_bytes(staged))} of {_human(remote.size)} kept, run the same pull again to resume"

    try:
        with _hub_errors(ref, endpoint, resume_hint), open(staged, "ab") as out:  # 0666 & ~umask
            http_get(
                url, out, resume_size=done, headers=headers, expected_size=remote.size,
                displayed_filename=name, tqdm_class=_tqdm_bridge(progress, f"pulling {name}"),
            )
    except OSError as exc:  # HfHubHTTPError is an OSError too, but _hub_errors has translated those already
        if exc.errno == errno.ENOSPC:
            raise InsufficientDiskSpace(f"disk full while writing {staged}{resume_hint()}") from None
        if exc.errno is None:  # huggingface_hub's own, e.g. "Consistency check failed": a short transfer
            raise NetworkError(f"download of {name} broke off ({_one_line(exc)}){resume_hint()}") from None
        raise


def sha256_file(path: Path, progress: ProgressFactory | None = None, description: str = "") -> str:
    digest = hashlib.sha256()
    bar = (progress or _no_progress)(description, path.stat().st_size, 0)
    try:
        with open(path, "rb") as handle:
            while block := handle.read(1 << 22):
                digest.update(block)
                bar.update(len(block))
    finally:
        bar.close()
    return digest.hexdigest()


def _verify(staged: Path, remote: RemoteFile, progress: ProgressFactory, name: str) -> None:
    """The staged file must hash to the Hub's LFS SHA-256; if not it is deleted (no resuming from bad bytes)."""
    actual = sha256_file(staged, progress, f"checking {name}")
    if actual != remote.sha256:
        staged.unlink(missing_ok=True)
        raise ChecksumMismatch(
            f"{remote.repo_id}/{remote.filename}: downloaded sha256 {actual} differs from the Hub's {remote.sha256};"
            " the download was deleted, run the pull again"
        )
