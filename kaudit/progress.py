"""A progress bar on stderr that appears only on a terminal, once the work has run for a second
(short runs and logs stay clean)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


class DelayedProgress:
    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.monotonic()
        self.console = Console(stderr=True)
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def update(self, done: int, total: int) -> None:
        if self.bar is None:
            if not self.console.is_terminal or time.monotonic() - self.started < 1.0:
                return
            self.bar = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total)
        assert self.task is not None
        self.bar.update(self.task, completed=done)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
