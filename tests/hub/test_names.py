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

from fake_hub import fake_hub  # noqa: F401  (the fixture)
from tiny_models import write_tiny_model

TOP_LEVEL_MODELS = Path(__file__).resolve().parents[2] / "models"


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
                   "phi-3-mini-4k-instruct", "phi-3.5-mini-instruct", "tinyllama-1.1b-chat",
                   # the families added with gemma2/phi3/mistral3 support
                   "gemma-2-2b-it", "gemma-2-9b-it", "phi-4-14b", "phi-4-mini-instruct", "mistral-small-3.1-24b-instruct-2503",
                   # and with smollm3/granite/olmo2, and more of mistral3/gemma2
                   "smollm3-3b", "granite-3.3-2b-instruct", "granite-3.3-8b-instruct", "olmo-2-1b-instruct",
                   "olmo-2-7b-instruct", "mistral-small-3.2-24b-instruct-2506", "ministral-3-3b-instruct-2512",
                   "gemma-2-27b-it"):
        assert wanted in names


def test_every_entry_is_complete_and_honestly_named(registry):
    for e in registry.entries:
        assert e.name == "-".join(p for p in (e.family, e.params, e.variant) if p)
        # a parameter count, Phi's "mini", Gemma's "effective" count as Google writes it (E2B -> "e2b"), or a
        # mixture of experts' total and active counts as its maker writes them (30B-A3B, OLMoE's 1B-7B), or its
        # experts times their size (Mixtral's 8x7B)
        assert re.fullmatch(r"\d+(\.\d+)?[mb](-a?\d+(\.\d+)?b)?|e\d+b|\d+x\d+b|mini", e.params), e.name
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
        if isinstance(v, bool):
            return "true" if v else "false"
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


def test_an_unsupported_architecture_says_so_before_any_download(models_dir, tmp_path, monkeypatch):
    # Every shipped entry runs now (Phi-3 was the last one marked `supported = false`), so a registry of one
    # entry of an architecture no module handles stands in.
    directory = tmp_path / "registry"
    directory.mkdir()
    (directory / "x.toml").write_text(_toml({**_ENTRY, "arch": "somethingnew", "supported": False}))
    monkeypatch.setattr(reg, "default_registry", lambda: reg.load_registry(directory))
    with pytest.raises(UnsupportedArchitecture, match="x-1b-instruct-q4_k_m uses architecture 'somethingnew'"):
        resolve_model("x-1b-instruct", allow_pull=True)


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


# -- Ollama's names (models/ollama.toml) ---------------------------------------------------------------------


def _ollama_table() -> dict:
    """models/ollama.toml as plain TOML, read without the registry's loader."""
    return reg.tomllib.loads((TOP_LEVEL_MODELS / "ollama.toml").read_text(encoding="utf-8"))


def test_the_ollama_table_ships_in_the_package():
    import fnmatch

    pyproject = reg.tomllib.loads((TOP_LEVEL_MODELS.parent / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["localllm.hub"]
    assert any(fnmatch.fnmatch("models/ollama.toml", pattern) for pattern in patterns)
    assert (reg.registry_dir() / "ollama.toml").is_file()
    assert reg.default_registry().ollama  # read by the registry every command uses


def test_every_ollama_tag_resolves_to_the_registry_entry_it_names(registry):
    entries = {e.name for e in registry.entries}
    table = _ollama_table()
    assert len(table) >= 12
    for model, tags in table.items():
        for tag, entry in tags.items():
            if tag == "latest":
                # a bare name and NAME:latest mean the entry of the tag `latest` names
                wanted = tags[entry]
                assert registry.lookup(model).entry.name == registry.lookup(f"{model}:latest").entry.name == wanted
                continue
            assert entry in entries, f"{model}:{tag} -> {entry}"
            choice = registry.lookup(f"{model}:{tag}")
            assert choice.entry.name == entry and choice.quant.quant == choice.entry.default_quant


# Expected entries from Ollama's library pages: the default (`latest`) size of each family, and what each
# tag is (llama3 = Llama 3 8B Instruct, mistral = 7B Instruct v0.3, phi3 = mini (3.8B) 4k instruct ...).
@pytest.mark.parametrize("typed, entry", [
    ("llama3", "llama-3-8b-instruct"),
    ("llama3:8b", "llama-3-8b-instruct"),
    ("llama3:latest", "llama-3-8b-instruct"),
    ("llama3.1", "llama-3.1-8b-instruct"),
    ("llama3.1:8b", "llama-3.1-8b-instruct"),
    ("llama3.2", "llama-3.2-3b-instruct"),
    ("llama3.2:1b", "llama-3.2-1b-instruct"),
    ("qwen2.5", "qwen2.5-7b-instruct"),
    ("qwen2.5:7b", "qwen2.5-7b-instruct"),
    ("qwen2.5:0.5b", "qwen2.5-0.5b-instruct"),
    ("qwen2.5-coder", "qwen2.5-coder-7b-instruct"),
    ("qwen3", "qwen3-8b"),
    ("qwen3:8b", "qwen3-8b"),
    ("qwen3:0.6b", "qwen3-0.6b"),
    ("gemma3", "gemma-3-4b-it"),
    ("gemma3:4b", "gemma-3-4b-it"),
    ("gemma3:270m", "gemma-3-270m-it"),
    ("mistral", "mistral-7b-instruct-v0.3"),
    ("mistral:7b", "mistral-7b-instruct-v0.3"),
    ("mistral:v0.2", "mistral-7b-instruct-v0.2"),
    ("phi3", "phi-3-mini-4k-instruct"),
    ("phi3:mini", "phi-3-mini-4k-instruct"),
    ("phi3.5", "phi-3.5-mini-instruct"),
    ("phi3.5:3.8b", "phi-3.5-mini-instruct"),
    ("phi4", "phi-4-14b"),
    ("phi4:14b", "phi-4-14b"),
    ("phi4-mini", "phi-4-mini-instruct"),
    ("phi4-mini:3.8b", "phi-4-mini-instruct"),
    ("gemma2:2b", "gemma-2-2b-it"),
    ("gemma2:9b", "gemma-2-9b-it"),
    ("tinyllama", "tinyllama-1.1b-chat"),
    ("smollm2", "smollm2-1.7b-instruct"),
    ("deepseek-r1:1.5b", "deepseek-r1-distill-qwen-1.5b"),
    ("Qwen3:8B", "qwen3-8b"),
])
def test_the_issues_ollama_names_resolve(typed, entry):
    # The packaged registry (localllm/hub/models -> models/), as every command reads it.
    choice = reg.default_registry().lookup(typed)
    assert choice is not None and choice.entry.name == entry


@pytest.mark.parametrize("typed, repo, filename", [
    ("llama3.1:8b-instruct-q8_0", "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", "Meta-Llama-3.1-8B-Instruct-Q8_0.gguf"),
    ("qwen3:8b-q4_K_M", "Qwen/Qwen3-8B-GGUF", "Qwen3-8B-Q4_K_M.gguf"),
    ("gemma3:4b-it-q8_0", "bartowski/google_gemma-3-4b-it-GGUF", "google_gemma-3-4b-it-Q8_0.gguf"),
    ("llama3.2:1b", "bartowski/Llama-3.2-1B-Instruct-GGUF", "Llama-3.2-1B-Instruct-Q4_K_M.gguf"),
])
def test_an_ollama_tag_with_a_quant_is_that_file(typed, repo, filename):
    ref = remote_ref(typed)
    assert (ref.repo_id, ref.filename) == (repo, filename)
    assert reg.default_registry().lookup("phi3:3.8b-mini-4k-instruct-fp16").quant.quant == "F16"  # Ollama's fp16


@pytest.mark.parametrize("typed, hint", [
    ("deepseek-r1", "deepseek-r1:1.5b"),  # Ollama's latest (R1-0528 Qwen3 8B) has no entry: no guess
    ("llama3:70b", "llama3:8b"),  # a size with no entry
    ("llama3.1:8b-instruct-q4_0", "llama3.1:8b-instruct-q"),  # a quant the entry does not list
])
def test_an_ollama_name_without_an_entry_gets_the_closest_names(typed, hint):
    with pytest.raises(ModelNotFound, match=rf"^unknown model '{re.escape(typed)}'; did you mean .*{re.escape(hint)}"):
        resolve_model(typed)


_ENTRY = {"name": "x-1b-instruct", "family": "x", "params": "1b", "variant": "instruct", "license": "mit",
          "arch": "llama", "repo": "u/x-GGUF", "default_quant": "Q4_K_M",
          "files": [{"quant": "Q4_K_M", "file": "x-Q4_K_M.gguf", "size_gb": 0.8}]}


@pytest.mark.parametrize("ollama, message", [
    ('[x]\nlatest = "1b"\n"1b" = "x-2b-instruct"\n', "x:1b names 'x-2b-instruct', which is no entry"),
    ('[x]\nlatest = "2b"\n"1b" = "x-1b-instruct"\n', "`latest` must name one of its tags (1b)"),
    ('[X]\n"1b" = "x-1b-instruct"\n', "expected a table named as Ollama names the model"),
    ('[x]\n"1B" = "x-1b-instruct"\n', "tag '1B' is not a lower-case Ollama tag"),
    ('[x]\nlatest = "1b"\n"1b" = "x-1b-instruct"\n["x-1b"]\nlatest = "1b"\n"1b" = "y-1b"\n', "name 'x-1b' of Ollama's x-1b is also x-1b-instruct's"),
])
def test_a_malformed_ollama_table_fails_loading_with_its_place(tmp_path, ollama, message):
    other = {**_ENTRY, "name": "y-1b", "family": "y", "variant": "", "repo": "u/y-GGUF",
             "files": [{"quant": "Q4_K_M", "file": "y-Q4_K_M.gguf", "size_gb": 0.8}]}
    (tmp_path / "x.toml").write_text(_toml({**_ENTRY, "aliases": ["x-1b"]}) + _toml(other))
    (tmp_path / "ollama.toml").write_text(ollama)
    with pytest.raises(reg.RegistryError, match=re.escape(message)) as info:
        reg.load_registry(tmp_path)
    assert "ollama.toml [" in str(info.value)


# -- every command that takes MODEL takes the same names -----------------------------------------------------


def _run_cli(capsys, *args):
    from localllm.cli.app import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def pulled_llama(models_dir):
    """A tiny model standing in for llama-3.2-1b (Ollama's llama3.2:1b), recorded as pulled from its repo."""
    path = Path(write_tiny_model(models_dir / "Llama-3.2-1B-Instruct-Q4_K_M.gguf", "llama", "Q8_0", seed=5))
    _record(models_dir, path, "bartowski/Llama-3.2-1B-Instruct-GGUF")
    return path


def test_quantize_takes_a_model_name(capsys, pulled_llama, tmp_path):
    for name in ("llama3.2:1b", "llama-3.2-1b", "Llama-3.2-1B-Instruct-Q4_K_M"):
        code, out, err = _run_cli(capsys, "quantize", name, tmp_path / "x.gguf", "--int4", "--allow-requantize", "--dry-run")
        assert code == 0, err
        assert out.startswith(f"{pulled_llama} -> Q4_K_M")
    code, out, err = _run_cli(capsys, "quantize", "llama3.2:1b", tmp_path / "x.gguf", "--type", "F32", "--allow-requantize")
    assert code == 0, err
    from localllm.gguf import GGUFReader

    with GGUFReader(tmp_path / "x.gguf") as written, GGUFReader(pulled_llama) as source:
        assert set(written.tensors) == set(source.tensors)


def test_perplexity_and_bench_take_an_ollama_name(capsys, pulled_llama, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat and the dog lay by the door; " * 6)
    runs = [_run_cli(capsys, "perplexity", model, "--file", text, "--ctx", "16", "--json") for model in ("llama3.2:1b", pulled_llama)]
    assert runs[0][0] == 0, runs[0][2]
    assert runs[0] == runs[1]  # the same file, so the same figures
    code, out, err = _run_cli(capsys, "bench", "llama3.2:1b", "-p", "0", "-n", "2", "-t", "1", "-r", "1", "--json")
    assert code == 0, err
    import json

    assert json.loads(out)[0]["model_filename"] == str(pulled_llama)


@pytest.mark.parametrize("command", [
    ["run", "{}", "hi"], ["show", "{}"], ["pull", "{}"], ["quantize", "{}", "out.gguf", "--int8"],
    ["perplexity", "{}", "--file", "t.txt"], ["bench", "{}"],
])
def test_a_typo_gets_the_same_closest_names_in_every_command(capsys, models_dir, tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.txt").write_text("some text to measure on, long enough " * 4)
    code, out, err = _run_cli(capsys, *[part.format("lama3.2:1b") for part in command])
    assert (code, out) == (1, "")
    assert err.startswith("error: unknown model 'lama3.2:1b'; did you mean llama3.2:1b, ") and err.count("\n") == 1
    from localllm.hub.resolve import not_found_error

    assert err == f"error: {not_found_error('lama3.2:1b')}\n"  # the very line `run` prints
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "t.txt"]


def test_pull_takes_an_ollama_name_and_the_default(fake_hub, capsys, models_dir):
    repo, wanted = "bartowski/Llama-3.2-1B-Instruct-GGUF", "Llama-3.2-1B-Instruct-Q8_0.gguf"
    fake_hub.add_file(repo, "Llama-3.2-1B-Instruct-Q4_K_M.gguf", b"4" * 2000)
    fake_hub.add_file(repo, wanted, b"8" * 3000)
    code, out, err = _run_cli(capsys, "pull", "llama3.2:1b-instruct-q8_0")
    assert (code, out, err) == (0, f"{models_dir / wanted}\n", "")
    assert (models_dir / wanted).read_bytes() == b"8" * 3000
    code, out, err = _run_cli(capsys, "pull", "gemma-3-270m")  # built in: assembled, not downloaded
    assert (code, err) == (0, "") and out == f"{models_dir / 'gemma-3-270m-q4_k_m.gguf'}\n"
    assert (models_dir / "gemma-3-270m-q4_k_m.gguf").stat().st_size == default_model_path().stat().st_size
