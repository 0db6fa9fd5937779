"""The alias registry: short model names -> a GGUF file on the Hugging Face Hub (data in models/*.toml).

Each `[[model]]` entry names one model (family-size[-variant]) and lists its files, one per quant. The
names a user can type are derived from it (see `_names_of`): for the entry `llama-3.1-8b-instruct` with
alias `llama-3.1-8b` and quants Q4_K_M and Q8_0,

    llama-3.1-8b-instruct, llama-3.1-8b                    -> the entry's default quant
    llama-3.1-8b-instruct-q4_k_m, llama-3.1-8b-q4_k_m     -> that quant
    llama-3.1-8b-instruct-q4, llama-3.1-8b-q4             -> the first listed quant with 4 bits

Ollama's library names (models/ollama.toml, see `_ollama_names_of`) are typed names too: `llama3.2:1b`,
`llama3.2` (its `latest` tag), `llama3.2:1b-instruct-q8_0` (a quant the entry lists).

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
# An Ollama model name or tag as models/ollama.toml spells them: lower case (Ollama's own are).
_OLLAMA_WORD = re.compile(r"[a-z0-9][a-z0-9._-]*")
OLLAMA_FILE = "ollama.toml"  # not [[model]] entries: Ollama's names for them
_REQUIRED = ("name", "family", "params", "variant", "license", "arch", "repo", "default_quant", "files")


class RegistryError(LocalLLMError):
    """A malformed models/*.toml entry (caught by tests/hub/test_names.py before it ships)."""


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


@dataclass(frozen=True)
class OllamaModel:
    """One model of Ollama's library and the registry entry each of its tags means."""

    name: str  # as Ollama's library names it: "llama3.2"
    latest: str | None  # the tag the bare name means ("3b"); None: the bare name means no entry here
    tags: dict  # tag -> entry name: {"1b": "llama-3.2-1b-instruct", "3b": "llama-3.2-3b-instruct"}
    source: str  # for messages


class Registry:
    def __init__(self, entries: list[ModelEntry], ollama: list[OllamaModel] = ()):
        self.entries = entries
        self.ollama = list(ollama)
        self.names: dict[str, Choice] = {}
        self._by_file: dict[tuple[str, str], Choice] = {}
        for entry in entries:
            for name, choice in _names_of(entry):
                self._claim(name, choice, entry.source, entry.name)
            for quant in entry.files:
                self._by_file[(entry.repo.lower(), quant.file.lower())] = Choice(entry, quant)
        by_name = {entry.name: entry for entry in entries}
        for model in self.ollama:
            for name, choice in _ollama_names_of(model, by_name):
                self._claim(name, choice, model.source, f"Ollama's {model.name}")

    def _claim(self, name: str, choice: Choice, source: str, claimant: str) -> None:
        """Register a typed name; a name two different files answer to is an error in the data."""
        other = self.names.get(name)
        if other is not None and other != choice:
            raise RegistryError(f"{source}: name '{name}' of {claimant} is also {other.entry.name}'s")
        self.names[name] = choice

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


def _ollama_names_of(model: OllamaModel, entries: dict[str, ModelEntry]):
    """(typed name, Choice) pairs for an Ollama model: NAME:TAG and NAME:TAG-QUANT for each tag (QUANT as
    Ollama spells it, any case: q4_K_M, q8_0, fp16), and NAME, NAME:latest for its `latest` tag."""
    for tag, entry_name in model.tags.items():
        entry = entries[entry_name]
        yield f"{model.name}:{tag}", Choice(entry, entry.file_for(entry.default_quant))
        for quant in entry.files:
            for spelling in _ollama_quant_spellings(quant.quant):
                yield f"{model.name}:{tag}-{spelling}", Choice(entry, quant)
    if model.latest is not None:
        entry = entries[model.tags[model.latest]]
        default = Choice(entry, entry.file_for(entry.default_quant))
        yield model.name, default
        yield f"{model.name}:latest", default


def _ollama_quant_spellings(quant: str) -> tuple[str, ...]:
    """Ollama writes llama.cpp's quant names in its tags as q4_K_M, q8_0, and F16 as fp16."""
    return (quant.lower(), "fp16") if quant == "F16" else (quant.lower(),)


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
    files = sorted(path for path in directory.glob("*.toml") if path.name != OLLAMA_FILE)
    if not files:
        raise RegistryError(f"no model registry files (*.toml) in {directory}")
    entries = []
    for path in files:
        data = _read_toml(path)
        models = data.get("model", [])
        if not isinstance(models, list) or set(data) - {"model"}:
            raise RegistryError(f"{path}: expected only [[model]] tables")
        entries.extend(_entry(raw, f"{path.name} entry {i + 1}") for i, raw in enumerate(models))
    ollama_path = directory / OLLAMA_FILE
    ollama = _ollama_models(ollama_path, {e.name for e in entries}) if ollama_path.is_file() else []
    return Registry(entries, ollama)


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RegistryError(f"{path}: {exc}") from None


def _ollama_models(path: Path, entry_names: set[str]) -> list[OllamaModel]:
    """models/ollama.toml: one table per Ollama model, tag = "entry name", plus `latest` = "tag"."""
    models = []
    for name, raw in _read_toml(path).items():
        where = f"{path.name} [{name}]"
        if not _OLLAMA_WORD.fullmatch(name) or not isinstance(raw, dict):
            raise RegistryError(f"{where}: expected a table named as Ollama names the model (lower case)")
        tags = {tag: value for tag, value in raw.items() if tag != "latest"}
        for tag, value in tags.items():
            if not _OLLAMA_WORD.fullmatch(tag):
                raise RegistryError(f"{where}: tag '{tag}' is not a lower-case Ollama tag")
            if not isinstance(value, str) or value not in entry_names:
                raise RegistryError(f"{where}: {name}:{tag} names {value!r}, which is no entry of models/*.toml")
        latest = raw.get("latest")
        if not tags or (latest is not None and (not isinstance(latest, str) or latest not in tags)):
            raise RegistryError(f"{where}: `latest` must name one of its tags ({', '.join(tags) or 'none given'})")
        models.append(OllamaModel(name=name, latest=latest, tags=tags, source=where))
    return models


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
