"""The config file (runtime.config_path: $XDG_CONFIG_HOME/localllm/config.toml) and `remote:` references.

    [remotes.gpu]                         # `remote:gpu`
    url = "http://gpu-box:8000/v1"        # the engine's OpenAI base URL
    model = "meta-llama/Llama-3.1-8B-Instruct"   # the name it serves the model under (default: its first)
    api_key_env = "GPU_BOX_KEY"           # the API key is read from this variable, never from the file
    engine = "vllm"                       # optional: vllm, llama.cpp, tgi, localllm, openai (default: asked)
    timeout = 600                         # seconds a request may wait for the next byte

    [[routes]]                            # ordered: the first whose `model` matches a name is used
    model = "llama-3.1-8b"                # a name as typed (any case), or a glob: "llama-*"
    use = "llama-3.1-8b-instruct-q4_k_m"  # a local name or path, `remote:NAME` or `remote:URL#MODEL`
    fallback = ["remote:gpu"]             # tried in order when `use` does not fit in memory, is not on this
                                          # machine, or is a remote that cannot be reached

A reference written inline, `remote:http://host:8000/v1#MODEL` (`#MODEL` optional), needs no file; its key
comes from LOCALLLM_REMOTE_API_KEY.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from ..errors import LocalLLMError

PREFIX = "remote:"
INLINE_KEY_ENV = "LOCALLLM_REMOTE_API_KEY"
# What a remote is told apart by: the extensions of the OpenAI API it takes (model.py's EXTENSIONS).
ENGINES = ("vllm", "llama.cpp", "tgi", "localllm", "openai")
DEFAULT_TIMEOUT = 600.0

REMOTE_KEYS = {"url", "model", "api_key_env", "engine", "timeout"}
ROUTE_KEYS = {"model", "use", "fallback"}


class ConfigError(LocalLLMError):
    """The config file cannot be read or says something localllm cannot use (one line naming the file)."""


@dataclass(frozen=True)
class Remote:
    """An engine serving a model over the OpenAI API."""

    name: str  # the config's name, or the URL of an inline reference
    url: str  # the base URL, ending in the API's prefix (/v1), no trailing slash
    model: Optional[str] = None  # the engine's name for the model; None: the first it lists
    api_key_env: Optional[str] = None  # the environment variable holding the API key
    engine: Optional[str] = None  # one of ENGINES; None: told by the engine's /models answer
    timeout: float = DEFAULT_TIMEOUT

    @property
    def label(self) -> str:
        """How messages name it: remote:gpu, or remote:http://host:8000/v1#model."""
        if self.name != self.url:
            return PREFIX + self.name
        return PREFIX + self.url + (f"#{self.model}" if self.model else "")

    def api_key(self) -> Optional[str]:
        from ..runtime import secret

        return secret(self.api_key_env) if self.api_key_env else None

    def with_model(self, model: Optional[str]) -> "Remote":
        from dataclasses import replace

        return replace(self, model=model) if model else self


@dataclass(frozen=True)
class Route:
    pattern: str  # lower case; may be a glob
    targets: tuple  # references, tried in order

    def matches(self, name: str) -> bool:
        name = name.strip().lower()
        return name == self.pattern or fnmatch.fnmatchcase(name, self.pattern)


@dataclass
class RemoteConfig:
    path: Optional[Path] = None
    remotes: dict = field(default_factory=dict)  # name -> Remote
    routes: list = field(default_factory=list)  # Route, in the file's order

    def route_for(self, name: str) -> Optional[Route]:
        return next((r for r in self.routes if r.matches(name)), None)

    def remote(self, reference: str) -> Remote:
        """The Remote of `remote:NAME` or `remote:URL[#MODEL]`; ConfigError for an unknown name."""
        return parse_reference(reference, self)


def is_remote_reference(name) -> bool:
    return isinstance(name, str) and name.strip().lower().startswith(PREFIX)


def parse_reference(reference: str, config: Optional[RemoteConfig] = None) -> Remote:
    """`remote:NAME[#MODEL]` (a config entry; #MODEL overrides its model) or `remote:URL[#MODEL]`."""
    body = reference.strip()[len(PREFIX):]
    target, _, model = body.partition("#")
    if "://" in target:
        url = _base_url(target, reference)
        return Remote(name=url, url=url, model=model or None, api_key_env=INLINE_KEY_ENV)
    config = config if config is not None else load_config()
    remote = config.remotes.get(target)
    if remote is None:
        known = ", ".join(PREFIX + n for n in config.remotes) or "none"
        where = config.path or "the config file"
        raise ConfigError(f"unknown remote '{target}' in {reference!r} (remotes in {where}: {known})")
    return remote.with_model(model or None)


def _base_url(text: str, where: str) -> str:
    """An http(s) URL without a trailing slash; a bare host gets the API's usual prefix /v1."""
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{where}: '{text}' is not an http:// or https:// URL")
    path = parts.path.rstrip("/") or "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


def load_config(path: Optional[Path] = None) -> RemoteConfig:
    """The config file at `path` (default: runtime.config_path()); a missing file is an empty config."""
    if path is None:
        from ..runtime import config_path

        path = config_path()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return RemoteConfig(path=path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return _parse(data, path)


def _parse(data: dict, path: Path) -> RemoteConfig:
    unknown = set(data) - {"remotes", "routes"}
    if unknown:
        raise ConfigError(f"{path}: unknown section {sorted(unknown)[0]!r} (sections: remotes, routes)")
    remotes_table = data.get("remotes", {})
    if not isinstance(remotes_table, dict):
        raise ConfigError(f"{path}: 'remotes' must be a table of [remotes.NAME] entries")
    config = RemoteConfig(path=path)
    for name, entry in remotes_table.items():
        config.remotes[name] = _remote(name, entry, path)
    routes = data.get("routes", [])
    if not isinstance(routes, list):
        raise ConfigError(f"{path}: 'routes' must be an array of [[routes]] entries")
    for index, entry in enumerate(routes):
        config.routes.append(_route(index, entry, path, config))
    return config


def _remote(name: str, entry, path: Path) -> Remote:
    where = f"{path}: [remotes.{name}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a table")
    if "api_key" in entry:
        raise ConfigError(f"{where}: put the API key in an environment variable and name it with api_key_env, "
                          "not in the file")
    unknown = set(entry) - REMOTE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r} (keys: {', '.join(sorted(REMOTE_KEYS))})")
    if not name or any(c in name for c in "#:/ "):
        raise ConfigError(f"{where}: a remote's name may not contain '#', ':', '/' or spaces")
    url = entry.get("url")
    if not isinstance(url, str):
        raise ConfigError(f"{where}: 'url' (the engine's base URL, e.g. http://host:8000/v1) is required")
    for key in ("model", "api_key_env"):
        if key in entry and not (isinstance(entry[key], str) and entry[key]):
            raise ConfigError(f"{where}: '{key}' must be a non-empty string")
    engine = entry.get("engine")
    if engine is not None and engine not in ENGINES:
        raise ConfigError(f"{where}: 'engine' must be one of {', '.join(ENGINES)}, got {engine!r}")
    timeout = entry.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError(f"{where}: 'timeout' must be a number of seconds > 0")
    return Remote(name=name, url=_base_url(url, where), model=entry.get("model"), api_key_env=entry.get("api_key_env"),
                  engine=engine, timeout=float(timeout))


def _route(index: int, entry, path: Path, config: RemoteConfig) -> Route:
    where = f"{path}: routes[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = set(entry) - ROUTE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r} (keys: model, use, fallback)")
    pattern, use = entry.get("model"), entry.get("use")
    if not (isinstance(pattern, str) and pattern.strip()):
        raise ConfigError(f"{where}: 'model' (the name the route answers for) is required")
    if not (isinstance(use, str) and use.strip()):
        raise ConfigError(f"{where}: 'use' (a local model or remote:NAME) is required")
    fallback = entry.get("fallback", [])
    fallback = [fallback] if isinstance(fallback, str) else fallback
    if not isinstance(fallback, list) or not all(isinstance(f, str) and f.strip() for f in fallback):
        raise ConfigError(f"{where}: 'fallback' must be a reference or a list of them")
    targets = (use.strip(), *(f.strip() for f in fallback))
    for target in targets:
        if is_remote_reference(target):
            parse_reference(target, config)  # an unknown remote name fails when the file is read
    return Route(pattern=pattern.strip().lower(), targets=targets)
