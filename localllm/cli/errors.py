"""The one place where errors become messages: one line on stderr, exit 1 (2 for usage errors)."""

from __future__ import annotations

import sys

from ..errors import LocalLLMError

USER_ERRORS: tuple[type[BaseException], ...] = (LocalLLMError, FileNotFoundError, PermissionError, IsADirectoryError)


def report(exc: BaseException, debug: bool) -> int:
    """Print `exc` for a user and return the exit code."""
    if debug:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    from .ui import terminal_safe

    # One line that cannot drive the terminal: messages may quote a file's or the network's text.
    message = terminal_safe(str(exc) or type(exc).__name__)
    if isinstance(exc, USER_ERRORS):
        print(f"error: {message}", file=sys.stderr)
        return 1
    print(f"error: unexpected {type(exc).__name__}: {message} (run with --debug for the traceback)", file=sys.stderr)
    return 1
