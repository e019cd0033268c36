"""kaudit's Python API. The CLI is a thin layer over these functions.

    import kaudit
    findings = kaudit.scan_source(code, path="kernel.py")      # one in-memory kernel, milliseconds
    report = kaudit.scan_paths(["runs/"], kaudit.Config(jobs=2))
    report.to_dict()                                             # the JSON the CLI prints
    report = kaudit.scan_paths(["runs/"], dynamic=kaudit.DynamicOptions(device="cuda", jobs=4))
"""

from __future__ import annotations

import multiprocessing
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from kaudit.adapters import adapt
from kaudit.baseline import load_baseline, mark_findings
from kaudit.cache import ResultCache
from kaudit.config import Config, ConfigError
from kaudit.discover import WorkItem, by_file, discover
from kaudit.engine import FileResult, scan_file, scan_text, scanning
from kaudit.entry import MODEL_NEW
from kaudit.findings import Finding
from kaudit.dynamic.options import DynamicOptions
from kaudit.report.model import KernelOutcome, Report
from kaudit.results import BaselineTimings, Submission
from kaudit.verdicts import Verdict, judge, summarize

#: below this many files per worker, starting processes costs more than it saves
_FILES_PER_WORKER = 8


def scan_source(text: str | bytes, path: str = "kernel.py", config: Config | None = None
                ) -> list[Finding]:
    """Audit one kernel held in memory. Nothing is read from disk except `sources=[...]` files."""
    return scan_text(text, path, config or Config()).findings


def scan_paths(paths: Iterable[str], config: Config | None = None,
               on_file: Callable[[int, int], None] | None = None, *,
               dynamic: DynamicOptions | None = None,
               on_kernel: Callable[[KernelOutcome], None] | None = None) -> Report:
    """Audit files, folders and benchmark result trees: discovery, the static pass, with
    `dynamic` the dynamic pass (needs torch), the baseline, verdicts and summary, once each.

    Raises FileNotFoundError if a path does not exist and ConfigError for unusable options
    (a baseline or timings file that cannot be read, an unusable device); with `dynamic`, also
    SandboxError (`sandbox="on"` where there is none) and `InstallationChanged` (kaudit's own
    files changed while jobs ran: nothing can be reported). `on_file(done, total)` is called
    after each file of the static pass, for progress display; `on_kernel(outcome)` the moment
    each kernel's verdict is final (after the static pass, or after its dynamic run).
    """
    config = config or Config()
    found = discover(list(paths))
    try:
        adapted = adapt(found, config.benchmark)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    items = adapted.items
    report = Report(errors=found.errors + adapted.errors)
    try:
        timings = BaselineTimings.load(config.baseline_timings) if config.baseline_timings else None
        known = load_baseline(config.baseline) if config.baseline else None
    except (OSError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
    # a file reached through several paths (runs sharing kernels by symlinks) is scanned once;
    # its findings are named by the scanned path and count for every path reaching it
    files = by_file(items)
    verdicts: dict[int, Verdict] = {}
    order = {id(item): position for position, item in enumerate(items)}
    reached_by = {scanned.key: reached for scanned, reached in files}
    results: dict[str, FileResult] = {}

    def final(done: int, total: int, item: WorkItem, findings: list[Finding],
              seconds: float | None = None, run: Any = None) -> None:
        """A file's findings are complete: the verdict of every path reaching it."""
        result = results[item.key]
        metrics = run.metrics if run is not None else {}
        for path in reached_by[item.key]:
            verdict = verdicts[order[id(path)]] = judge(
                path.display, path.submission or Submission("plain"), findings, timings,
                config.suspicious_speedup, file=item.display,
                incomplete=any(error.internal for error in result.errors),
                measured=metrics.get("measured"))
            if on_kernel is not None:
                on_kernel(KernelOutcome(verdict, findings, seconds,
                                        run.status if run is not None else None,
                                        bool(run is not None and run.cached), done, total,
                                        metrics.get("job_seconds"),
                                        metrics.get("gpu_memory")))

    scanned = _results([scanned for scanned, _ in files], config, report.warnings)
    to_run: list[WorkItem] = []  # what the dynamic pass runs: its verdict is final after it
    for done, (item, result) in enumerate(scanned, start=1):
        if known is not None:
            result.findings = mark_findings(result.findings, known)
        results[item.key] = result
        if not result.skipped:
            if dynamic is not None and _runs(item):
                to_run.append(item)
            else:
                final(done, len(files), item, result.findings)
        if on_file is not None:
            on_file(done, len(files))
    pass_ = None
    if dynamic is not None:
        pass_ = _dynamic_pass(to_run, dynamic, config, known, results, final)
        report.warnings += pass_.warnings
    for item, _ in files:
        result = results[item.key]
        if pass_ is not None:
            result.findings = result.findings + pass_.findings.get(item.key, [])
        report.add(result)
    report.verdicts = [verdicts[position] for position in sorted(verdicts)]
    report.summary = summarize(report.verdicts)
    if pass_ is not None:
        report.summary["dynamic"] = pass_.summary()
    return report


def _runs(item: WorkItem) -> bool:
    """Whether the dynamic pass runs this kernel (it names ModelNew, or another benchmark's
    adapter made it); read again by the pass."""
    from kaudit.dynamic.adapted import wrapped  # torch-free

    if wrapped(item):
        return True
    if item.text is not None:
        return "ModelNew" in item.text
    try:
        return "ModelNew" in Path(item.file).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # the pass reports it as not audited (KD504)


def _dynamic_pass(items: list[WorkItem], options: DynamicOptions, config: Config,
                  known: set | None, results: dict[str, FileResult],
                  final: Callable[..., None]) -> Any:
    try:
        from kaudit.dynamic.pipeline import run_pass  # torch: only from here on
    except ImportError as exc:
        raise ConfigError(f"the dynamic pass needs torch (the `dynamic` extra): {exc}") from exc

    def ended(done: int, total: int, item: WorkItem, findings: list[Finding], run: Any,
              seconds: float) -> None:
        final(done, total, item, results[item.key].findings + findings, seconds, run)

    return run_pass(items, options, config, known, ended)


def _scan_item(job: tuple[WorkItem, Config]) -> FileResult:
    item, config = job
    entry = item.submission.entry if item.submission else MODEL_NEW
    if item.text is not None:
        # a KernelBench record is a kernel when it names ModelNew; another benchmark's adapter
        # only makes items of its candidates
        return scan_text(item.text, item.display, config, entry) \
            if entry != MODEL_NEW or "ModelNew" in item.text \
            else FileResult(item.display, skipped=True)
    return scan_file(item.file, item.display, item.explicit, config, entry)


def _results(items: list[WorkItem], config: Config, warnings: list[str]
             ) -> Iterator[tuple[WorkItem, FileResult]]:
    """Results in the order of `items`: cached ones first looked up, the rest scanned (in worker
    processes when there are enough of them). A cache that cannot be used is a warning: the
    scan goes on without it."""
    cache = _open_cache(config, warnings)
    keys = [cache.key(item) if cache else None for item in items]
    try:
        cached = [cache.get(key) if cache and key else None for key in keys]
    except sqlite3.Error as exc:
        cache = _drop_cache(cache, exc, warnings)
        cached = [None] * len(items)
    missing = [i for i, hit in enumerate(cached) if hit is None]
    scanned = _scan(items, missing, config)
    try:
        for i, item in enumerate(items):
            result = cached[i]
            if result is None:
                result = next(scanned)
                if cache and keys[i]:
                    try:
                        cache.put(keys[i], result)
                    except sqlite3.Error as exc:
                        cache = _drop_cache(cache, exc, warnings)
            yield item, result
    finally:
        if cache:
            try:
                cache.close()
            except sqlite3.Error as exc:
                _drop_cache(None, exc, warnings)


def _open_cache(config: Config, warnings: list[str]) -> ResultCache | None:
    if not config.cache_dir:
        return None
    try:
        return ResultCache(config.cache_dir, config)
    except (OSError, sqlite3.Error) as exc:
        warnings.append(f"result cache {config.cache_dir} not usable ({_reason(exc)}); "
                        "scanning without it")
        return None


def _drop_cache(cache: ResultCache | None, exc: Exception, warnings: list[str]) -> None:
    warnings.append(f"result cache failed ({_reason(exc)}); going on without it")
    if cache is not None:
        cache.abandon()
    return None


def _reason(exc: Exception) -> str:
    return f"{exc.__class__.__name__}: {exc.strerror or exc}" if isinstance(exc, OSError) \
        else f"{exc.__class__.__name__}: {exc}"


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
