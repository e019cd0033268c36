"""kaudit's Python API. The CLI is a thin layer over these two functions.

    import kaudit
    findings = kaudit.scan_source(code, path="kernel.py")      # one in-memory kernel, milliseconds
    report = kaudit.scan_paths(["runs/"], kaudit.Config(jobs=2))
    report.to_dict()                                             # the JSON the CLI prints
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kaudit import __version__
from kaudit.config import Config
from kaudit.discover import WorkItem, discover
from kaudit.engine import FileResult, scan_file, scan_text
from kaudit.findings import Finding, ScanError

#: below this many files per worker, starting processes costs more than it saves
_FILES_PER_WORKER = 8


@dataclass
class Report:
    """The outcome of a scan: plain data, serialisable with `to_dict()`."""

    findings: list[Finding] = field(default_factory=list)
    files_scanned: int = 0
    files_skipped: int = 0
    errors: list[ScanError] = field(default_factory=list)
    #: text of each file a finding points into, for reporters that show source lines
    sources: dict[str, list[str]] = field(default_factory=dict, repr=False)

    def add(self, result: FileResult) -> None:
        if result.skipped:
            self.files_skipped += 1
            return
        self.files_scanned += 1
        self.findings.extend(result.findings)
        self.errors.extend(result.errors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": {"name": "kaudit", "version": __version__},
            "files_scanned": self.files_scanned,
            "files_skipped": self.files_skipped,
            "findings": [f.to_dict() for f in self.findings],
            "errors": [e.to_dict() for e in self.errors],
        }


def scan_source(text: str | bytes, path: str = "kernel.py", config: Config | None = None
                ) -> list[Finding]:
    """Audit one kernel held in memory. Nothing is read from disk except `sources=[...]` files."""
    return scan_text(text, path, config or Config()).findings


def scan_paths(paths: Iterable[str], config: Config | None = None,
               on_file: Callable[[int, int], None] | None = None) -> Report:
    """Audit files and folders. Raises FileNotFoundError if a path does not exist.

    `on_file(done, total)` is called after each file, for progress display.
    """
    config = config or Config()
    items, errors = discover(list(paths))
    report = Report(errors=errors)
    for done, result in enumerate(_results(items, config), start=1):
        report.add(result)
        if on_file is not None:
            on_file(done, len(items))
    return report


def _scan_item(job: tuple[WorkItem, Config]) -> FileResult:
    item, config = job
    return scan_file(item.file, item.display, item.explicit, config)


def _results(items: list[WorkItem], config: Config) -> Iterable[FileResult]:
    jobs = min(config.jobs, max(1, len(items) // _FILES_PER_WORKER))
    work = [(item, config) for item in items]
    if jobs <= 1:
        yield from map(_scan_item, work)
        return
    # fork: workers inherit the parsed rules and grammars; the static pass runs no kernel code.
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from pool.imap(_scan_item, work, chunksize=max(1, min(32, len(work) // (jobs * 4))))
