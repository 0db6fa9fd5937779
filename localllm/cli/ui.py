"""All rich output of the CLI lives here.

Text that comes from a file or the network (metadata strings, chat templates, tensor and model names,
file names, error messages that quote them) is printed through `terminal_safe` (control characters such as
ESC, BEL and CR, which drive the terminal, written as escapes) and `markup_safe` (also rich's
`[style]` markup escaped) or as rich `Text`, which rich never parses for markup; also into a pipe.

Not on a terminal (a file, a pipe), the consoles neither wrap lines at 80 columns nor pad them with
trailing spaces: what reaches the file is one line per logical line.
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any

from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..errors import escape_unprintable

_UNWRAPPED_WIDTH = 1 << 14  # the width rich lays out for when writing to a file: no line is cut


def terminal_safe(text: Any, keep_newlines: bool = False) -> str:
    """`text` with every character that is not printable (ESC, BEL, CR, other C0/C1 controls, bidi
    overrides...) written as its Python escape (`\\x1b`, `\\r`, `\\u202e`); newlines and tabs too,
    unless `keep_newlines` (multi-line text such as a chat template)."""
    return escape_unprintable(str(text), "\n\t" if keep_newlines else "")


def markup_safe(text: Any, keep_newlines: bool = False) -> str:
    """`terminal_safe(text)` with rich markup (`[bold red]`, `[link=...]`) escaped too: for text that is
    put inside a markup string or a table cell."""
    return escape(terminal_safe(text, keep_newlines))


class _UnpaddedLines:
    """A text stream that drops the spaces rich pads lines with (table cells) at the end of each line."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        lines = text.split("\n")
        # The last piece is a line still open (a prompt printed with end=""): kept as it is.
        self._stream.write("\n".join([line.rstrip(" ") for line in lines[:-1]] + lines[-1:]))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, encoding, fileno ...
        return getattr(self._stream, name)


class _Console(Console):
    """A rich Console that decides at each print whether its stream is a terminal (tests and callers
    swap sys.stdout after import): on a terminal as rich does; elsewhere no wrapping and no trailing
    spaces."""

    def _raw_file(self) -> IO[str]:
        return Console.file.fget(self)

    def _writes_to_terminal(self) -> bool:
        isatty = getattr(self._raw_file(), "isatty", None)
        return bool(isatty and isatty())

    @property
    def file(self) -> IO[str]:
        raw = self._raw_file()
        return raw if self._writes_to_terminal() else _UnpaddedLines(raw)

    @file.setter
    def file(self, new_file: IO[str]) -> None:
        self._file = new_file

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        return size if self._writes_to_terminal() else ConsoleDimensions(_UNWRAPPED_WIDTH, size.height)

    @size.setter
    def size(self, new_size) -> None:
        Console.size.fset(self, new_size)


console = _Console(highlight=False)
err_console = _Console(stderr=True, highlight=False)


def notice(message: str) -> None:
    """A one-line notice on stderr (a route passing over a target)."""
    err_console.print(Text(terminal_safe(message), style="yellow"), soft_wrap=True)


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
    """`obj` as indented JSON. Non-ASCII text stays readable; what json.dumps leaves raw that is not
    printable (C1 controls such as \\x9b, a CSI; bidi overrides) is written as a \\u escape, an equal
    JSON string that cannot drive the terminal."""
    text = json.dumps(obj, indent=2, ensure_ascii=False, default=str)
    if not text.replace("\n", "").isprintable():
        text = "".join(c if c.isprintable() or c == "\n" else json.dumps(c)[1:-1] for c in text)
    sys.stdout.write(text + "\n")


def timing_summary(timings, context_used: int, n_ctx) -> str:
    """One line of a reply's timings, as chat's /stats and `run -v` print it. `timings`: generate's
    Timings; `context_used` of `n_ctx` tokens in the KV cache after the reply (n_ctx None or 0: a remote
    model's, unknown)."""
    new_tokens = timings.prompt_tokens - timings.cached_tokens
    prompt_rate = new_tokens / timings.prompt_seconds if timings.prompt_seconds > 0 else 0.0
    line = (
        f"time to first token {timings.time_to_first_token:.2f} s · prompt {new_tokens} new tokens "
        f"({timings.cached_tokens} cached) at {prompt_rate:.1f} tok/s · reply {timings.generated_tokens} tokens at "
        f"{timings.generation_tps:.1f} tok/s · context {context_used}" + (f"/{n_ctx}" if n_ctx else " tokens")
    )
    drafted = getattr(timings, "draft_tokens", 0)
    if drafted:  # speculative decoding: how many drafted tokens the model kept
        line += f" · drafts {timings.draft_accepted}/{drafted} accepted ({100 * timings.draft_accepted / drafted:.0f}%)"
    return line


def print_model_summary(info: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("file", info["path"]),
        ("architecture", info["architecture"]),
        ("name", info["name"]),
        ("parameters", human_count(info["parameters"])),
        ("experts", f"{info['n_expert']}, {info['n_expert_used']} per token" if info.get("n_expert") else None),
        ("per token", f"{human_count(info['active_parameters'])} parameters active, {human_bytes(info['bytes_per_token'])} "
                      "of weights read" if info.get("n_expert") else None),
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
            table.add_row(key, Text(terminal_safe(value)))
    console.print(table)
    mix = Table(title="quant mix", title_justify="left")
    mix.add_column("type")
    mix.add_column("tensors", justify="right")
    mix.add_column("size", justify="right")
    for name, entry in info["quant_mix"].items():
        mix.add_row(Text(terminal_safe(name)), str(entry["tensors"]), human_bytes(entry["bytes"]))
    console.print(mix)


def print_tensors(reader) -> None:
    table = Table(title="tensors", title_justify="left")
    for column in ("name", "type", "shape (ggml order)", "size"):
        table.add_column(column)
    for tensor in reader.tensors.values():
        table.add_row(Text(terminal_safe(tensor.name)), tensor.ggml_type.name, " x ".join(map(str, tensor.shape)),
                      human_bytes(tensor.nbytes))
    console.print(table)


def status(message: str) -> None:
    """A progress line on stderr (stdout stays clean for results)."""
    err_console.print(f"[dim]{markup_safe(message)}…[/dim]")


def bench_table(results) -> None:
    """llama-bench's table: model, size, params, backend, threads, test, t/s (mean ± sd)."""
    table = Table(box=None, header_style="bold")
    for column in ("model", "size", "params", "backend", "threads", "test", "t/s"):
        table.add_column(column, justify="right" if column not in ("model", "backend") else "left")
    for r in results:
        test = r.test + (f" ({100 * r.draft_acceptance:.0f}% kept)" if getattr(r, "speculation", "") and not r.n_prompt else "")
        table.add_row(
            Text(terminal_safe(r.model_type)), human_bytes(r.model_size), human_count(r.n_params), r.backend, str(r.n_threads),
            test, f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}",
        )
    console.print(table)


# -- names: list, rm, show, pull on first use ------------------------------------------------------------------


def is_interactive() -> bool:
    return sys.stdin.isatty() and sys.stderr.isatty()


def confirm(question: str) -> bool:
    """Ask a yes/no question on the terminal; anything but y/yes is no (Ctrl-D too). The question is plain
    text (it names models and files): `[y/N]` and any brackets in it print as they are."""
    err_console.print(Text(f"{terminal_safe(question)} [y/N] "), end="")
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
        name = terminal_safe(m.name)
        rows.append((f"{name} (default)" if m.default else name, human_bytes(m.size), terminal_safe(m.quant or "-"),
                     terminal_safe(m.arch or "-"), terminal_safe(modified)))
        if m.problem and m.modified is not None:
            problems[len(rows) - 1] = terminal_safe(m.problem)
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1]), *(c.ljust(w) for c, w in zip(row[2:], widths[2:]))]
        sys.stdout.write("   ".join(cells).rstrip() + "\n")
        if index in problems:
            sys.stdout.write(f"  ^ not a usable model: {problems[index]}\n")


def print_remote_list(entries) -> None:
    """`localllm list`'s remote models, after the local ones: NAME (remote), the engine's URL and model."""
    if not entries:
        return
    rows = [(f"{terminal_safe(e['name'])} (remote)", terminal_safe(e["url"]), terminal_safe(e["model"] or "(its first)"),
             "via " + terminal_safe(" -> ".join(e["route"])) if e.get("route") else "") for e in entries]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        sys.stdout.write("   ".join([*(c.ljust(w) for c, w in zip(row, widths)), row[3]]).rstrip() + "\n")


def print_template_and_sampling(template: dict, sampling: dict) -> None:
    """`show`: where the chat template comes from, its text, and the default sampling settings."""
    origin = "from the file" if template["origin"] == "file" else f"built-in '{template['name']}' (the file has none)"
    console.print(f"[bold]chat template[/bold] {markup_safe(origin)}")
    console.print(Text(terminal_safe(template["text"], keep_newlines=True)), highlight=False, soft_wrap=True)
    console.print("[bold]default sampling[/bold]")
    console.print(Text("  " + "  ".join(f"{k}={terminal_safe(v)}" for k, v in sampling.items())))


def print_registry_entry(info: dict) -> None:
    """`show NAME` for a registry model that is not downloaded: what `pull` would fetch."""
    name = markup_safe(info["name"])
    if info["supported"]:
        console.print(f"[bold]{name}[/bold] (not downloaded: `localllm pull {name}`)")
    else:
        console.print(f"[bold]{name}[/bold] (architecture {markup_safe(info['arch'])} is not supported by localllm yet)")
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key in ("repo", "file", "family", "license", "arch", "supported"):
        table.add_row(key, Text(terminal_safe(info[key])))
    table.add_row("quants", Text(terminal_safe(", ".join(f"{q['quant']} ({q['size_gb']:.2f} GB)" for q in info["quants"]))))
    console.print(table)
