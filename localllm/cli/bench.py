"""`localllm bench [MODEL] -p 512 -n 128 [-d 4096] -t 1,2 -r 5 [--json]`: llama-bench-shaped throughput table."""

from __future__ import annotations

from typing import Optional

import typer

from . import options as opt
from . import ui


def _thread_list(value: str) -> list[int]:
    try:
        counts = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"--threads takes comma-separated integers, got {value!r}") from None
    if not counts or min(counts) < 1:
        raise typer.BadParameter("--threads values must be >= 1")
    return counts


def bench(
    model: Optional[str] = opt.Model,
    n_prompt: int = typer.Option(512, "--n-prompt", "-p", help="Prompt tokens per pp test (0 skips it)."),
    n_gen: int = typer.Option(128, "--n-gen", "-n", help="Generated tokens per tg test (0 skips it)."),
    threads: Optional[str] = typer.Option(None, "--threads", "-t", help="Thread counts, e.g. 1,2 (default: physical cores)."),
    n_depth: int = typer.Option(0, "--n-depth", "-d", help="Tokens already in the cache when each test starts (llama-bench's -d)."),
    repetitions: int = typer.Option(5, "--repetitions", "-r", help="Timed runs per test (after one warm-up)."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON list with llama-bench's keys."),
    backend: str = opt.Backend,
    draft: Optional[str] = typer.Option(None, "--draft", show_default=False,
                                        help="tg tests speculate with this draft model (greedy drafts)."),
    draft_max: int = opt.DraftMax,
    replay: int = typer.Option(0, "--replay", help="tg tests verify this many drafted tokens a step, each the model's "
                                                   "own greedy continuation (acceptance 100%: verification's ceiling)."),
) -> None:
    """Measure prompt processing (pp) and text generation (tg) speed, as llama-bench does."""
    from ..bench import bench as run_bench

    if n_prompt < 0 or n_gen < 0 or (n_prompt == 0 and n_gen == 0):
        raise typer.BadParameter("-p and -n must be >= 0, and not both 0")
    if n_depth < 0:
        raise typer.BadParameter("-d must be >= 0")
    if repetitions < 1:
        raise typer.BadParameter("--repetitions must be >= 1")
    from ..remote.config import Remote

    progress = None if json_out else (lambda msg: ui.status(f"running {msg}"))
    target = opt.target(model, pull=False)  # bench never downloads (no --yes)
    if isinstance(target, Remote):
        from ..remote.bench import bench_remote

        llm = opt.remote_model(target, threads=threads, n_depth=n_depth or None, draft=draft, replay=replay or None)
        _report(list(bench_remote(llm, n_prompt, n_gen, repetitions, progress=progress)), json_out)
        return
    counts = _thread_list(threads) if threads else [None]
    speculative = _speculative(draft, draft_max, replay, n_depth + n_gen + 16, backend)
    results = list(run_bench(target, n_prompt, n_gen, counts, repetitions, progress=progress, backend=backend, n_depth=n_depth,
                             speculative=speculative))
    _report(results, json_out)


def _report(results: list, json_out: bool) -> None:
    if json_out:
        ui.print_json([r.as_dict() for r in results])
    else:
        ui.bench_table(results)


def _speculative(draft: Optional[str], draft_max: int, replay: int, n_ctx: int, backend: str):
    """The speculative tg test of --draft / --replay (None: plain tg)."""
    from ..bench import SpeculativeGeneration
    from ..speculative import MAX_DRAFT

    if draft is not None and replay:
        raise typer.BadParameter("--draft and --replay are two different tests: give one")
    for name, value in (("--draft-max", draft_max), ("--replay", replay or 1)):
        if not 1 <= value <= MAX_DRAFT:
            raise typer.BadParameter(f"{name} must be between 1 and {MAX_DRAFT}, got {value}")
    if replay:
        return SpeculativeGeneration(replay=replay)
    if draft is None:
        return None
    import localllm

    draft_model = localllm.load(draft, n_ctx=n_ctx, backend=backend)
    draft_model.backend.wait_for_kernels()  # a cold start's background compile, as bench waits for the model's
    return SpeculativeGeneration(draft=draft_model, max_draft=draft_max)
