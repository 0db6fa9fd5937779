"""`localllm run MODEL PROMPT`: one completion, streamed to stdout (or one JSON object)."""

from __future__ import annotations

import dataclasses
import sys
from typing import List, Optional

import typer

from . import options as opt
from . import ui


def run(
    model: Optional[str] = typer.Argument(..., help="Model path or name ('gemma-3-270m' is built in)."),
    prompt: str = typer.Argument(..., help="The prompt; '-' reads it from stdin."),
    max_tokens: int = opt.MaxTokens,
    temperature: float = opt.Temperature,
    top_k: int = opt.TopK,
    top_p: float = opt.TopP,
    min_p: float = opt.MinP,
    repeat_penalty: Optional[float] = opt.RepeatPenalty,
    seed: Optional[int] = opt.Seed,
    stop: Optional[List[str]] = opt.Stop,
    grammar: Optional[str] = opt.GrammarFile,
    json_schema: Optional[str] = opt.JsonSchema,
    lookup: bool = opt.Lookup,
    draft: Optional[str] = opt.Draft,
    draft_max: int = opt.DraftMax,
    chat: bool = typer.Option(False, "--chat", help="Apply the model's chat template to the prompt (a base model: a transcript)."),
    json_out: bool = typer.Option(False, "--json", help="Print {prompt_tokens, tokens, text, timings}."),
    ctx: Optional[int] = opt.Ctx,
    threads: Optional[int] = opt.Threads,
    backend: str = opt.Backend,
    yes: bool = typer.Option(False, "--yes", "-y", help="Download the model without asking if it is not local."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print the timings on stderr afterwards (as chat's /stats)."),
) -> None:
    """Generate a completion for PROMPT."""
    from ..api import load_path
    from ..remote.config import Remote

    if prompt == "-":
        prompt = sys.stdin.read()
    if max_tokens < 0:
        raise typer.BadParameter("--max-tokens must be >= 0")
    config = opt.sampling_config(temperature, top_k, top_p, min_p, repeat_penalty, seed, stop)
    target = opt.target(model, yes)
    if isinstance(target, Remote):
        llm = opt.remote_model(target, ctx=ctx, draft=draft)
        _run_remote(llm, prompt, chat, config, opt.remote_constraint(grammar, json_schema), max_tokens, json_out, verbose)
        return
    config = dataclasses.replace(config, grammar=opt.grammar_option(grammar, json_schema))
    llm = load_path(target, n_ctx=ctx, threads=threads, backend=backend)
    speculation = opt.speculation(llm, lookup, draft, draft_max, threads, backend, yes)
    source = [{"role": "user", "content": prompt}] if chat else prompt
    prompt_ids = llm.render_chat(source) if chat else llm.tokenize(prompt)
    if chat:  # the template's stop strings and default penalty (a base model's transcript: "\nUser:", 1.1)
        config = dataclasses.replace(config, repeat_penalty=llm.chat_repeat_penalty(repeat_penalty),
                                     stop=config.stop + llm.chat_stop())
    tokens, pieces, timings = [], [], None
    for event in llm.generate(prompt_ids, max_tokens=max_tokens, sampling=config, speculation=speculation):
        if event.kind == "token":
            if event.token is not None:
                tokens.append(event.token)
            pieces.append(event.text)
            if not json_out:
                sys.stdout.write(event.text)
                sys.stdout.flush()
        else:
            timings = event.timings
            finish = event.finish_reason
    if json_out:
        ui.print_json({
            "prompt_tokens": prompt_ids,
            "tokens": tokens,
            "text": "".join(pieces),
            "finish_reason": finish,
            "timings": timings.as_dict() if timings else None,
        })
    else:
        sys.stdout.write("\n")
    if verbose and timings is not None:
        ui.err_console.print(ui.timing_summary(timings, len(prompt_ids) + len(tokens), llm.n_ctx), markup=False)


def _run_remote(llm, prompt: str, chat: bool, config, constraint, max_tokens: int, json_out: bool, verbose: bool) -> None:
    """`run` on a RemoteModel: the prompt goes as text (or as one user message with --chat); the remote's
    engine tokenizes it and applies its own chat template."""
    grammar, schema = constraint
    source = [{"role": "user", "content": prompt}] if chat else prompt
    pieces, timings, finish = [], None, None
    for event in llm.generate(source, max_tokens=max_tokens, sampling=config, grammar=grammar, json_schema=schema):
        if event.kind == "token":
            pieces.append(event.text)
            if not json_out:
                sys.stdout.write(event.text)
                sys.stdout.flush()
        else:
            timings, finish = event.timings, event.finish_reason
    if json_out:  # token ids stay on the remote: null here
        ui.print_json({"prompt_tokens": None, "tokens": None, "text": "".join(pieces), "finish_reason": finish,
                       "timings": timings.as_dict() if timings else None, "remote": llm.label})
    else:
        sys.stdout.write("\n")
    if verbose and timings is not None:
        used = timings.prompt_tokens + timings.generated_tokens
        ui.err_console.print(ui.timing_summary(timings, used, llm.n_ctx), markup=False)
