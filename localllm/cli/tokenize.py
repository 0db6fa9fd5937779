"""`localllm tokenize MODEL [TEXT]`: token ids (and pieces) of a text, from the model's vocabulary."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from . import ui


def tokenize(
    model: Optional[str] = typer.Argument(..., help="Model path or name (a vocab-only GGUF works)."),
    text: Optional[str] = typer.Argument(None, help="Text to tokenize (or --file, or stdin with --jsonl)."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Read the text from a file."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON array of ids."),
    jsonl: bool = typer.Option(False, "--jsonl", help="Read one JSON string per stdin line, write one JSON array per line."),
    no_bos: bool = typer.Option(False, "--no-bos", help="Do not add BOS even if the model wants it."),
    special: bool = typer.Option(False, "--special", help="Recognise special-token strings in the text."),
) -> None:
    """Print the token ids of TEXT."""
    from ..gguf import GGUFReader
    from ..hub.resolve import resolve_model
    from ..tokenizer import Tokenizer

    with GGUFReader(resolve_model(model)) as reader:
        tok = Tokenizer.from_metadata(reader.metadata)
    add_bos = False if no_bos else None
    if jsonl:
        for n, line in enumerate(sys.stdin, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise typer.BadParameter(f"stdin line {n}: not JSON ({exc.msg})") from None
            if not isinstance(value, str):
                raise typer.BadParameter(f"stdin line {n}: expected a JSON string")
            sys.stdout.write(json.dumps(tok.encode(value, add_bos=add_bos, parse_special=special)) + "\n")
        return
    if file is not None:
        text = _read_text(file)
    if text is None:
        raise typer.BadParameter("give TEXT, --file, or --jsonl")
    ids = tok.encode(text, add_bos=add_bos, parse_special=special)
    if json_out:
        sys.stdout.write(json.dumps(ids) + "\n")
        return
    for token_id in ids:
        piece = tok.token_to_piece(token_id).decode("utf-8", errors="backslashreplace")
        ui.console.print(f"{token_id:>8} {piece!r}", markup=False)


def _read_text(path: Path) -> str:
    """The file's text; a missing or unreadable file is an OSError, worded by cli/errors.py as everywhere."""
    from ..errors import LocalLLMError

    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise LocalLLMError(f"{path}: not UTF-8 text (byte {exc.start})") from None
