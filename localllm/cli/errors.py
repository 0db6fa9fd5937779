"""The one place where errors become messages: one line on stderr, exit 1 (2 for usage errors)."""

from __future__ import annotations

import sys

from ..errors import LocalLLMError, os_error_message

USER_ERRORS: tuple[type[BaseException], ...] = (LocalLLMError, FileNotFoundError, PermissionError, IsADirectoryError)


def report(exc: BaseException, debug: bool) -> int:
    """Print `exc` for a user and return the exit code."""
    if debug:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    from .ui import terminal_safe

    # One line that cannot drive the terminal: messages may quote a file's or the network's text.
    message = terminal_safe(str(exc) or type(exc).__name__)
    if isinstance(exc, OSError) and (exc.errno is not None or isinstance(exc, USER_ERRORS)):
        # Missing files, unwritable outputs, full disks: one wording for every command (localllm/errors.py
        # os_error_message), naming the user's path, never an errno number or a writer's temporary name.
        print(f"error: {terminal_safe(os_error_message(exc))}", file=sys.stderr)
        return 1
    if isinstance(exc, USER_ERRORS):
        print(f"error: {message}", file=sys.stderr)
        return 1
    print(f"error: unexpected {type(exc).__name__}: {message} (run with --debug for the traceback)", file=sys.stderr)
    return 1
