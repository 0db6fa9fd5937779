"""The alias registry: short model names -> a GGUF file on the Hugging Face Hub (data in models/*.toml).

Each `[[model]]` entry names one model (family-size[-variant]) and lists its files, one per quant. The
names a user can type are derived from it (see `_names_of`): for the entry `llama-3.1-8b-instruct` with
alias `llama-3.1-8b` and quants Q4_K_M and Q8_0,

    llama-3.1-8b-instruct, llama-3.1-8b                    -> the entry's default quant
    llama-3.1-8b-instruct-q4_k_m, llama-3.1-8b-q4_k_m     -> that quant
    llama-3.1-8b-instruct-q4, llama-3.1-8b-q4             -> the first listed quant with 4 bits

Lookup ignores case. The TOML files are read once per process, when a name is first looked up.
"""

from __future__ import annotations

import difflib
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import LocalLLMError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

# A name part: lower-case letters, digits, dots; parts joined by single hyphens.
_NAME = re.compile(r"[a-z0-9][a-z0-9.]*(-[a-z0-9][a-z0-9.]*)*")
# llama.cpp's quant names (Q4_K_M, Q8_0, IQ4_XS, F16, BF16 ...); the bit count is the first number.
_QUANT = re.compile(r"(I?Q[1-8](_[0-9A-Z]+)*|F16|BF16|F32)")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_REQUIRED = ("name", "family", "params", "variant", "license", "arch", "repo", "default_quant", "files")


class RegistryError(LocalLLMError):
    """A malformed models/*.toml entry (caught by tests/test_names.py before it ships)."""


@dataclass(frozen=True)
class QuantFile:
    quant: str  # llama.cpp's name, upper case: Q4_K_M
    file: str  # the file name in the repository, spelled as the repository spells it
    size_gb: float  # approximate, 10^9 bytes

    @property
    def bits(self) -> str:
        """'q4' for Q4_K_M, 'q8' for Q8_0, 'f16' for F16: the short suffix a user may type."""
        match = re.match(r"I?Q(\d)", self.quant)
        return f"q{match.group(1)}" if match else self.quant.lower()


@dataclass(frozen=True)
class ModelEntry:
    name: str
    family: str
    params: str
    variant: str
    aliases: tuple[str, ...]
    license: str
    arch: str
    repo: str
    default_quant: str
    files: tuple[QuantFile, ...]
    supported: bool  # False: localllm has no module for `arch` yet
    source: str  # the TOML file it came from, for messages

    def file_for(self, quant: str) -> QuantFile:
        return next(f for f in self.files if f.quant == quant)


@dataclass(frozen=True)
class Choice:
    """One downloadable file: an entry and one of its quants."""

    entry: ModelEntry
    quant: QuantFile

    @property
    def name(self) -> str:
        """The full, honest name: family-size[-variant]-quant, e.g. llama-3.1-8b-instruct-q4_k_m."""
        return f"{self.entry.name}-{self.quant.quant.lower()}"

    @property
    def repo(self) -> str:
        return self.entry.repo

    @property
    def filename(self) -> str:
        return self.quant.file

    @property
    def size_gb(self) -> float:
        return self.quant.size_gb


class Registry:
    def __init__(self, entries: list[ModelEntry]):
        self.entries = entries
        self.names: dict[str, Choice] = {}
        self._by_file: dict[tuple[str, str], Choice] = {}
        for entry in entries:
            for name, choice in _names_of(entry):
                other = self.names.get(name)
                if other is not None and other != choice:
                    raise RegistryError(f"{entry.source}: name '{name}' of {entry.name} is also {other.entry.name}'s")
                self.names[name] = choice
            for quant in entry.files:
                self._by_file[(entry.repo.lower(), quant.file.lower())] = Choice(entry, quant)

    def lookup(self, name: str) -> Choice | None:
        return self.names.get(name.strip().lower())

    def by_file(self, repo: str | None, filename: str) -> Choice | None:
        """The entry whose repository file this is (repo None: any repository with that file name)."""
        if repo is not None:
            return self._by_file.get((repo.lower(), filename.lower()))
        matches = {c for (_, f), c in self._by_file.items() if f == filename.lower()}
        return matches.pop() if len(matches) == 1 else None

    def suggest(self, name: str, n: int = 3) -> list[str]:
        """The registered names closest to `name` (difflib's ratio), best first, one per model."""
        wanted = name.strip().lower()
        close = difflib.get_close_matches(wanted, list(self.names), n=len(self.names), cutoff=0.6)
        seen, picked = set(), []
        for candidate in close:
            entry = self.names[candidate].entry.name
            if entry not in seen:
                seen.add(entry)
                picked.append(candidate)
        return picked[:n]


def _names_of(entry: ModelEntry):
    """(typed name, Choice) pairs for every spelling `entry` answers to (see the module docstring)."""
    default = Choice(entry, entry.file_for(entry.default_quant))
    for base in (entry.name, *entry.aliases):
        yield base, default
        by_bits: dict[str, QuantFile] = {}
        for quant in entry.files:
            yield f"{base}-{quant.quant.lower()}", Choice(entry, quant)
            by_bits.setdefault(quant.bits, quant)
        for bits, quant in by_bits.items():
            if bits != quant.quant.lower():
                yield f"{base}-{bits}", Choice(entry, quant)


# -- loading and validation ----------------------------------------------------------------------------------


def registry_dir() -> Path:
    """models/ inside the installed package (a link to the top-level models/ in a checkout, a copy in a
    wheel); the checkout's own models/ where the link did not survive (git without symlink support)."""
    packaged = Path(__file__).parent / "models"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "models"


@functools.lru_cache(maxsize=None)
def _load_cached(directory: str) -> Registry:
    return load_registry(Path(directory))


def default_registry() -> Registry:
    return _load_cached(str(registry_dir()))


def load_registry(directory: Path) -> Registry:
    files = sorted(directory.glob("*.toml"))
    if not files:
        raise RegistryError(f"no model registry files (*.toml) in {directory}")
    entries = []
    for path in files:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise RegistryError(f"{path}: {exc}") from None
        models = data.get("model", [])
        if not isinstance(models, list) or set(data) - {"model"}:
            raise RegistryError(f"{path}: expected only [[model]] tables")
        entries.extend(_entry(raw, f"{path.name} entry {i + 1}") for i, raw in enumerate(models))
    return Registry(entries)


def _entry(raw: dict, where: str) -> ModelEntry:
    def fail(problem: str):
        raise RegistryError(f"{where}: {problem}")

    if not isinstance(raw, dict):
        fail("not a table")
    missing = [key for key in _REQUIRED if key not in raw]
    unknown = set(raw) - set(_REQUIRED) - {"aliases", "supported"}
    if missing or unknown:
        fail(f"missing {missing}" if missing else f"unknown keys {sorted(unknown)}")
    for key in _REQUIRED[:-1]:
        if not isinstance(raw[key], str):
            fail(f"{key} must be a string")
    name, family, params, variant = raw["name"], raw["family"], raw["params"], raw["variant"]
    if name != "-".join(part for part in (family, params, variant) if part):
        fail(f"name '{name}' must be family-params[-variant]: '{family}-{params}" + (f"-{variant}'" if variant else "'"))
    aliases = raw.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        fail("aliases must be a list of strings")
    for text in (name, *aliases):
        if not _NAME.fullmatch(text):
            fail(f"'{text}' is not a lower-case hyphenated name")
    if not _REPO.fullmatch(raw["repo"]):
        fail(f"repo '{raw['repo']}' is not USER/REPO")
    if not isinstance(raw.get("supported", True), bool):
        fail("supported must be true or false")
    files = tuple(_quant_file(item, fail) for item in _list(raw["files"], fail))
    quants = [f.quant for f in files]
    if not files or len(set(quants)) != len(quants):
        fail("files must list each quant once")
    if raw["default_quant"] not in quants:
        fail(f"default_quant {raw['default_quant']} is not among the files ({', '.join(quants)})")
    return ModelEntry(
        name=name, family=family, params=params, variant=variant, aliases=tuple(aliases),
        license=raw["license"], arch=raw["arch"], repo=raw["repo"], default_quant=raw["default_quant"],
        files=files, supported=raw.get("supported", True), source=where,
    )


def _list(value, fail) -> list:
    if not isinstance(value, list):
        fail("files must be a list of {quant, file, size_gb}")
    return value


def _quant_file(item, fail) -> QuantFile:
    if not isinstance(item, dict) or set(item) != {"quant", "file", "size_gb"}:
        fail(f"each file needs exactly quant, file, size_gb: {item!r}")
    quant, file, size = item["quant"], item["file"], item["size_gb"]
    if not isinstance(quant, str) or not _QUANT.fullmatch(quant):
        fail(f"quant {quant!r} is not a llama.cpp quant name (Q4_K_M, Q8_0, F16 ...)")
    if not isinstance(file, str) or not file.endswith(".gguf") or "/" in file:
        fail(f"file {file!r} must be a .gguf file name")
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size < 1000:
        fail(f"size_gb {size!r} must be a number of GB")
    return QuantFile(quant, file, float(size))
