"""Option types shared by several commands."""

from __future__ import annotations

from typing import List, Optional

import typer

from ..sampling_config import SamplingConfig  # no NumPy: cheap enough for every command's start

Model = typer.Argument(None, help="Model path or name (default: the built-in Gemma 3 270M).")
Threads = typer.Option(
    None, "--threads", "-t", help="CPU threads (default: physical cores).", envvar="LOCALLLM_THREADS", min=1
)


def _check_backend(value: str) -> str:
    from ..backends import BACKEND_CHOICES

    if value not in BACKEND_CHOICES:
        raise typer.BadParameter(f"--backend must be one of {', '.join(BACKEND_CHOICES)}, got {value!r}")
    return value


Backend = typer.Option(
    "cpu", "--backend", "-b", callback=_check_backend, envvar="LOCALLLM_BACKEND",
    # "\\[" keeps rich (Typer's help renderer) from taking "[cuda]" for a style tag and dropping it.
    help="cpu, cuda (NVIDIA GPU; pip install 'localllm\\[cuda]') or auto (cuda when a GPU is present).",
)
Ctx = typer.Option(
    None, "--ctx", "-c", help="Context size in tokens (default: 4096, or the model's trained length if shorter).",
    envvar="LOCALLLM_CTX", min=16,
)
# Sampling options default to SamplingConfig's defaults (a dataclass field's default is its class attribute).
MaxTokens = typer.Option(SamplingConfig.max_tokens, "--max-tokens", "-n", help="Stop after this many generated tokens.")
Temperature = typer.Option(SamplingConfig.temperature, "--temperature", help="0 = greedy.")
TopK = typer.Option(SamplingConfig.top_k, "--top-k")
TopP = typer.Option(SamplingConfig.top_p, "--top-p")
MinP = typer.Option(SamplingConfig.min_p, "--min-p")
RepeatPenalty = typer.Option(
    None, "--repeat-penalty", help="1 = off (default: off; 1.1 when a base model chats through the transcript).",
    show_default=False,
)
Seed = typer.Option(None, "--seed", help="Same seed, same tokens.")
GrammarFile = typer.Option(None, "--grammar", help="GBNF grammar file (llama.cpp's format): the output follows it.",
                           show_default=False)
JsonSchema = typer.Option(None, "--json-schema", show_default=False,
                          help="JSON Schema, as a file or inline JSON: the output is JSON valid under it.")
Stop = typer.Option(None, "--stop", help="Stop string (repeatable).")
# Speculative decoding (localllm/speculative.py): the output is the same (greedy) or identically distributed.
Lookup = typer.Option(True, "--lookup/--no-lookup",
                      help="Prompt lookup: draft tokens copied from earlier in the context, checked in one pass.")
Draft = typer.Option(None, "--draft", show_default=False,
                     help="A small model with the same vocabulary drafting tokens for this one (path or name).")
DraftMax = typer.Option(8, "--draft-max", help="The most tokens drafted per step (1-16; adapts below it).")


def speculation(llm, lookup: bool, draft: Optional[str], draft_max: int, threads: Optional[int], backend: str, yes: bool = False):
    """The Speculation of the options (None when both drafters are off): the draft model loaded with the
    target's context, its vocabulary checked now (IncompatibleDraft: one line, before any prompt)."""
    from ..speculative import MAX_DRAFT, Speculation

    if not 1 <= draft_max <= MAX_DRAFT:
        raise typer.BadParameter(f"--draft-max must be between 1 and {MAX_DRAFT}, got {draft_max}")
    if not lookup and draft is None:
        return None
    draft_model = None
    if draft is not None:
        import localllm
        from ..hub.resolve import resolve_model
        from . import ui

        with ui.pull_progress() as progress:
            path = resolve_model(draft, allow_pull=ui.download_consent(yes), progress=progress)
        draft_model = localllm.load(path, n_ctx=llm.n_ctx, threads=threads, backend=backend)
    spec = Speculation(lookup=lookup, draft=draft_model, max_draft=draft_max)
    if draft_model is not None:
        spec.draft_model(llm)
    return spec


def target(model: Optional[str], yes: bool = False, pull: bool = True):
    """What MODEL names (remote/routing.py): a local file (with `pull`, pulled first if the user agrees; without,
    one not downloaded yet is an error naming `localllm pull`) or a Remote; each target a route passes over is
    announced in one line on stderr."""
    from ..remote.routing import resolve_target
    from . import ui

    with ui.pull_progress() as progress:
        return resolve_target(model, allow_pull=ui.download_consent(yes) if pull else None, progress=progress,
                              notify=ui.notice)


def remote_model(remote, **local_options):
    """The RemoteModel of `remote`, its model checked on the remote now; options that only a local model
    takes (given as name=value, None when not given) are refused in one line."""
    from ..remote.model import RemoteModel
    from . import ui

    given = [name for name, value in local_options.items() if value not in (None, False)]
    if given:
        flag = given[0].replace("_", "-")
        raise typer.BadParameter(f"--{flag} applies to a local model; {remote.label} runs on another engine")
    with ui.err_console.status(f"connecting to {remote.label}"):
        return RemoteModel(remote).connect()


def remote_constraint(grammar_file: Optional[str], json_schema: Optional[str]):
    """(GBNF text, JSON schema) of --grammar / --json-schema for a remote model: the schema goes as it is
    (response_format), not compiled to a grammar."""
    if grammar_file is None and json_schema is None:
        return None, None
    if grammar_file is not None:
        return grammar_option(grammar_file, json_schema), None
    import json

    text = _schema_text(json_schema)
    grammar_option(None, text)  # the same checks as a local model's: a bad schema is a bad parameter here
    return None, json.loads(text)


def sampling_config(temperature, top_k, top_p, min_p, repeat_penalty, seed, stop: Optional[List[str]]):
    """The SamplingConfig of the options; repeat_penalty None (not given) means SamplingConfig's (1.0: off)."""
    repeat_penalty = SamplingConfig.repeat_penalty if repeat_penalty is None else repeat_penalty
    try:
        return SamplingConfig(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repeat_penalty=repeat_penalty, seed=seed, stop=list(stop or []),
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def grammar_option(grammar_file: Optional[str], json_schema: Optional[str]) -> Optional[str]:
    """The GBNF text of --grammar FILE or --json-schema FILE|JSON (None without either); a bad file or
    grammar is a bad parameter, with the reason."""
    if grammar_file is None and json_schema is None:
        return None
    from pathlib import Path

    from ..grammar import GrammarError, grammar_text

    try:
        if grammar_file is not None:
            grammar = _read_text(grammar_file, "--grammar")
            return grammar_text(grammar=grammar, json_schema=None if json_schema is None else json_schema)
        return grammar_text(json_schema=_schema_text(json_schema))
    except GrammarError as exc:
        raise typer.BadParameter(str(exc)) from None


def _schema_text(value: str) -> str:
    """--json-schema's JSON: the value itself when it is inline JSON, else the file it names."""
    from pathlib import Path

    if value.lstrip().startswith(("{", "[", "true", "false")) and not Path(value).is_file():
        return value
    return _read_text(value, "--json-schema")


def _read_text(path: str, option: str) -> str:
    from pathlib import Path

    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(f"{option}: cannot read {path!r}: {getattr(exc, 'strerror', None) or exc}") from None
