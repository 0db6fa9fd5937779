"""Model names: the shipped alias registry (models/*.toml) and how a typed MODEL resolves to a file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localllm.errors import ModelNotFound, UnsupportedArchitecture
from localllm.hub import registry as reg
from localllm.hub.default_model import default_model_path
from localllm.hub.pull import HubRef
from localllm.hub.resolve import DownloadDeclined, remote_ref, resolve_local, resolve_model
from localllm.model.archs import ARCHITECTURES

from tiny_models import write_tiny_model

TOP_LEVEL_MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture(scope="module")
def registry():
    return reg.load_registry(TOP_LEVEL_MODELS)


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    directory = tmp_path / "models"
    directory.mkdir()
    monkeypatch.setenv("LOCALLLM_MODELS", str(directory))
    return directory


# -- the registry as shipped --------------------------------------------------------------------------------


def test_the_package_reads_the_top_level_registry():
    assert reg.registry_dir().resolve() == TOP_LEVEL_MODELS.resolve()
    assert (reg.registry_dir() / "README.md").is_file()


def test_at_least_twenty_models_from_the_families_the_issue_names(registry):
    names = {e.name for e in registry.entries}
    assert len(names) == len(registry.entries) >= 20
    for wanted in ("llama-3.1-8b-instruct", "llama-3.2-1b-instruct", "llama-3.2-3b-instruct", "mistral-7b-instruct-v0.3",
                   "qwen2.5-0.5b-instruct", "qwen2.5-7b-instruct", "qwen3-8b", "gemma-3-270m-it", "gemma-3-12b-it",
                   "phi-3-mini-4k-instruct", "phi-3.5-mini-instruct", "tinyllama-1.1b-chat"):
        assert wanted in names


def test_every_entry_is_complete_and_honestly_named(registry):
    for e in registry.entries:
        assert e.name == "-".join(p for p in (e.family, e.params, e.variant) if p)
        assert re.fullmatch(r"\d+(\.\d+)?[mb]|mini", e.params), e.name  # a parameter count, or Phi's "mini"
        assert e.license and re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", e.repo)
        assert e.repo.lower().endswith("gguf"), e.repo  # GGUF repositories, by their makers' own naming
        for f in e.files:
            assert f.file.endswith(".gguf") and 0.1 < f.size_gb < 30
            # The quant is in the file name (Microsoft's Phi-3 repo spells Q4_K_M "q4").
            assert f.quant.lower() in f.file.lower() or (f.quant, f.file) == ("Q4_K_M", "Phi-3-mini-4k-instruct-q4.gguf") \
                or (f.quant, f.file) == ("F16", "Phi-3-mini-4k-instruct-fp16.gguf")
        # A bigger quant is a bigger file.
        bits = {f.quant: f.size_gb for f in e.files}
        if "Q4_K_M" in bits and "Q8_0" in bits:
            assert bits["Q4_K_M"] < bits["Q8_0"]


def test_every_architecture_is_runnable_or_marked_unsupported(registry):
    for e in registry.entries:
        assert (e.arch in ARCHITECTURES) == e.supported, f"{e.name}: arch {e.arch}, supported={e.supported}"


def test_typed_names_are_unique_and_the_issues_examples_resolve(registry):
    assert registry.lookup("llama-3-8b-q4").filename == "Meta-Llama-3-8B-Instruct-Q4_K_M.gguf"
    assert registry.lookup("qwen2.5-7b-q4").repo == "bartowski/Qwen2.5-7B-Instruct-GGUF"
    assert registry.lookup("LLAMA-3.1-8B").name == "llama-3.1-8b-instruct-q4_k_m"  # any case, default quant
    assert registry.lookup("llama-3.1-8b-instruct-q8_0").filename == "Meta-Llama-3.1-8B-Instruct-Q8_0.gguf"
    assert registry.lookup("qwen3-0.6b").quant.quant == "Q8_0"  # its only quant
    assert registry.lookup("gemma-3-270m") is None  # the built-in default is not a registry entry


@pytest.mark.parametrize("mutation, message", [
    (lambda e: e.pop("repo"), "missing ['repo']"),
    (lambda e: e.update(name="Llama-3-8B"), "must be family-params"),
    (lambda e: e.update(default_quant="Q5_K_M"), "default_quant Q5_K_M is not among the files"),
    (lambda e: e["files"].append(dict(e["files"][0])), "each quant once"),
    (lambda e: e["files"][0].update(file="x.bin"), "must be a .gguf file name"),
    (lambda e: e["files"][0].update(size_gb="big"), "must be a number of GB"),
    (lambda e: e.update(colour="red"), "unknown keys ['colour']"),
])
def test_a_malformed_entry_fails_loading_with_its_place(tmp_path, mutation, message):
    entry = {"name": "x-1b-instruct", "family": "x", "params": "1b", "variant": "instruct", "license": "mit",
             "arch": "llama", "repo": "u/x-GGUF", "default_quant": "Q4_K_M",
             "files": [{"quant": "Q4_K_M", "file": "x-Q4_K_M.gguf", "size_gb": 0.8}]}
    mutation(entry)
    (tmp_path / "x.toml").write_text(_toml(entry))
    with pytest.raises(reg.RegistryError, match=re.escape(message)) as info:
        reg.load_registry(tmp_path)
    assert "x.toml entry 1" in str(info.value)


def test_two_entries_claiming_one_name_fail(tmp_path):
    base = {"family": "x", "params": "1b", "variant": "", "license": "mit", "arch": "llama", "default_quant": "Q8_0",
            "files": [{"quant": "Q8_0", "file": "a-Q8_0.gguf", "size_gb": 1.0}]}
    (tmp_path / "a.toml").write_text(_toml({**base, "name": "x-1b", "repo": "u/a-GGUF"})
                                     + _toml({**base, "name": "y-1b", "family": "y", "aliases": ["x-1b"], "repo": "u/b-GGUF"}))
    with pytest.raises(reg.RegistryError, match="name 'x-1b' of y-1b is also x-1b's"):
        reg.load_registry(tmp_path)


def _toml(entry: dict) -> str:
    def value(v):
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return str(v)

    return "[[model]]\n" + "".join(f"{k} = {value(v)}\n" for k, v in entry.items())


# -- resolution ----------------------------------------------------------------------------------------------


def test_no_name_and_the_default_name_are_the_pypi_model():
    path = default_model_path()
    assert resolve_model(None) == resolve_model("Gemma-3-270M") == path
    assert path.name == "gemma-3-270m-q4_k_m.gguf" and path.stat().st_size > 200_000_000


def test_an_existing_path_wins_over_everything(models_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    odd = tmp_path / "llama-3-8b"  # a file whose name is also an alias
    odd.write_bytes(b"GGUF")
    assert resolve_model("llama-3-8b") == Path("llama-3-8b")


def test_a_models_directory_name_resolves_without_gguf_and_in_any_case(models_dir):
    path = Path(write_tiny_model(models_dir / "My-Tiny.gguf", "llama", "Q8_0"))
    assert resolve_model("my-tiny") == path
    assert resolve_model("MY-TINY.gguf") == path


def test_a_registry_name_already_pulled_resolves_offline(models_dir):
    # The index record A's pull writes; find_pulled checks the file's size against it.
    path = Path(write_tiny_model(models_dir / "Llama-3.2-1B-Instruct-Q4_K_M.gguf", "llama", "Q8_0"))
    _record(models_dir, path, "bartowski/Llama-3.2-1B-Instruct-GGUF")
    assert resolve_model("llama-3.2-1b") == path
    assert resolve_model("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:q4_k_m") == path


def _record(directory: Path, path: Path, repo: str) -> None:
    import json

    fields = {"repo_id": repo, "filename": path.name, "revision": None, "commit": "0" * 40, "sha256": "0" * 64,
              "size": path.stat().st_size, "pulled_at": "2025-01-01T00:00:00+00:00"}
    (directory / ".pulls.json").write_text(json.dumps({"version": 1, "files": {path.name: fields}}))


def test_a_registry_name_not_pulled_is_not_downloaded_without_consent(models_dir):
    with pytest.raises(ModelNotFound, match=r"'qwen3-8b' is not downloaded yet: `localllm pull qwen3-8b`"):
        resolve_model("qwen3-8b")
    asked = []
    with pytest.raises(DownloadDeclined):
        resolve_model("qwen3-8b", allow_pull=lambda d: asked.append((d.name, d.size_gb, d.source)) or False)
    assert asked == [("qwen3-8b", 5.03, "hf.co/Qwen/Qwen3-8B-GGUF/Qwen3-8B-Q4_K_M.gguf")]
    assert resolve_local("qwen3-8b") is None


def test_an_unsupported_architecture_says_so_before_any_download(models_dir):
    with pytest.raises(UnsupportedArchitecture, match="phi-3-mini-4k-instruct-q4_k_m uses architecture 'phi3'"):
        resolve_model("phi-3-mini", allow_pull=True)


def test_a_typo_gets_the_closest_names():
    with pytest.raises(ModelNotFound, match=r"unknown model 'lama-3.1-8b'; did you mean llama-3.1-8b,"):
        resolve_model("lama-3.1-8b")
    with pytest.raises(ModelNotFound, match=r"did you mean gemma-3-270m"):
        resolve_model("gema-3-270m")
    with pytest.raises(ModelNotFound, match=r"unknown model 'zzzzqqq' \(`localllm list` shows local models\)"):
        resolve_model("zzzzqqq")


@pytest.mark.parametrize("name", ["missing.gguf", "./x/missing.gguf", "/nonexistent/dir/m.gguf"])
def test_a_missing_path_is_no_such_file_not_a_suggestion(name):
    with pytest.raises(ModelNotFound, match=r"^no such file: ") as info:
        resolve_model(name)
    assert "did you mean" not in str(info.value)


def test_a_directory_and_an_unreadable_file_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ModelNotFound, match="is a directory, not a .gguf file"):
        resolve_model(str(tmp_path))
    locked = tmp_path / "locked.gguf"
    locked.write_bytes(b"GGUF")
    # The tests run as root here, for whom chmod 000 still reads: simulate the permission check failing.
    import localllm.hub.resolve as resolve

    monkeypatch.setattr(resolve.os, "access", lambda path, mode: Path(path) != locked)
    with pytest.raises(ModelNotFound, match="cannot read .*locked.gguf: permission denied"):
        resolve_model(str(locked))


def test_remote_ref_for_pull():
    assert remote_ref("llama-3.2-3b-q8") == HubRef("bartowski/Llama-3.2-3B-Instruct-GGUF",
                                                    filename="Llama-3.2-3B-Instruct-Q8_0.gguf", quant="Q8_0")
    assert remote_ref("hf.co/unsloth/Foo-GGUF:q5_k_m") == HubRef("unsloth/Foo-GGUF", quant="q5_k_m")
    assert remote_ref("unsloth/Foo-GGUF:Q8_0") == HubRef("unsloth/Foo-GGUF", quant="Q8_0")
    assert remote_ref("no-such-model") is None
    assert remote_ref("./local.gguf") is None
