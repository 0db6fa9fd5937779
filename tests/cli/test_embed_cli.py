"""`localllm embed`: vectors llama.cpp computes (tests/data/llamacpp_embeddings.npz), printed one line per
text or as JSON; bad input is one line and a non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localllm.cli.app import main
from tiny_encoders import EMBED_TEXTS, embed_model

DATA = Path(__file__).resolve().parent.parent / "data" / "llamacpp_embeddings.npz"


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return str(embed_model(tmp_path_factory.mktemp("embed-cli"), "bert", "F32"))


@pytest.fixture(scope="module")
def expected():
    """llama.cpp's bert vectors (mean pooling), L2-normalised."""
    vectors = np.load(DATA)["embd_bert_F32"].astype(np.float64)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_one_line_per_text(capsys, bert, expected):
    code, out, err = run_cli(capsys, "embed", bert, EMBED_TEXTS[0], EMBED_TEXTS[1])
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2
    got = np.array([[float(v) for v in line.split()] for line in lines])
    assert got.shape == (2, 256)
    assert np.abs(got - expected[:2]).max() < 1e-3


def test_json_and_stdin(capsys, bert, expected, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(EMBED_TEXTS[2] + "\n\n" + EMBED_TEXTS[3] + "\n"))
    code, out, err = run_cli(capsys, "embed", bert, "-", "--json", "--no-normalize")
    assert code == 0, err
    result = json.loads(out)
    assert result["pooling"] == "mean" and result["dimensions"] == 256 and result["normalized"] is False
    got = np.array(result["embeddings"])
    assert got.shape == (2, 256)
    cos = np.sum(got * expected[2:4], axis=1) / np.linalg.norm(got, axis=1)
    assert cos.min() >= 0.9999
    assert len(result["token_counts"]) == 2


@pytest.mark.parametrize("args,message", [
    (["--pooling", "rank"], "--pooling must be one of"),
    ([], "give at least one TEXT"),
])
def test_bad_usage_exits_2(capsys, bert, args, message):
    code, out, err = run_cli(capsys, "embed", bert, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_text_past_the_context_is_one_line_and_exit_1(capsys, bert):
    code, out, err = run_cli(capsys, "embed", bert, "fox " * 200)
    assert code == 1 and "context holds 128" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli(capsys, "embed", bert, "fox " * 200, "--truncate")
    assert code == 0 and len(out.splitlines()) == 1


@pytest.mark.parametrize("command", [["run", "{model}", "hi"], ["chat", "{model}"]])
def test_run_and_chat_refuse_an_embedding_model_in_one_line(capsys, bert, command):
    code, out, err = run_cli(capsys, *[a.format(model=bert) for a in command])
    assert code == 1 and "is an embedding model (bert)" in err and "localllm embed" in err
    assert len(err.strip().splitlines()) <= 2  # chat prints the model's memory line first
