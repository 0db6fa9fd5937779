"""All rich output of the CLI lives here."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
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
