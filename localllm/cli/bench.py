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
) -> None:
    """Measure prompt processing (pp) and text generation (tg) speed, as llama-bench does."""
    from ..bench import bench as run_bench

    if n_prompt < 0 or n_gen < 0 or (n_prompt == 0 and n_gen == 0):
        raise typer.BadParameter("-p and -n must be >= 0, and not both 0")
    if n_depth < 0:
        raise typer.BadParameter("-d must be >= 0")
    if repetitions < 1:
        raise typer.BadParameter("--repetitions must be >= 1")
    counts = _thread_list(threads) if threads else [None]
    progress = None if json_out else (lambda msg: ui.status(f"running {msg}"))
    results = list(run_bench(model, n_prompt, n_gen, counts, repetitions, progress=progress, backend=backend, n_depth=n_depth))
    if json_out:
        ui.print_json([r.as_dict() for r in results])
        return
    ui.bench_table(results)
