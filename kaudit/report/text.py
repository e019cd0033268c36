"""Readable output: findings grouped by file, each with its source line and a caret; a table per
benchmark run; colour only when the console is a terminal (rich decides). User text is escaped:
the console must come from `kaudit.report.console.make_console` (no emoji codes)."""

from __future__ import annotations

import os
from collections import Counter
from itertools import groupby
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from kaudit.report.model import Report
from kaudit.discover import natural_key
from kaudit.findings import Finding
from kaudit.source import split_lines
from kaudit.verdicts import VERDICTS, Verdict

STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}
VERDICT_STYLE = {"claimed-incorrect": "dim", "rejected": "bold red", "unverified": "magenta",
                 "suspicious": "yellow", "trusted": "green"}
BASELINE_STYLE = {"new": "bold", "unchanged": "dim"}
#: the width the verdict tables' other columns take (with borders and 16 for reasons)
_OTHER_COLUMNS = 96
_KERNEL_MIN_WIDTH = 16


def render(report: Report, console: Console) -> None:
    lines_cache: dict[str, list[str]] = {}
    for path, group in groupby(report.findings, key=lambda f: f.path):
        console.print(f"[bold]{escape(path)}[/bold]", soft_wrap=True)
        for finding in group:
            _finding(console, finding, _lines(path, lines_cache))
        console.print()
    tables = any(v.submission.layout != "plain" for v in report.verdicts)
    if tables:
        _verdict_tables(report, console)
    for error in report.errors:
        kind = "internal error" if error.internal else "error"
        console.print(f"[bold red]{kind}[/bold red]: {escape(error.path)}: {escape(error.message)}",
                      soft_wrap=True)
    if tables or "dynamic" in report.summary:
        console.print(escape(verdict_line(report)), soft_wrap=True)
        if verified_line(report):
            console.print(escape(verified_line(report)), soft_wrap=True)
        if _temp_line(report):
            console.print(escape(_temp_line(report)), soft_wrap=True)
    console.print(escape(summary(report)), soft_wrap=True)


def _temp_line(report: Report) -> str:
    """The dynamic pass's temporary disk: the peak its jobs' folders reached, and the limit."""
    temp = (report.summary.get("dynamic") or {}).get("temp") or {}
    if not temp.get("peak_bytes"):
        return ""
    from kaudit.dynamic.limits import format_size

    limit = temp.get("limit_bytes")
    return f"temporary disk: peak {format_size(temp['peak_bytes'])}" + (
        f" of the {format_size(limit)} limit (--temp-limit)" if limit else ", no limit")


def _verdict_tables(report: Report, console: Console) -> None:
    """One table per benchmark run: what each kernel claimed and whether to trust it."""
    runs: dict[str | None, list[Verdict]] = {}
    for verdict in report.verdicts:
        runs.setdefault(verdict.submission.run, []).append(verdict)
    figures = {row["key"]: row for row in report.summary.get("runs", [])}
    for run in sorted(runs, key=lambda r: (r is None, natural_key(str(r)))):
        verdicts = sorted(runs[run], key=lambda v: natural_key(v.path))
        row = figures.get(run, {})
        folder = _common_folder([v.path for v in verdicts])
        shown = [os.path.relpath(v.path, folder) if folder else v.path for v in verdicts]
        where = f"; kernels in {folder}{os.sep}" if folder else ""
        # the kernel column keeps its width (up to a point) and reasons wrap: the tail of a
        # path is what tells two kernels apart
        # the kernel column as wide as its paths while the rest fits (longer ones fold, never
        # lose their tail: it tells kernels apart); reasons wrap
        width = max(_KERNEL_MIN_WIDTH, min(max(map(len, shown)), console.width - _OTHER_COLUMNS))
        table = Table(Column("kernel", overflow="fold", width=width),
                      *(Column(name, no_wrap=True) for name in (
                          "level", "problem", "sample", "claimed", "speedup", "verdict")),
                      "reasons")
        for verdict, path in zip(verdicts, shown):
            s = verdict.submission
            table.add_row(escape(path), _cell(s.level), _cell(s.problem), _cell(s.sample),
                          escape(s.claim.said), _speedups(verdict),
                          f"[{VERDICT_STYLE[verdict.verdict]}]{verdict.verdict}[/]",
                          escape(", ".join(verdict.reasons)))
        console.print(escape(f"run {run or '(none)'}: {row.get('surviving', 0)} of "
                             f"{row.get('claimed_correct', 0)} correctness claims survive{where}"),
                      soft_wrap=True)
        console.print(table)
        console.print(escape(_figures_caption(row)), soft_wrap=True)
        console.print()


def _common_folder(paths: list[str]) -> str:
    """The folder all `paths` share, so that rows show what tells them apart."""
    folders = [os.path.dirname(p.partition("#L")[0]) for p in paths]  # a JSONL file's folder
    try:
        common = os.path.commonpath(folders) if all(folders) else ""
    except ValueError:  # absolute and relative paths mixed
        return ""
    return common


def _figures_caption(row: dict) -> str:
    def speed(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    counts = ", ".join(f"{row[name.replace('-', '_')]} {name}" for name in VERDICTS
                       if row.get(name.replace("-", "_")))
    fast = "-" if row.get("fast_1") is None else f"{row['fast_1']:.0%}"
    return (f"{counts}; median speedup claimed {speed(row.get('median_claimed_speedup'))}, "
            f"surviving {speed(row.get('median_surviving_speedup'))}; fast_1 {fast}"
            + verified_caption(row))


def verified_caption(row: dict) -> str:
    """The verified figures (`--timing`), when something was measured."""
    if row.get("fast_1_verified") is None:
        return ""
    median = row.get("median_verified_speedup")
    return (f"; verified median speedup {'-' if median is None else f'{median:.2f}x'}, "
            f"fast_1 verified {row['fast_1_verified']:.0%}")


def _speedups(verdict: Verdict) -> str:
    """The claimed speedup, and what --timing measured: `5.00x / 1.02x`."""
    claimed = "-" if verdict.speedup is None else f"{verdict.speedup:.2f}x"
    if verdict.measured:
        return f"{claimed} / {verdict.measured['speedup']:.2f}x"
    return claimed


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def verdict_line(report: Report) -> str:
    """The kernels' verdicts in one line (claimed-incorrect and unverified counted apart)."""
    total = report.summary.get("total", {})
    counts = ", ".join(f"{total.get(name.replace('-', '_'), 0)} {name}" for name in VERDICTS)
    kernels = total.get("kernels", 0)
    return f"{kernels} kernel{'s' if kernels != 1 else ''}: {counts}"


def verified_line(report: Report) -> str:
    """Claimed versus verified speedups over all kernels, when --timing measured any."""
    total = report.summary.get("total", {})
    caption = verified_caption(total)
    if not caption:
        return ""
    claimed = total.get("median_claimed_speedup")
    return (f"speedups: median claimed {'-' if claimed is None else f'{claimed:.2f}x'}"
            + caption)


def summary(report: Report) -> str:
    levels = Counter(f.level.value for f in report.findings)
    counts = ", ".join(f"{levels[k]} {k}{'s' if levels[k] != 1 else ''}"
                       for k in ("error", "warning", "note") if levels[k])
    total = len(report.findings)
    text = f"{total} finding{'s' if total != 1 else ''}" + (f" ({counts})" if counts else "")
    if any(f.baseline_state for f in report.findings):
        new = sum(f.baseline_state == "new" for f in report.findings)
        text += f", {new} new against the baseline"
    text += f" in {report.files_scanned} file{'s' if report.files_scanned != 1 else ''} scanned"
    if report.files_skipped:
        text += f", {report.files_skipped} skipped (no ModelNew)"
    if report.errors:
        text += f", {len(report.errors)} error{'s' if len(report.errors) != 1 else ''}"
    hidden = [(k, report.hidden[k]) for k in ("error", "warning", "note") if report.hidden.get(k)]
    if hidden:
        lowest = hidden[-1][0]
        text += "; not shown: " + ", ".join(f"{n} {k}{'s' if n != 1 else ''}" for k, n in hidden) \
            + f" (--min-level {lowest} shows them)"
    return text


def _finding(console: Console, finding: Finding, lines: list[str]) -> None:
    loc = finding.location
    level = finding.level.value
    state = finding.baseline_state
    mark = f" [{BASELINE_STYLE[state]}]{state}[/]" if state else ""
    console.print(
        f"  {escape(finding.path)}:{loc.line}:{loc.column}: "
        f"[{STYLE[level]}]{finding.rule}[/{STYLE[level]}] [dim]{level}[/dim]{mark} "
        f"{escape(finding.message)} [dim]({finding.name})[/dim]",
        soft_wrap=True)
    if 0 < loc.line <= len(lines):
        source = "".join(ch if ch.isprintable() else "\N{REPLACEMENT CHARACTER}"
                         for ch in lines[loc.line - 1].expandtabs(4))
        width = max(1, (loc.end_column - loc.column) if loc.end_line == loc.line else
                    len(source.rstrip()) - loc.column + 1)
        gutter = f"{loc.line:>6} | "
        console.print(f"[dim]{gutter}[/dim]{escape(source.rstrip())}", soft_wrap=True)
        console.print(" " * (len(gutter) + loc.column - 1) + f"[{STYLE[level]}]{'^' * width}[/]",
                      soft_wrap=True)
    if finding.metrics.get("artifact"):
        console.print(f"{' ' * 9}[dim]picture:[/dim] {escape(str(finding.metrics['artifact']))}",
                      soft_wrap=True)


def _lines(path: str, cache: dict[str, list[str]]) -> list[str]:
    if path not in cache:
        try:
            cache[path] = split_lines(Path(path).read_text(encoding="utf-8-sig", errors="replace"))
        except OSError:
            cache[path] = []
    return cache[path]
