"""Rich progress bars for `localllm pull`: size, speed and ETA, fed through the library's progress hook.

The library (localllm.hub.pull) never imports rich: it calls `progress(description, total, done)` for each
bar it wants (the download, then the checksum pass) and `update(n)` on what that returns.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class PullProgress:
    """A context manager that is also the library's progress factory; bars go to stderr.

    Not on a terminal (a log, a pipe) it draws nothing: stderr then carries only errors, one line each.
    The display starts with the first bar, so a pull that fails before downloading shows none.
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False)
        self.bars_opened = 0
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.console.is_terminal,
        )
        self._started = False

    def __enter__(self) -> "PullProgress":
        return self

    def __exit__(self, *exc) -> None:
        if self._started:
            self._progress.stop()

    def __call__(self, description: str, total: int, done: int) -> "_Bar":
        if not self._started:
            self._progress.start()
            self._started = True
        self.bars_opened += 1
        task = self._progress.add_task(description, total=total or None, completed=done)
        return _Bar(self._progress, task)


class _Bar:
    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress = progress
        self._task = task

    def update(self, n: int) -> None:
        self._progress.advance(self._task, n)

    def close(self) -> None:
        self._progress.refresh()  # the finished bar stays on screen
