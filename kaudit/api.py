"""kaudit's Python API. The CLI is a thin layer over these two functions.

    import kaudit
    findings = kaudit.scan_source(code, path="kernel.py")      # one in-memory kernel, milliseconds
    report = kaudit.scan_paths(["runs/"], kaudit.Config(jobs=2))
    report.to_dict()                                             # the JSON the CLI prints
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kaudit import __version__
from kaudit.baseline import load_baseline, mark_findings
from kaudit.cache import ResultCache
from kaudit.config import Config, ConfigError
from kaudit.discover import WorkItem, discover
from kaudit.engine import FileResult, scan_file, scan_text, scanning
from kaudit.findings import Finding, ScanError
from kaudit.results import BaselineTimings, ResultTrees, Submission
from kaudit.verdicts import Verdict, judge, summarize

#: below this many files per worker, starting processes costs more than it saves
_FILES_PER_WORKER = 8


@dataclass
class Report:
    """The outcome of a scan: plain data, serialisable with `to_dict()`."""

    findings: list[Finding] = field(default_factory=list)
    files_scanned: int = 0
    files_skipped: int = 0
    errors: list[ScanError] = field(default_factory=list)
    #: one per scanned kernel: what its benchmark run claimed and whether to trust it
    verdicts: list[Verdict] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

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
            "verdicts": [v.to_dict() for v in self.verdicts],
            "summary": self.summary,
        }


def scan_source(text: str | bytes, path: str = "kernel.py", config: Config | None = None
                ) -> list[Finding]:
    """Audit one kernel held in memory. Nothing is read from disk except `sources=[...]` files."""
    return scan_text(text, path, config or Config()).findings


def scan_paths(paths: Iterable[str], config: Config | None = None,
               on_file: Callable[[int, int], None] | None = None) -> Report:
    """Audit files, folders and benchmark result trees.

    Raises FileNotFoundError if a path does not exist and ConfigError for unusable options
    (a baseline or timings file that cannot be read). `on_file(done, total)` is called after each
    file, for progress display.
    """
    config = config or Config()
    items, errors = discover(list(paths))
    trees = ResultTrees()
    items = trees.annotate(items)
    report = Report(errors=errors + trees.errors)
    try:
        timings = BaselineTimings.load(config.baseline_timings) if config.baseline_timings else None
        known = load_baseline(config.baseline) if config.baseline else None
    except (OSError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
    for done, (item, result) in enumerate(_results(items, config), start=1):
        if known is not None:
            result.findings = mark_findings(result.findings, known)
        report.add(result)
        if not result.skipped:
            report.verdicts.append(judge(item.display, item.submission or Submission("plain"),
                                         result.findings, timings, config.suspicious_speedup))
        if on_file is not None:
            on_file(done, len(items))
    report.summary = summarize(report.verdicts)
    return report


def _scan_item(job: tuple[WorkItem, Config]) -> FileResult:
    item, config = job
    if item.text is not None:
        return scan_text(item.text, item.display, config) if "ModelNew" in item.text \
            else FileResult(item.display, skipped=True)
    return scan_file(item.file, item.display, item.explicit, config)


def _results(items: list[WorkItem], config: Config) -> Iterator[tuple[WorkItem, FileResult]]:
    """Results in the order of `items`: cached ones first looked up, the rest scanned (in worker
    processes when there are enough of them)."""
    cache = ResultCache(config.cache_dir, config) if config.cache_dir else None
    try:
        keys = [cache.key(item) if cache else None for item in items]
        cached = [cache.get(key) if cache and key else None for key in keys]
        missing = [i for i, hit in enumerate(cached) if hit is None]
        scanned = _scan(items, missing, config)
        for i, item in enumerate(items):
            result = cached[i]
            if result is None:
                result = next(scanned)
                if cache and keys[i]:
                    cache.put(keys[i], result)
            yield item, result
    finally:
        if cache:
            cache.close()


def _scan(items: list[WorkItem], indices: list[int], config: Config) -> Iterator[FileResult]:
    work = [(items[i], config) for i in indices]
    if not work:
        return
    jobs = min(config.jobs, max(1, len(work) // _FILES_PER_WORKER))
    with scanning(config):
        if jobs <= 1:
            yield from map(_scan_item, work)
            return
        # fork: workers inherit the loaded rules and grammars; the static pass runs no kernel code.
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            yield from pool.imap(_scan_item, work, chunksize=max(1, min(32, len(work) // (jobs * 4))))
