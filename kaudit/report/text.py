"""Readable output: findings grouped by file, each with its source line and a caret; colour only
when the console is a terminal (rich decides)."""

from __future__ import annotations

from collections import Counter
from itertools import groupby
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kaudit.api import Report
from kaudit.findings import Finding
from kaudit.source import split_lines

STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}


def render(report: Report, console: Console) -> None:
    lines_cache: dict[str, list[str]] = {}
    for path, group in groupby(report.findings, key=lambda f: f.path):
        console.print(f"[bold]{escape(path)}[/bold]")
        for finding in group:
            _finding(console, finding, _lines(path, lines_cache))
        console.print()
    if any(v.submission.layout != "plain" for v in report.verdicts):
        _verdict_tables(report, console)
    for error in report.errors:
        kind = "internal error" if error.internal else "error"
        console.print(f"[bold red]{kind}[/bold red]: {escape(error.path)}: {escape(error.message)}")
    console.print(summary(report))


def _verdict_tables(report: Report, console: Console) -> None:
    """One table per benchmark run: what each kernel claimed and whether to trust it."""
    runs: dict[str | None, list] = {}
    for verdict in report.verdicts:
        runs.setdefault(verdict.submission.run, []).append(verdict)
    figures = {row["key"]: row for row in report.summary.get("runs", [])}
    for run, verdicts in runs.items():
        row = figures.get(run, {})
        table = Table("kernel", "level", "problem", "sample", "claimed", "speedup", "verdict",
                      "reasons", title=f"run {run or '(none)'}: {row.get('surviving', 0)} of "
                      f"{row.get('claimed_correct', 0)} correctness claims survive",
                      title_justify="left")
        for verdict in verdicts:
            s = verdict.submission
            claimed = {True: "correct", False: "incorrect", None: "-"}[s.claim.correctness]
            style = {"rejected": "bold red", "suspicious": "yellow", "trusted": "green"}
            table.add_row(escape(verdict.path), _cell(s.level), _cell(s.problem), _cell(s.sample),
                          claimed, "-" if verdict.speedup is None else f"{verdict.speedup:.2f}x",
                          f"[{style[verdict.verdict]}]{verdict.verdict}[/]",
                          escape(", ".join(verdict.reasons)))
        console.print(table)
        console.print()


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def summary(report: Report) -> str:
    levels = Counter(f.level.value for f in report.findings)
    counts = ", ".join(f"{levels[k]} {k}{'s' if levels[k] != 1 else ''}"
                       for k in ("error", "warning", "note") if levels[k])
    total = len(report.findings)
    text = f"{total} finding{'s' if total != 1 else ''}" + (f" ({counts})" if counts else "")
    text += f" in {report.files_scanned} file{'s' if report.files_scanned != 1 else ''} scanned"
    if report.files_skipped:
        text += f", {report.files_skipped} skipped (no ModelNew)"
    if report.errors:
        text += f", {len(report.errors)} error{'s' if len(report.errors) != 1 else ''}"
    return text


def _finding(console: Console, finding: Finding, lines: list[str]) -> None:
    loc = finding.location
    level = finding.level.value
    console.print(
        f"  {escape(finding.path)}:{loc.line}:{loc.column}: "
        f"[{STYLE[level]}]{finding.rule}[/{STYLE[level]}] [dim]{level}[/dim] "
        f"{escape(finding.message)} [dim]({finding.name})[/dim]",
        soft_wrap=True)
    if 0 < loc.line <= len(lines):
        source = "".join(ch if ch.isprintable() else "\N{REPLACEMENT CHARACTER}"
                         for ch in lines[loc.line - 1].expandtabs(4))
        width = max(1, (loc.end_column - loc.column) if loc.end_line == loc.line else
                    len(source.rstrip()) - loc.column + 1)
        gutter = f"{loc.line:>6} | "
        console.print(f"[dim]{gutter}[/dim]{escape(source.rstrip())}", soft_wrap=True, highlight=False)
        console.print(" " * (len(gutter) + loc.column - 1) + f"[{STYLE[level]}]{'^' * width}[/]",
                      soft_wrap=True)
    if finding.metrics.get("artifact"):
        console.print(f"{' ' * 9}[dim]picture:[/dim] {escape(str(finding.metrics['artifact']))}",
                      soft_wrap=True, highlight=False)


def _lines(path: str, cache: dict[str, list[str]]) -> list[str]:
    if path not in cache:
        try:
            cache[path] = split_lines(Path(path).read_text(encoding="utf-8-sig", errors="replace"))
        except OSError:
            cache[path] = []
    return cache[path]
