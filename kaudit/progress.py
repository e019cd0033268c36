"""Progress on stderr that short runs never show. On a terminal: a transient bar once the work has
run for a second. Elsewhere (a CI log, a pipe): once the work has run for a few seconds, one line
per finished kernel or problem, `[i/N] PATH RESULT SECONDSs`, flushed at once, so that a log shows
how far a long run got even when it is killed (lines of items finished earlier come out then)."""

from __future__ import annotations

import sys
import time

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from kaudit.report.console import make_console

#: a terminal's bar appears after this many seconds
BAR_AFTER_S = 1.0
#: a log's lines appear after this many seconds
LINES_AFTER_S = 3.0


class DelayedProgress:
    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.monotonic()
        self.console = make_console(stderr=True)
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        #: lines of items finished before LINES_AFTER_S, printed once it has passed
        self.waiting: list[str] | None = []

    def update(self, done: int, total: int) -> None:
        """The bar only (a terminal); for work whose items are too quick for a line each."""
        if self.bar is None:
            if not self.console.is_terminal or time.monotonic() - self.started < BAR_AFTER_S:
                return
            self.bar = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total)
        assert self.task is not None
        self.bar.update(self.task, completed=done)

    def finished(self, done: int, total: int, path: str, result: str, seconds: float) -> None:
        """Item `done` of `total` finished: the bar on a terminal, a line elsewhere."""
        if self.console.is_terminal:
            self.update(done, total)
            return
        line = f"[{done}/{total}] {_printable(path)} {_printable(result)} {seconds:.1f}s\n"
        if self.waiting is not None:
            self.waiting.append(line)
            if time.monotonic() - self.started < LINES_AFTER_S:
                return
            line, self.waiting = "".join(self.waiting), None
        sys.stderr.write(line)
        sys.stderr.flush()

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _printable(text: str) -> str:
    """One line whatever a path holds: control characters written as escapes."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
