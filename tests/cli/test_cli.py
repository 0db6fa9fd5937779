"""The command line: real commands on real files, exit codes, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from localllm.cli.app import main

from tiny_models import TINY_ARCHS, Dims, write_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("cli") / "tiny-llama.gguf", "llama", "Q8_0", seed=3)


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_json_on_the_default_model(capsys):
    code, out, err = run_cli(capsys, "show", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["architecture"] == "gemma3"
    assert info["n_tensors"] == 236
    assert info["tokenizer_model"] == "llama"


def test_show_a_hostile_file_is_one_line_and_exit_1(capsys, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 16)
    code, out, err = run_cli(capsys, "show", str(bad))
    assert code == 1
    assert err.count("\n") == 1 and "bad.gguf" in err and "Traceback" not in err


def test_missing_model_is_one_line_and_exit_1(capsys, tmp_path):
    code, _, err = run_cli(capsys, "show", str(tmp_path / "nope.gguf"))
    assert code == 1 and err.startswith("error:") and err.count("\n") == 1


def test_run_json_greedy_is_deterministic(capsys, tiny_llama):
    args = ("run", tiny_llama, "▁ab▁cd", "-n", "6", "--temperature", "0", "--json")
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    first = json.loads(out)
    assert first["prompt_tokens"][0] == 2  # BOS from the vocabulary's metadata
    assert len(first["tokens"]) <= 6 and first["timings"]["prompt_tokens"] == len(first["prompt_tokens"])
    code, out, _ = run_cli(capsys, *args)
    assert json.loads(out)["tokens"] == first["tokens"]


def test_run_prompt_over_context_exits_1(capsys, tiny_llama):
    code, _, err = run_cli(capsys, "run", tiny_llama, "▁ab" * 40, "--ctx", "16", "-n", "2")
    assert code == 1 and "context" in err and err.count("\n") == 1


def test_run_bad_flag_value_is_a_usage_error(capsys, tiny_llama):
    code, _, err = run_cli(capsys, "run", tiny_llama, "hi", "--top-p", "1.5")
    assert code == 2 and "top" in err.lower() and err.count("\n") == 1


@pytest.mark.parametrize("args", [["run"], ["run", "m", "p", "--top-k", "abc"], ["no-such-command"], ["show", "--bogus"]])
def test_usage_errors_are_one_line_with_exit_2(capsys, args):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1 and "--help" in err


def test_tokenize_jsonl_loads_once_and_answers_per_line(tiny_llama):
    lines = [json.dumps("▁ab▁cd"), json.dumps("▁zz"), json.dumps("")]
    proc = subprocess.run(
        [sys.executable, "-m", "localllm.cli.app", "tokenize", tiny_llama, "--jsonl", "--no-bos"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(answers) == 3
    assert all(isinstance(ids, list) for ids in answers) and answers[2] == []
    assert all(2 not in ids for ids in answers)


def _copy_metadata_only(src, dst, **overrides):
    from localllm.gguf import GGUFReader, GGUFWriter

    with GGUFReader(src) as reader:
        writer = GGUFWriter(dst)
        writer.copy_metadata(reader)
        for key, value in overrides.items():
            writer.add(key, value)
        writer.write()
    return str(dst)


def test_tokenize_a_vocab_only_file(capsys, tiny_llama, tmp_path):
    vocab_only = _copy_metadata_only(tiny_llama, tmp_path / "vocab.gguf")
    code, out, err = run_cli(capsys, "tokenize", vocab_only, "▁ab▁cd", "--json")
    assert code == 0, err
    # Worked by hand from tests/tiny_models.py's vocabulary: BOS (2); the space prefix SentencePiece adds
    # ("▁", no token of its own here) as its UTF-8 bytes E2 96 81 through the byte tokens <0xNN> (id
    # 4 + byte: 230, 154, 133); then the whole pieces "▁ab" (286) and "▁cd" (340).
    assert json.loads(out) == [2, 230, 154, 133, 286, 340]


def test_run_unknown_architecture_exits_1_listing_supported(capsys, tiny_llama, tmp_path):
    from localllm.gguf import GGUFReader, GGUFWriter

    path = tmp_path / "mamba.gguf"
    with GGUFReader(tiny_llama) as reader:
        writer = GGUFWriter(path)
        writer.copy_metadata(reader)
        writer.add("general.architecture", "mamba")
        for name, info in reader.tensors.items():
            writer.add_tensor(name, reader.tensor_bytes(name), info.ggml_type.name, shape=info.shape)
        writer.write()
    code, _, err = run_cli(capsys, "run", str(path), "hi", "-n", "1")
    assert code == 1 and "mamba" in err and "gemma3" in err and "llama" in err and err.count("\n") == 1


# Every command that takes a model, given one that is unknown, missing, a directory or not a GGUF file:
# exit 1 and one line naming the problem, before anything is loaded (chat and serve never start).
MODEL_COMMANDS = [["chat"], ["run", "{model}", "hi"], ["show"], ["tokenize", "{model}", "hi"], ["bench"], ["serve"]]
BAD_MODELS = {
    "unknown name": ("no-such-model-xyz", "unknown model"),
    "missing file": ("{tmp}/missing.gguf", "no such file"),
    "directory": ("{tmp}", "directory"),
    "not a GGUF file": ("{tmp}/notes.gguf", "notes.gguf"),
}


def _with_model(command: list[str], model: str) -> list[str]:
    if "{model}" in command:
        return [model if part == "{model}" else part for part in command]
    return [*command, model]


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("case", list(BAD_MODELS))
def test_bad_model_arguments_exit_1_with_one_line(capsys, tmp_path, command, case):
    (tmp_path / "notes.gguf").write_text("not a model")
    model, needle = BAD_MODELS[case]
    code, out, err = run_cli(capsys, *_with_model(command, model.format(tmp=tmp_path)))
    assert code == 1 and out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    assert needle in err


@pytest.mark.parametrize(
    "args",
    [
        ["chat", "--temperature", "x"], ["chat", "--ctx", "5"], ["bench", "-t", "abc"], ["bench", "-t", "0"],
        ["bench", "-p", "-3"], ["bench", "-d", "-1"], ["serve", "--port", "99999"], ["run", "m", "p", "-n", "many"],
    ],
    ids=" ".join,
)
def test_bad_flag_values_are_usage_errors(capsys, args):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, err


def test_bench_json_has_llama_bench_keys_and_the_depth(capsys, tiny_llama):
    code, out, err = run_cli(capsys, "bench", tiny_llama, "-p", "8", "-n", "4", "-d", "16", "-t", "1", "-r", "2", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["test"], r["n_prompt"], r["n_gen"], r["n_depth"], r["n_threads"]) for r in rows] == [
        ("pp8 @ d16", 8, 0, 16, 1), ("tg4 @ d16", 0, 4, 16, 1)]
    for r in rows:
        n = r["n_prompt"] or r["n_gen"]
        assert len(r["samples_ns"]) == 2 and len(r["samples_ts"]) == 2
        assert r["samples_ts"] == pytest.approx([n / (ns / 1e9) for ns in r["samples_ns"]])
        assert r["avg_ts"] == pytest.approx(sum(r["samples_ts"]) / 2)


def test_bench_depth_runs_every_test_after_the_cached_tokens(tiny_llama, monkeypatch):
    # llama-bench -d: the depth is evaluated once, then each run (warm-up included) starts at position d.
    from localllm import bench
    from localllm.model.decoder import Decoder

    calls = []
    forward = Decoder.forward

    def recording(self, tokens, start, cache, *args, **kwargs):
        calls.append((start, len(tokens)))
        return forward(self, tokens, start, cache, *args, **kwargs)

    monkeypatch.setattr(Decoder, "forward", recording)
    monkeypatch.setattr("localllm.generate.PREFILL_CHUNK", 8)
    results = list(bench.bench(tiny_llama, n_prompt=5, n_gen=3, threads=(1,), repetitions=2, n_depth=12))
    assert [r.test for r in results] == ["pp5 @ d12", "tg3 @ d12"]
    depth_fill = [(0, 8), (8, 4)]  # 12 tokens in chunks of 8, once
    prompt_run = [(12, 5)]
    gen_run = [(12, 1), (13, 1), (14, 1)]
    assert calls == depth_fill + prompt_run * 3 + gen_run * 3


def test_bench_replay_verifies_the_models_own_continuation(capsys, tiny_llama):
    code, out, err = run_cli(capsys, "bench", tiny_llama, "-p", "0", "-n", "12", "-t", "1", "-r", "2", "--replay", "3", "--json")
    assert code == 0, err
    (row,) = json.loads(out)
    # every draft is the greedy continuation a plain run recorded: all kept
    assert row["test"] == "tg12 +replay3" and row["speculation"] == "replay3" and row["draft_acceptance"] == 1.0
    assert len(row["samples_ns"]) == 2


def test_speculation_options_out_of_range_or_incompatible_are_one_line(capsys, tiny_llama, gemma_path):
    code, out, err = run_cli(capsys, "run", tiny_llama, "hi", "--draft-max", "17")
    assert code == 2 and "--draft-max must be between 1 and 16" in err and err.count("\n") == 1
    code, out, err = run_cli(capsys, "bench", tiny_llama, "--replay", "2", "--draft", tiny_llama)
    assert code == 2 and "two different tests" in err and err.count("\n") == 1
    code, out, err = run_cli(capsys, "run", tiny_llama, "hi", "-n", "2", "--draft", gemma_path)
    assert code == 1 and "cannot draft for this model: its vocabulary has 262144 tokens, the model's 384" in err
    assert err.count("\n") == 1 and out == ""


def test_run_with_a_draft_model_prints_plain_decodings_tokens(capsys, tmp_path):
    # a draft a seventh of the model's size: drafting pays from the start (speculative.DraftLength)
    model = write_tiny_model(tmp_path / "model.gguf", "llama", "Q8_0", seed=3, dims=Dims(n_layer=8, n_ff=512))
    draft = write_tiny_model(tmp_path / "draft.gguf", "gemma3", "Q8_0", seed=4, dims=Dims(n_layer=1))
    args = ("run", model, "▁ab▁cd▁ab▁cd", "-n", "16", "--temperature", "0", "--json")
    code, out, err = run_cli(capsys, *args, "--no-lookup")
    assert code == 0, err
    plain = json.loads(out)
    assert plain["timings"]["draft_tokens"] == 0
    code, out, err = run_cli(capsys, *args, "--draft", draft, "--draft-max", "3")
    assert code == 0, err
    got = json.loads(out)
    assert got["tokens"] == plain["tokens"] and got["timings"]["draft_tokens"] > 0


@pytest.mark.parametrize("command", ["bench", "chat", "run", "serve"])
def test_help_keeps_the_cuda_extra_in_brackets(command):
    # rich renders Typer's help and takes an unescaped "[cuda]" for a style tag, dropping it from the text.
    proc = subprocess.run(
        [sys.executable, "-m", "localllm.cli.app", command, "--help"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "250"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'localllm[cuda]'" in proc.stdout


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_run_prints_text_for_every_architecture(capsys, tmp_path, arch):
    """`localllm run` on a tiny model of each architecture prints its greedy continuation: the text of the
    tokens that `--json` reports for the same command."""
    path = write_tiny_model(tmp_path / f"tiny-{arch}.gguf", arch, "Q8_0", seed=5)
    args = ("run", path, "▁ab▁cd▁ef", "-n", "8", "--temperature", "0")
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    code, report, err = run_cli(capsys, *args, "--json")
    assert code == 0, err
    result = json.loads(report)
    assert result["tokens"] and out.strip() and out.rstrip("\n") == result["text"].rstrip("\n")


def test_run_json_schema_gives_valid_json_on_the_default_model(capsys, tmp_path):
    import jsonschema

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                               "people": {"type": "integer", "minimum": 1, "maximum": 10**7}},
              "required": ["city", "people"]}
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(schema))
    for given in (str(schema_file), json.dumps(schema)):  # a file, or the JSON inline
        code, out, err = run_cli(capsys, "run", "gemma-3-270m", "A city:", "-n", "80", "--seed", "1",
                                 "--json-schema", given, "--json")
        assert code == 0, err
        result = json.loads(out)
        assert result["finish_reason"] == "stop"
        jsonschema.validate(json.loads(result["text"]), schema)


def test_run_grammar_file_constrains_the_output(capsys, tmp_path):
    grammar = tmp_path / "yesno.gbnf"
    grammar.write_text('root ::= " " ("yes" | "no")\n')
    code, out, err = run_cli(capsys, "run", "gemma-3-270m", "Is water wet? Answer:", "-n", "10", "--temperature", "0",
                             "--grammar", str(grammar))
    assert code == 0, err
    assert out in (" yes\n", " no\n")


@pytest.mark.parametrize("flag,value,message", [
    ("--grammar", "MISSING", "cannot read"),
    ("--grammar", "BAD", "expected ')'"),
    ("--json-schema", '{"type": "string", "pattern": "a+"}', "pattern"),
    ("--json-schema", "{oops", "not valid JSON"),
])
def test_run_bad_grammar_or_schema_is_one_line_and_exit_2(capsys, tmp_path, tiny_llama, flag, value, message):
    if value == "MISSING":
        value = str(tmp_path / "nope.gbnf")
    elif value == "BAD":
        (tmp_path / "bad.gbnf").write_text('root ::= ("a"\n')
        value = str(tmp_path / "bad.gbnf")
    code, out, err = run_cli(capsys, "run", tiny_llama, "hi", flag, value)
    assert code == 2 and message in err and err.count("\n") == 1 and out == ""


@pytest.mark.parametrize("flags,lookup,draft_max,draft", [((), False, 8, None), (("--lookup", "--draft-max", "5"), True, 5, None),
                                                          (("--no-lookup", "--draft", "small.gguf"), False, 8, "small.gguf")])
def test_serve_passes_the_speculation_options_to_the_server(capsys, monkeypatch, flags, lookup, draft_max, draft):
    import localllm.server

    seen = []
    monkeypatch.setattr(localllm.server, "serve", lambda model, options, **kw: seen.append(options))
    code, _, err = run_cli(capsys, "serve", "--port", "0", *flags)
    assert code == 0, err
    assert [(o.lookup, o.draft_max, o.draft) for o in seen] == [(lookup, draft_max, draft)]


def test_serve_with_a_draft_of_another_vocabulary_is_one_line(capsys, tiny_llama, gemma_path):
    code, out, err = run_cli(capsys, "serve", tiny_llama, "--port", "0", "--draft", gemma_path, "--quiet")
    assert code == 1 and "cannot draft for this model" in err and err.count("\n") == 1


def test_serve_refuses_a_draft_length_out_of_range(capsys):
    code, _, err = run_cli(capsys, "serve", "--draft-max", "17")
    assert code != 0 and "--draft-max" in err
