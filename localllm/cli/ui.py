"""All rich output of the CLI lives here."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def human_count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(int(n))


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def print_model_summary(info: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("file", info["path"]),
        ("architecture", info["architecture"]),
        ("name", info["name"]),
        ("parameters", human_count(info["parameters"])),
        ("file size", human_bytes(info["file_size"])),
        ("file type", info["file_type"]),
        ("context length", info["context_length"]),
        ("layers", info["n_layers"]),
        ("embedding", info["n_embd"]),
        ("feed-forward", info["n_ff"]),
        ("heads (q / kv)", f"{info['n_head']} / {info['n_head_kv']}"),
        ("head dim", info["head_dim"]),
        ("sliding window", info["sliding_window"]),
        ("tokenizer", f"{info['tokenizer_model']}, {info['vocab_size']} tokens"),
        ("chat template", "in file" if info["chat_template"] else "none (built-in used)"),
    ]
    for key, value in rows:
        if value is not None:
            table.add_row(key, str(value))
    console.print(table)
    mix = Table(title="quant mix", title_justify="left")
    mix.add_column("type")
    mix.add_column("tensors", justify="right")
    mix.add_column("size", justify="right")
    for name, entry in info["quant_mix"].items():
        mix.add_row(name, str(entry["tensors"]), human_bytes(entry["bytes"]))
    console.print(mix)


def print_tensors(reader) -> None:
    table = Table(title="tensors", title_justify="left")
    for column in ("name", "type", "shape (ggml order)", "size"):
        table.add_column(column)
    for tensor in reader.tensors.values():
        table.add_row(tensor.name, tensor.ggml_type.name, " x ".join(map(str, tensor.shape)), human_bytes(tensor.nbytes))
    console.print(table)


def status(message: str) -> None:
    """A progress line on stderr (stdout stays clean for results)."""
    err_console.print(f"[dim]{message}…[/dim]")


def bench_table(results) -> None:
    """llama-bench's table: model, size, params, backend, threads, test, t/s (mean ± sd)."""
    table = Table(box=None, header_style="bold")
    for column in ("model", "size", "params", "backend", "threads", "test", "t/s"):
        table.add_column(column, justify="right" if column not in ("model", "backend") else "left")
    for r in results:
        table.add_row(
            r.model_type, human_bytes(r.model_size), human_count(r.n_params), r.backend, str(r.n_threads),
            r.test, f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}",
        )
    console.print(table)


# -- names: list, rm, show, pull on first use ------------------------------------------------------------------


def is_interactive() -> bool:
    return sys.stdin.isatty() and sys.stderr.isatty()


def confirm(question: str) -> bool:
    """Ask a yes/no question on the terminal; anything but y/yes is no (Ctrl-D too)."""
    err_console.print(f"{question} [y/N] ", end="")
    try:
        answer = input()
    except EOFError:
        err_console.print()
        return False
    return answer.strip().lower() in ("y", "yes")


def download_consent(yes: bool):
    """The `allow_pull` for resolve_model: --yes downloads, a terminal asks, anything else refuses."""
    from ..hub.resolve import DownloadDeclined

    def ask(download) -> bool:
        if yes:
            return True
        size = f"{download.size_gb:.2f} GB" if download.size_gb is not None else "size unknown"
        if not is_interactive():
            raise DownloadDeclined(
                f"'{download.name}' is not downloaded; add --yes to download it ({size}) from {download.source},"
                f" or run `localllm pull {download.name}`"
            )
        return confirm(f"Download {download.name} ({size}) from {download.source}?")

    return ask


def pull_progress():
    """The download progress bars of `localllm pull` (a context manager and the library's progress
    factory), for pulls on first use."""
    from .progress import PullProgress

    return PullProgress(err_console)


def print_model_list(models) -> None:
    """`localllm list`: NAME, SIZE, QUANT, ARCH, MODIFIED as plain aligned columns (never wrapped, so the
    output can be cut and grepped); a file that is not a valid model has its problem on the next line."""
    rows = [("NAME", "SIZE", "QUANT", "ARCH", "MODIFIED")]
    problems = {}
    for m in models:
        modified = m.modified.astimezone().strftime("%Y-%m-%d %H:%M") if m.modified else (m.problem or "-")
        rows.append((f"{m.name} (default)" if m.default else m.name, human_bytes(m.size), m.quant or "-",
                     m.arch or "-", modified))
        if m.problem and m.modified is not None:
            problems[len(rows) - 1] = m.problem
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1]), *(c.ljust(w) for c, w in zip(row[2:], widths[2:]))]
        sys.stdout.write("   ".join(cells).rstrip() + "\n")
        if index in problems:
            sys.stdout.write(f"  ^ not a usable model: {problems[index]}\n")


def print_template_and_sampling(template: dict, sampling: dict) -> None:
    """`show`: where the chat template comes from, its text, and the default sampling settings."""
    origin = "from the file" if template["origin"] == "file" else f"built-in '{template['name']}' (the file has none)"
    console.print(f"[bold]chat template[/bold] {origin}")
    console.print(template["text"], markup=False, highlight=False, soft_wrap=True)
    console.print("[bold]default sampling[/bold]")
    console.print("  " + "  ".join(f"{k}={v}" for k, v in sampling.items()), markup=False)


def print_registry_entry(info: dict) -> None:
    """`show NAME` for a registry model that is not downloaded: what `pull` would fetch."""
    if info["supported"]:
        console.print(f"[bold]{info['name']}[/bold] (not downloaded: `localllm pull {info['name']}`)")
    else:
        console.print(f"[bold]{info['name']}[/bold] (architecture {info['arch']} is not supported by localllm yet)")
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key in ("repo", "file", "family", "license", "arch", "supported"):
        table.add_row(key, str(info[key]))
    table.add_row("quants", ", ".join(f"{q['quant']} ({q['size_gb']:.2f} GB)" for q in info["quants"]))
    console.print(table)
