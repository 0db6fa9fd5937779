"""`localllm pull` against a local fake of the Hugging Face Hub (tests/fake_hub.py): never the real network.

Payloads are seeded random bytes; the expected SHA-256 is hashlib's over the bytes the test made, the
expected file is those bytes. Resume tests use files above huggingface_hub's 10 MiB read chunk: bytes of a
chunk not completed when a link drops are lost, so smaller files could only restart from zero.
"""

from __future__ import annotations

import hashlib
import json
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_hub import fake_hub  # noqa: F401  (the fixture)
from localllm.cli.app import main
from localllm.errors import (
    ChecksumMismatch,
    InsufficientDiskSpace,
    ModelNotFound,
    NetworkError,
    Unauthorized,
    UnsupportedModelFile,
)
from localllm.hub import pull as pull_module
from localllm.hub.pull import (
    HubRef, choose_file, find_pulled, forget_pulled, parse_hub_ref, pull, pulled_records, quant_matches,
)

MiB = 1 << 20
REPO = "someone/Tiny-GGUF"


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Recorder:
    """A progress factory that remembers each bar: [description, total, initial, sum of updates, closed]."""

    def __init__(self):
        self.bars = []

    def __call__(self, description, total, done):
        bar = [description, total, done, 0, False]
        self.bars.append(bar)

        class Bar:
            def update(self, n):
                bar[3] += n

            def close(self):
                bar[4] = True

        return Bar()


def visible_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def part_files(directory: Path) -> list[Path]:
    return sorted((directory / ".partial").glob("*.part"))


# --- references and file choice (no server) -------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF", HubRef("bartowski/Llama-3.2-1B-Instruct-GGUF")),
        ("hf.co/user/repo:Q4_K_M", HubRef("user/repo", quant="Q4_K_M")),
        ("huggingface.co/user/repo:q8_0", HubRef("user/repo", quant="q8_0")),
        ("https://huggingface.co/user/repo", HubRef("user/repo")),
        ("https://hf.co/user/repo/", HubRef("user/repo")),
        ("user/repo:IQ2_XXS", HubRef("user/repo", quant="IQ2_XXS")),
        ("hf.co/user/repo:latest", HubRef("user/repo")),
        (
            "https://huggingface.co/user/repo/blob/main/sub/x-Q4_K_M.gguf",
            HubRef("user/repo", filename="sub/x-Q4_K_M.gguf", revision="main"),
        ),
        (
            "https://huggingface.co/user/repo/resolve/v1.0/x.gguf?download=true",
            HubRef("user/repo", filename="x.gguf", revision="v1.0"),
        ),
    ],
)
def test_hub_reference_forms(text, expected):
    assert parse_hub_ref(text) == expected


@pytest.mark.parametrize(
    "text", ["./model.gguf", "/abs/model.gguf", "models/x.gguf", "user/repo", "llama-3.1-8b-q4", "hf.co/user",
             "hf.co/user/repo:", "hf.co/user/repo/extra", "", "C:/x/y.gguf"],
)
def test_what_is_not_a_hub_reference(text):
    assert parse_hub_ref(text) is None


@pytest.mark.parametrize(
    "path, quant, expected",
    [
        ("M-Q4_K_M.gguf", "q4_k_m", True),
        ("M-Q4_K_M.gguf", "Q4_K", False),  # a prefix of a longer quant name is not it
        ("M-Q4_K.gguf", "Q4_K", True),
        ("M-IQ4_XS.gguf", "Q4_XS", False),
        ("m.Q8_0.gguf", "Q8_0", True),
        ("m_q8_0.gguf", "Q8_0", True),
        ("M-BF16.gguf", "F16", False),
        ("M-Q6_K-00001-of-00002.gguf", "Q6_K", True),
        ("UD-Q4_K_XL/M-UD-Q4_K_XL.gguf", "ud-q4_k_xl", True),
    ],
)
def test_quant_matching_is_whole_token_and_any_case(path, quant, expected):
    assert quant_matches(path, quant) is expected


LISTING = [
    ".gitattributes", "README.md", "M-Q4_K_M.gguf", "M-Q4_K_S.gguf", "M-Q8_0.gguf", "mmproj-M-F16.gguf",
    "M-Q6_K-00001-of-00002.gguf", "M-Q6_K-00002-of-00002.gguf",
]


def test_choose_file_by_quant_default_and_name():
    assert choose_file(HubRef(REPO, quant="q8_0"), LISTING) == "M-Q8_0.gguf"
    assert choose_file(HubRef(REPO), LISTING) == "M-Q4_K_M.gguf"  # several: Q4_K_M, as Ollama picks
    assert choose_file(HubRef(REPO), ["README.md", "only-F16.gguf"]) == "only-F16.gguf"
    assert choose_file(HubRef(REPO, filename="M-Q4_K_S.gguf"), LISTING) == "M-Q4_K_S.gguf"


def test_choose_file_errors_list_what_the_repo_has():
    with pytest.raises(ModelNotFound, match=r"no Q4_K GGUF; available: Q4_K_M, Q4_K_S, Q6_K, Q8_0$"):
        choose_file(HubRef(REPO, quant="Q4_K"), LISTING)
    with pytest.raises(ModelNotFound, match="several GGUF files.*Q5_K_M, Q8_0"):
        choose_file(HubRef(REPO), ["a-Q8_0.gguf", "a-Q5_K_M.gguf"])
    with pytest.raises(ModelNotFound, match="matches several files"):
        choose_file(HubRef(REPO, quant="Q4_K_M"), ["a/x-Q4_K_M.gguf", "b/x-Q4_K_M.gguf"])
    with pytest.raises(UnsupportedModelFile, match="split GGUF"):
        choose_file(HubRef(REPO, quant="q6_k"), LISTING)
    with pytest.raises(ModelNotFound, match="no file nope.gguf"):
        choose_file(HubRef(REPO, filename="nope.gguf"), LISTING)
    with pytest.raises(ModelNotFound, match="no GGUF files"):
        choose_file(HubRef(REPO), ["README.md"])
    with pytest.raises(UnsupportedModelFile, match="not a .gguf"):
        choose_file(HubRef(REPO, filename="README.md"), LISTING)


# --- the library against the fake Hub ---------------------------------------------------------------------


def test_normal_download(fake_hub, tmp_path):
    data = payload(300_000)
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", data)
    fake_hub.add_file(REPO, "Tiny-Q8_0.gguf", payload(1000, 1))
    progress = Recorder()

    path = pull(HubRef(REPO, quant="q4_k_m"), directory=tmp_path, progress=progress)

    assert path == tmp_path / "Tiny-Q4_K_M.gguf" and path.read_bytes() == data
    assert fake_hub.bytes_served == len(data)
    assert visible_files(tmp_path) == ["Tiny-Q4_K_M.gguf"] and part_files(tmp_path) == []
    assert [b[:2] for b in progress.bars] == [["pulling Tiny-Q4_K_M.gguf", len(data)], ["checking Tiny-Q4_K_M.gguf", len(data)]]
    assert all(b[3] == len(data) and b[4] for b in progress.bars)
    record = pulled_records(tmp_path)["Tiny-Q4_K_M.gguf"]
    assert (record.repo_id, record.filename, record.sha256, record.size) == (REPO, "Tiny-Q4_K_M.gguf", sha(data), len(data))
    assert record.commit == fake_hub.commit_of(REPO) and record.revision is None
    # the download was pinned to the commit the metadata came from
    assert any(p == f"/{REPO}/resolve/{record.commit}/Tiny-Q4_K_M.gguf" for _, p, _ in fake_hub.requests)


def test_already_pulled_is_not_downloaded_again(fake_hub, tmp_path):
    data = payload(200_000)
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", data)
    first = pull(HubRef(REPO, quant="Q4_K_M"), directory=tmp_path)
    progress = Recorder()
    again = pull(HubRef(REPO, filename="Tiny-Q4_K_M.gguf"), directory=tmp_path, progress=progress)
    assert again == first and fake_hub.bytes_served == len(data) and progress.bars == []


def test_an_updated_file_on_the_hub_replaces_the_local_one(fake_hub, tmp_path):
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", payload(100_000, 1))
    pull(HubRef(REPO), directory=tmp_path)
    new = payload(120_000, 2)
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", new)
    path = pull(HubRef(REPO), directory=tmp_path)
    assert path.read_bytes() == new and pulled_records(tmp_path)[path.name].sha256 == sha(new)


def test_find_pulled_works_offline(fake_hub, tmp_path, monkeypatch):
    data = payload(150_000)
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", data)
    fake_hub.add_file(REPO, "Tiny-Q8_0.gguf", payload(10, 1))
    path = pull(HubRef(REPO, quant="Q4_K_M"), directory=tmp_path)
    commit = fake_hub.commit_of(REPO)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")  # no Hub from here on
    requests_before = len(fake_hub.requests)

    assert find_pulled(HubRef(REPO, quant="q4_k_m"), tmp_path) == path
    assert find_pulled(HubRef(REPO.upper(), quant="Q4_K_M"), tmp_path) == path  # repo ids: any case
    assert find_pulled(HubRef(REPO), tmp_path) == path
    assert find_pulled(HubRef(REPO, filename="Tiny-Q4_K_M.gguf"), tmp_path) == path
    assert find_pulled(HubRef(REPO, quant="Q4_K_M", revision=commit[:8]), tmp_path) == path
    assert find_pulled(HubRef(REPO, quant="Q8_0"), tmp_path) is None
    assert find_pulled(HubRef(REPO, quant="Q4_K_M", revision="v2"), tmp_path) is None
    assert find_pulled(HubRef("other/repo", quant="Q4_K_M"), tmp_path) is None
    assert len(fake_hub.requests) == requests_before
    path.write_bytes(data[:1000])  # no longer the file that was pulled
    assert find_pulled(HubRef(REPO, quant="Q4_K_M"), tmp_path) is None


def test_forget_pulled_drops_only_that_entry(fake_hub, tmp_path):
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", payload(1000, 1))
    fake_hub.add_file(REPO, "Tiny-Q8_0.gguf", payload(1000, 2))
    pull(HubRef(REPO, quant="Q4_K_M"), directory=tmp_path)
    pull(HubRef(REPO, quant="Q8_0"), directory=tmp_path)
    forget_pulled("Tiny-Q4_K_M.gguf", tmp_path)
    forget_pulled("never-pulled.gguf", tmp_path)
    assert list(pulled_records(tmp_path)) == ["Tiny-Q8_0.gguf"]
    assert find_pulled(HubRef(REPO, quant="Q4_K_M"), tmp_path) is None


def test_same_file_name_from_two_repos_gets_the_repo_in_the_second_name(fake_hub, tmp_path):
    a, b = payload(1000, 1), payload(1000, 2)
    fake_hub.add_file("alice/M-GGUF", "M-Q4_K_M.gguf", a)
    fake_hub.add_file("bob/M-GGUF", "M-Q4_K_M.gguf", b)
    first = pull(HubRef("alice/M-GGUF"), directory=tmp_path)
    second = pull(HubRef("bob/M-GGUF"), directory=tmp_path)
    assert first.name == "M-Q4_K_M.gguf" and first.read_bytes() == a
    assert second.name == "bob--M-GGUF--M-Q4_K_M.gguf" and second.read_bytes() == b
    assert find_pulled(HubRef("bob/M-GGUF"), tmp_path) == second
    assert find_pulled(HubRef("alice/M-GGUF"), tmp_path) == first


def test_a_connection_dropped_halfway_resumes_in_the_same_pull(fake_hub, tmp_path):
    data = payload(24 * MiB)
    fake_hub.add_file(REPO, "Big-Q8_0.gguf", data)
    fake_hub.drop_after(14 * MiB)  # huggingface_hub keeps the first 10 MiB chunk, then asks for the rest

    path = pull(HubRef(REPO, quant="Q8_0"), directory=tmp_path)

    assert path.read_bytes() == data
    ranges = [h.get("Range") or h.get("range") for m, p, h in fake_hub.requests if p.startswith("/cdn/")]
    assert ranges == [None, f"bytes={10 * MiB}-"]
    assert fake_hub.bytes_served == 14 * MiB + 14 * MiB  # well below two file sizes


def test_an_interrupted_pull_resumes_next_time(fake_hub, tmp_path):
    data = payload(24 * MiB)
    fake_hub.add_file(REPO, "Big-Q8_0.gguf", data)
    fake_hub.drop_after(12 * MiB)
    fake_hub.fail_with(503)  # huggingface_hub's own retry meets a Hub that stays down

    with pytest.raises(NetworkError, match=r"HTTP 503.*10\.0 MiB of 24\.0 MiB kept, run the same pull again"):
        pull(HubRef(REPO, quant="Q8_0"), directory=tmp_path)
    assert visible_files(tmp_path) == [] and [p.stat().st_size for p in part_files(tmp_path)] == [10 * MiB]

    progress = Recorder()
    path = pull(HubRef(REPO, quant="Q8_0"), directory=tmp_path, progress=progress)
    assert path.read_bytes() == data and part_files(tmp_path) == []
    assert progress.bars[0][1:4] == [len(data), 10 * MiB, 14 * MiB]  # the bar starts at what was kept
    assert fake_hub.bytes_served == 12 * MiB + 14 * MiB


def test_checksum_mismatch_leaves_nothing_under_the_final_name(fake_hub, tmp_path):
    data = payload(100_000)
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", data, sha256=sha(b"something else"))
    with pytest.raises(ChecksumMismatch, match=f"downloaded sha256 {sha(data)} differs from the Hub's {sha(b'something else')}"):
        pull(HubRef(REPO), directory=tmp_path)
    assert visible_files(tmp_path) == [] and part_files(tmp_path) == [] and pulled_records(tmp_path) == {}


def _tree(root: Path, outside_of: Path) -> dict[str, bytes | None]:
    """Every path under `root` except those under `outside_of`, with each file's bytes (None: a folder)."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*")) if outside_of not in (p, *p.parents)
    }


@pytest.mark.parametrize(
    "advertised",
    ["../../outside/victim", "../outside", "{tmp_path}/outside/victim", "a" * 63, "a" * 65, "g" * 64, sha(b"x")[:-1] + "\n"],
)
def test_a_hub_sha256_that_is_not_64_hex_digits_is_refused_before_any_use(fake_hub, tmp_path, advertised):
    # The LFS id names the staging file <models>/.partial/<sha256>.part (and its .lock): a hostile Hub
    # must not make pull create or delete anything outside the models folder.
    models, outside = tmp_path / "models", tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.part").write_bytes(b"precious")
    (outside / "victim").write_bytes(b"precious too")
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", payload(1000), sha256=advertised.format(tmp_path=tmp_path))
    before = _tree(tmp_path, models)
    with pytest.raises(pull_module.PullError, match="not 64 hex digits") as info:
        pull(HubRef(REPO), directory=models)
    assert "\n" not in str(info.value)
    assert _tree(tmp_path, models) == before
    assert fake_hub.bytes_served == 0
    assert not models.exists() or (visible_files(models) == [] and part_files(models) == [])


@pytest.mark.parametrize("filename", ["evil\x1b[31m-Q4_K_M.gguf", "a\rb-Q4_K_M.gguf", "sub/\u202eQ4_K_M.gguf"])
def test_a_hub_file_name_that_cannot_be_printed_or_named_is_refused(fake_hub, tmp_path, filename):
    fake_hub.add_file(REPO, filename, payload(1000))
    with pytest.raises(pull_module.PullError, match="cannot be a local file name") as info:
        pull(HubRef(REPO, filename=filename), directory=tmp_path / "models")
    assert info.value.args[0].isprintable()
    assert fake_hub.bytes_served == 0 and not (tmp_path / "models").exists()


def test_an_upper_case_hub_sha256_is_accepted(fake_hub, tmp_path):
    data = payload(1000)
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", data, sha256=sha(data).upper())
    assert pull(HubRef(REPO), directory=tmp_path).read_bytes() == data
    assert pulled_records(tmp_path)["Tiny-Q4_K_M.gguf"].sha256 == sha(data)


@pytest.mark.parametrize(
    "ref, message",
    [
        (HubRef("nobody/Nothing-GGUF"), "repository nobody/Nothing-GGUF not found"),
        (HubRef(REPO, filename="Tiny-Q5_0.gguf"), "has no file Tiny-Q5_0.gguf"),
        (HubRef(REPO, revision="v9"), "revision v9 not found"),
        (HubRef(REPO, quant="Q2_K"), "no Q2_K GGUF; available: Q4_K_M"),
    ],
)
def test_not_found(fake_hub, tmp_path, ref, message):
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", payload(1000))
    with pytest.raises(ModelNotFound, match=message):
        pull(ref, directory=tmp_path)
    assert fake_hub.bytes_served == 0


def test_gated_repo_needs_a_token_with_access(fake_hub, tmp_path, monkeypatch):
    data = payload(5000)
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", data)
    fake_hub.gate(REPO, "hf_right")
    with pytest.raises(Unauthorized, match="gated.*HF_TOKEN"):
        pull(HubRef(REPO), directory=tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(Unauthorized, match="HF_TOKEN"):
        pull(HubRef(REPO), directory=tmp_path)
    assert visible_files(tmp_path) == []
    monkeypatch.setenv("HF_TOKEN", "hf_right")
    assert pull(HubRef(REPO), directory=tmp_path).read_bytes() == data


def test_an_explicit_token_is_sent(fake_hub, tmp_path):
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", payload(5000))
    fake_hub.gate(REPO, "hf_right")
    assert pull(HubRef(REPO), directory=tmp_path, token="hf_right").exists()


def test_too_little_disk_space_stops_before_downloading(fake_hub, tmp_path, monkeypatch):
    data = payload(24 * MiB)
    fake_hub.add_file(REPO, "Big-Q8_0.gguf", data)
    monkeypatch.setattr(pull_module, "free_disk_bytes", lambda directory: 20 * MiB)
    with pytest.raises(InsufficientDiskSpace, match=r"needs 24\.0 MiB more but .* has 20\.0 MiB free"):
        pull(HubRef(REPO), directory=tmp_path)
    assert fake_hub.bytes_served == 0 and visible_files(tmp_path) == []


def test_the_disk_check_counts_only_the_bytes_still_missing(fake_hub, tmp_path, monkeypatch):
    data = payload(24 * MiB)
    fake_hub.add_file(REPO, "Big-Q8_0.gguf", data)
    staged = tmp_path / ".partial" / f"{sha(data)}.part"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(data[: 10 * MiB])  # what an interrupted pull kept
    monkeypatch.setattr(pull_module, "free_disk_bytes", lambda directory: 15 * MiB)
    assert pull(HubRef(REPO), directory=tmp_path).read_bytes() == data
    assert fake_hub.bytes_served == 14 * MiB


def test_hub_unreachable_is_a_network_error(fake_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(NetworkError, match="connection to http://127.0.0.1:.* failed"):
        pull(HubRef(REPO), directory=tmp_path)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the command ------------------------------------------------------------------------------------------


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> bool:
    return err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err


def test_cli_pull_prints_the_path(fake_hub, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LOCALLLM_MODELS", str(tmp_path))
    data = payload(50_000)
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", data)
    code, out, err = run_cli(capsys, "pull", f"hf.co/{REPO}:q4_k_m")
    assert (code, out, err) == (0, f"{tmp_path / 'Tiny-Q4_K_M.gguf'}\n", "")
    assert (tmp_path / "Tiny-Q4_K_M.gguf").read_bytes() == data


def test_cli_pulls_a_registry_name(fake_hub, tmp_path, capsys, monkeypatch):
    """llama-3.2-1b is in models/llama.toml as bartowski/Llama-3.2-1B-Instruct-GGUF, Q4_K_M by default."""
    monkeypatch.setenv("LOCALLLM_MODELS", str(tmp_path))
    repo, wanted = "bartowski/Llama-3.2-1B-Instruct-GGUF", "Llama-3.2-1B-Instruct-Q4_K_M.gguf"
    fake_hub.add_file(repo, wanted, payload(2000, 1))
    fake_hub.add_file(repo, "Llama-3.2-1B-Instruct-Q8_0.gguf", payload(3000, 2))
    code, out, err = run_cli(capsys, "pull", "llama-3.2-1b")
    assert (code, out, err) == (0, f"{tmp_path / wanted}\n", "")
    assert (tmp_path / wanted).read_bytes() == payload(2000, 1)


def test_cli_models_dir_and_revision(fake_hub, tmp_path, capsys):
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", payload(50_000))
    commit = fake_hub.commit_of(REPO)
    code, out, _ = run_cli(capsys, "pull", f"{REPO}:Q4_K_M", "--revision", commit, "--models-dir", str(tmp_path / "m"))
    assert code == 0 and out.strip() == str(tmp_path / "m" / "Tiny-Q4_K_M.gguf")
    assert pulled_records(tmp_path / "m")["Tiny-Q4_K_M.gguf"].revision == commit


@pytest.mark.parametrize(
    "setup, model, needle",
    [
        ("none", "hf.co/nobody/Nothing-GGUF", "not found"),
        ("gated", f"hf.co/{REPO}", "HF_TOKEN"),
        ("mismatch", f"hf.co/{REPO}", "differs from the Hub's"),
        ("disk", f"hf.co/{REPO}", "free"),
        ("down", f"hf.co/{REPO}", "failed"),
        ("none", "./model.gguf", "give a registry name, hf.co/USER/REPO[:QUANT]"),
        ("none", "someone/repo", "write hf.co/someone/repo"),
        ("split", f"hf.co/{REPO}:Q6_K", "split GGUF"),
    ],
)
def test_cli_errors_are_one_line_and_exit_1(fake_hub, tmp_path, capsys, monkeypatch, setup, model, needle):
    monkeypatch.setenv("LOCALLLM_MODELS", str(tmp_path))
    data = payload(50_000)
    fake_hub.add_file(REPO, "Tiny-Q4_K_M.gguf", data, sha256=sha(b"other") if setup == "mismatch" else None)
    fake_hub.add_file(REPO, "Tiny-Q6_K-00001-of-00002.gguf", b"1")
    fake_hub.add_file(REPO, "Tiny-Q6_K-00002-of-00002.gguf", b"2")
    if setup == "gated":
        fake_hub.gate(REPO, "hf_right")
    if setup == "disk":
        monkeypatch.setattr(pull_module, "free_disk_bytes", lambda directory: 10)
    if setup == "down":
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    code, out, err = run_cli(capsys, "pull", model)
    assert code == 1 and out == "" and one_error_line(err) and needle in err, err
    assert visible_files(tmp_path) == []


@pytest.mark.parametrize("args", [["pull"], ["pull", "hf.co/a/b", "--bogus"], ["pull", "hf.co/a/b", "extra"]])
def test_cli_usage_errors_exit_2(capsys, args):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and "Traceback" not in err and one_error_line(err) and "localllm pull --help" in err


def cli_process(*args, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "localllm.cli.app", "pull", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )


def test_cli_process_ctrl_c_then_resume(fake_hub, tmp_path, monkeypatch):
    """The real command in its own process: Ctrl-C halfway, run again, only the rest is fetched."""
    monkeypatch.setenv("LOCALLLM_MODELS", str(tmp_path))
    data = payload(24 * MiB)
    fake_hub.add_file(REPO, "Big-Q8_0.gguf", data)
    fake_hub.stall_after(12 * MiB)
    proc = cli_process(f"hf.co/{REPO}:Q8_0")
    staged = tmp_path / ".partial" / f"{sha(data)}.part"
    assert fake_hub.stalled.wait(timeout=60)  # its 12 MiB are sent (and counted)
    deadline = time.monotonic() + 60
    while not (staged.exists() and staged.stat().st_size >= 10 * MiB) and time.monotonic() < deadline:
        time.sleep(0.05)  # ... and the first 10 MiB chunk is written
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    fake_hub.release()
    assert (proc.returncode, out) == (130, "") and err.startswith("interrupted:") and err.count("\n") == 1, err
    assert visible_files(tmp_path) == [] and staged.stat().st_size == 10 * MiB

    proc = cli_process(f"hf.co/{REPO}:Q8_0")
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err) == (0, f"{tmp_path / 'Big-Q8_0.gguf'}\n", "")
    assert (tmp_path / "Big-Q8_0.gguf").read_bytes() == data
    assert fake_hub.bytes_served == 12 * MiB + 14 * MiB  # well below two file sizes


def test_cli_process_not_found_is_one_line(fake_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALLLM_MODELS", str(tmp_path))
    proc = cli_process("hf.co/nobody/Nothing-GGUF:Q4_K_M")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and out == "" and one_error_line(err) and "not found" in err, err
    assert [p for _, p, _ in fake_hub.requests] == ["/api/models/nobody/Nothing-GGUF"]  # and no telemetry fetch
