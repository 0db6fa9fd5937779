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
    import localllm
    from ..hub.resolve import resolve_model

    if prompt == "-":
        prompt = sys.stdin.read()
    if max_tokens < 0:
        raise typer.BadParameter("--max-tokens must be >= 0")
    config = opt.sampling_config(temperature, top_k, top_p, min_p, repeat_penalty, seed, stop)
    config = dataclasses.replace(config, grammar=opt.grammar_option(grammar, json_schema))
    with ui.pull_progress() as progress:
        path = resolve_model(model, allow_pull=ui.download_consent(yes), progress=progress)
    llm = localllm.load(path, n_ctx=ctx, threads=threads, backend=backend)
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
