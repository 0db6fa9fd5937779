"""The `localllm` command: assembles the commands, nothing else (each lives in its own module)."""

from __future__ import annotations

import sys

import typer

from .. import runtime
from . import bench as bench_cmd
from . import chat as chat_cmd
from . import convert as convert_cmd
from . import embed as embed_cmd
from . import list_cmd
from . import perplexity as perplexity_cmd
from . import pull as pull_cmd
from . import quantize as quantize_cmd
from . import rm as rm_cmd
from . import run as run_cmd
from . import serve as serve_cmd
from . import show as show_cmd
from . import tokenize as tokenize_cmd
from .errors import report

app = typer.Typer(
    name="localllm",
    help="Run quantized GGUF language models locally.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"localllm {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_version, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Show full tracebacks on errors (also LOCALLLM_DEBUG=1).", envvar="LOCALLLM_DEBUG"
    ),
) -> None:
    """Run quantized GGUF language models locally."""


app.command("chat")(chat_cmd.chat)
app.command("show")(show_cmd.show)
app.command("run")(run_cmd.run)
app.command("tokenize")(tokenize_cmd.tokenize)
app.command("embed")(embed_cmd.embed)
app.command("bench")(bench_cmd.bench)
app.command("serve")(serve_cmd.serve)
app.command("list")(list_cmd.list_models)
app.command("rm")(rm_cmd.rm)
app.command("convert")(convert_cmd.convert)
app.command("perplexity")(perplexity_cmd.perplexity)
app.command("pull")(pull_cmd.pull)
app.command("quantize")(quantize_cmd.quantize)


def _usage_line(exc) -> str:
    """A usage error as one line (click prints a three-line block): the message and where help is."""
    message = exc.format_message() if callable(getattr(exc, "format_message", None)) else str(exc)
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "localllm"
    return f"error: {message} (see '{command} --help')"


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: runs the app and maps errors to one line and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or runtime.debug()
    args = [a for a in args if a != "--debug"]
    try:
        # Typer returns (not raises) the code of a typer.Exit from a command, and turns Ctrl-C into Exit(130).
        code = app(args=args, prog_name="localllm", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # click usage errors carry their own exit code
        # Typer 0.2x raises its vendored click's exceptions (not click.ClickException): known by interface.
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            print(_usage_line(exc), file=sys.stderr)
            return exc.exit_code
        return report(exc, debug)
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
