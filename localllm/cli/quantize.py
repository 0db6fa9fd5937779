"""`localllm quantize INPUT OUTPUT --type TYPE`: a GGUF (or Hugging Face directory) into a quantized GGUF.

Thin over `localllm.quantize`; the per-tensor progress bar and the dry-run table are rendered here.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from . import options as opt
from .ui import console, err_console, human_bytes

TYPE_NAMES = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_S/M/L, Q4_K_S/M, Q5_K_S/M, Q6_K, IQ4_NL, IQ4_XS, MXFP4_MOE"


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so the writer's cleanup runs as for Ctrl-C."""


def quantize(
    input_name: str = typer.Argument(..., metavar="INPUT", help="GGUF file or model name as `run` takes it (F32/F16/BF16; quantized ones need --allow-requantize), or a Hugging Face model directory."),
    output: Path = typer.Argument(..., metavar="OUTPUT", help="The GGUF file to write."),
    type_: Optional[str] = typer.Option(None, "--type", help=f"Quantization: {TYPE_NAMES} (llama.cpp's mixes)."),
    int8: bool = typer.Option(False, "--int8", help="Same as --type Q8_0."),
    int4: bool = typer.Option(False, "--int4", help="Same as --type Q4_K_M, the recommended 4-bit mix."),
    output_tensor_type: Optional[str] = typer.Option(None, "--output-tensor-type", help="Type of output.weight (e.g. Q8_0)."),
    token_embedding_type: Optional[str] = typer.Option(None, "--token-embedding-type", help="Type of token_embd.weight."),
    pure: bool = typer.Option(False, "--pure", help="Every quantizable tensor gets TYPE's base type (no mix)."),
    allow_requantize: bool = typer.Option(False, "--allow-requantize", help="Accept already-quantized input (loses quality)."),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite OUTPUT if it exists."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the per-type plan and the output size; write nothing."),
    threads: Optional[int] = opt.Threads,
) -> None:
    """Quantize a model: INPUT -> OUTPUT with llama.cpp's per-tensor mix for --type (or --int8 / --int4)."""
    from ..quantize import dry_run as plan_only, quantize_file

    file_type = _file_type(type_, int8, int4)
    input_path = _input_path(input_name)
    options = dict(output_type=output_tensor_type, token_embedding_type=token_embedding_type, pure=pure, allow_requantize=allow_requantize)
    if dry_run:
        _print_plan(plan_only(input_path, file_type, **options), input_path)
        return
    progress = _TensorProgress()
    try:
        with _sigterm_raises(), progress:
            result = quantize_file(input_path, output, file_type, force=force, threads=threads, progress=progress.update, on_plan=progress.start, **options)
    except (KeyboardInterrupt, Terminated) as exc:
        print(f"interrupted: nothing written to {output}", file=sys.stderr)
        raise typer.Exit(143 if isinstance(exc, Terminated) else 130) from None
    plan = result.plan
    console.print(
        f"wrote {result.path}: {plan.file_type}, {human_bytes(plan.output_size)}"
        f" ({8 * plan.output_tensor_bytes / plan.n_weights:.2f} bits per weight), {len(plan.tensors)} tensors"
        f" in {result.seconds:.1f} s on {result.threads} threads",
        soft_wrap=True,
    )


def _input_path(name: str) -> Path:
    """INPUT as typed: an existing path is itself (a Hugging Face directory is converted); anything else
    resolves as MODEL does for `run` and `show` (models directory, registry or Ollama name already pulled,
    the default model), without downloading."""
    path = Path(name).expanduser()
    if path.exists():
        return path
    from ..hub.resolve import resolve_model

    return resolve_model(name)


def _file_type(type_: Optional[str], int8: bool, int4: bool) -> str:
    given = [name for name, on in ((type_, type_ is not None), ("Q8_0", int8), ("Q4_K_M", int4)) if on]
    if len(given) != 1:
        raise typer.BadParameter("give exactly one of --type TYPE, --int8, --int4")
    return given[0]


@contextmanager
def _sigterm_raises():
    def handler(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _TensorProgress:
    """One bar over the input's tensor bytes, labelled with the tensor being converted."""

    def __init__(self):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._bar = Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=True,
            disable=not err_console.is_terminal,  # no bar frames in logs and pipes
        )
        self._started = False
        self._task = None
        self._done = 0  # input bytes of the tensors finished
        self._n = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._started:  # the bar appears once the plan is made, so early errors print only their line
            self._bar.stop()

    def start(self, plan) -> None:
        requantized = [t for t in plan.tensors if t.requantizes]
        if requantized:
            err_console.print(
                f"[yellow]warning:[/yellow] requantizing {len(requantized)} tensors from already-quantized types:"
                " the result is worse than quantizing the original full-precision weights",
                soft_wrap=True,
            )
        self._n = len(plan.tensors)
        self._task = self._bar.add_task("", total=max(1, plan.input_tensor_bytes))
        self._bar.start()
        self._started = True

    def update(self, index: int, tensor, fraction: float) -> None:
        arrow = f"{tensor.src_type} -> {tensor.dst_type}" if tensor.converts else f"{tensor.src_type} (copied)"
        self._bar.update(
            self._task, completed=self._done + fraction * tensor.src_bytes,
            description=f"[{index + 1}/{self._n}] {tensor.name} {arrow}",
        )
        if fraction >= 1.0:
            self._done += tensor.src_bytes


def _print_plan(plan, input_path: Path) -> None:
    from rich.table import Table

    console.print(f"{input_path} -> {plan.file_type}", soft_wrap=True)
    table = Table()
    for column in ("type", "tensors", "bytes", "share"):
        table.add_column(column, justify="left" if column == "type" else "right")
    total = plan.output_tensor_bytes
    for name, (count, size) in plan.by_type().items():
        table.add_row(name, str(count), f"{size:,}", f"{100 * size / max(1, total):.1f}%")
    console.print(table)
    requantized = sum(t.requantizes for t in plan.tensors)
    if requantized:
        console.print(f"requantized tensors: {requantized}")
    console.print(f"bits per weight: {8 * total / max(1, plan.n_weights):.2f}")
    console.print(f"output size: {plan.output_size} bytes ({human_bytes(plan.output_size)})")
