"""`localllm perplexity MODEL --file TEXT [--ctx 512] [--kl-divergence-base BASE] [--json]`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import options as opt
from . import ui


def perplexity(
    model: Optional[str] = opt.Model,
    file: Path = typer.Option(..., "--file", "-f", help="UTF-8 text to measure on (tokenized whole, once)."),
    ctx: int = typer.Option(512, "--ctx", "-c", help="Window size in tokens; the second half of each window is scored."),
    kl_base: Optional[str] = typer.Option(
        None, "--kl-divergence-base", help="Also report KL divergence and top-1 agreement against this model (same vocabulary)."
    ),
    json_out: bool = typer.Option(False, "--json", help='Print {"ppl", "ppl_stderr", "n_windows", "n_scored"} (and the KL keys).'),
    threads: Optional[int] = opt.Threads,
) -> None:
    """Perplexity of MODEL on a text, computed as llama.cpp's llama-perplexity does."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from ..perplexity import perplexity_of_file

    bar = Progress(
        TextColumn("windows"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
        console=ui.err_console, transient=True, disable=json_out or not ui.err_console.is_terminal,
    )
    task = None

    def progress(done: int, total: int) -> None:
        nonlocal task
        if task is None:
            task = bar.add_task("windows", total=total)
        bar.update(task, completed=done)

    with open(file, "rb"):  # a missing or unreadable file: an OSError, worded by cli/errors.py as everywhere
        pass
    with bar:
        result = perplexity_of_file(model, file, ctx, base_name=kl_base, threads=threads, progress=progress)
    if json_out:
        ui.print_json(result.to_json())
        return
    ui.console.print(
        f"PPL = {result.ppl:.4f} +/- {result.ppl_stderr:.5f}   "
        f"({result.n_windows} windows of {result.ctx} tokens, {result.n_scored} tokens scored)"
    )
    if result.kl is not None:
        kl = result.kl
        ui.console.print(f"base PPL = {kl.base_ppl:.4f} +/- {kl.base_ppl_stderr:.5f}")
        ui.console.print(f"mean KLD = {kl.kld:.6f} +/- {kl.kld_stderr:.6f}")
        ui.console.print(f"same top-1 = {kl.top1_agreement:.3f} +/- {kl.top1_agreement_stderr:.3f} %")
