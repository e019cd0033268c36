"""A Markdown summary for `$GITHUB_STEP_SUMMARY` or a pull-request comment."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kaudit import __version__
from kaudit.api import Report
from kaudit.findings import Finding
from kaudit.rule import Rule

MAX_ROWS = 50


def render(report: Report, folder: str | None = None) -> str:
    """`folder`: where the Markdown goes, so that links to pictures are relative to it; None:
    links as the findings give them."""
    total = report.summary.get("total", {})
    lines = [f"## kaudit {__version__}", ""]
    levels = Counter(f.level.value for f in report.findings)
    new = sum(f.baseline_state == "new" for f in report.findings)
    plural = "" if report.files_scanned == 1 else "s"
    lines.append(f"{report.files_scanned} kernel{plural} scanned ({report.files_skipped} skipped): "
                 f"{levels['error']} errors, {levels['warning']} warnings, {levels['note']} notes"
                 + (f", {new} new against the baseline" if any(
                     f.baseline_state for f in report.findings) else "") + ".")
    lines.append("")
    if total:
        lines += ["| verdict | kernels |", "|---|---|"]
        lines += [f"| {name} | {total[name]} |" for name in ("trusted", "suspicious", "rejected")]
        lines.append("")
    for title, rows in (("Per run", report.summary.get("runs", [])),
                        ("Per level", report.summary.get("levels", []))):
        if any(row["key"] is not None for row in rows):
            lines += [f"### {title}", "", _figures_header(), "|---|---|---|---|---|---|---|"]
            lines += [_figures_row(row) for row in rows]
            lines.append("")
    questionable = [v for v in report.verdicts if v.verdict != "trusted"]
    if questionable:
        lines += ["### Kernels not trusted", "", "| kernel | claimed | verdict | reasons |",
                  "|---|---|---|---|"]
        for verdict in questionable[:MAX_ROWS]:
            claim = verdict.submission.claim
            claimed = "correct" if claim.correctness else ("incorrect" if claim.correctness is False
                                                           else "-")
            if verdict.speedup is not None:
                claimed += f", {verdict.speedup:.2f}x"
            lines.append(f"| `{verdict.path}` | {claimed} | **{verdict.verdict}** | "
                         f"{_cell(', '.join(verdict.reasons))} |")
        if len(questionable) > MAX_ROWS:
            lines.append(f"| ... {len(questionable) - MAX_ROWS} more | | | |")
        lines.append("")
    if report.findings:
        lines += ["### Findings", "", "| location | rule | level | message |", "|---|---|---|---|"]
        for finding in report.findings[:MAX_ROWS]:
            mark = " (new)" if finding.baseline_state == "new" else ""
            lines.append(f"| `{finding.path}:{finding.line}` | {finding.rule}{mark} | "
                         f"{finding.level.value} | {_cell(finding.message)}"
                         f"{_picture(finding, folder)} |")
        if len(report.findings) > MAX_ROWS:
            lines.append(f"| ... {len(report.findings) - MAX_ROWS} more | | | |")
        lines.append("")
    for error in report.errors:
        lines.append(f"- error: `{error.path}`: {_cell(error.message)}")
    return "\n".join(lines).rstrip() + "\n"


def _figures_header() -> str:
    return ("| group | kernels | claimed correct | surviving | median claimed speedup | "
            "median surviving speedup | fast_1 |")


def _figures_row(row: dict[str, Any]) -> str:
    def speed(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    fast = "-" if row["fast_1"] is None else f"{row['fast_1']:.0%}"
    return (f"| {row['key'] if row['key'] is not None else '(none)'} | {row['kernels']} | "
            f"{row['claimed_correct']} | {row['surviving']} | "
            f"{speed(row['median_claimed_speedup'])} | {speed(row['median_surviving_speedup'])} | "
            f"{fast} |")


def _picture(finding: Finding, folder: str | None) -> str:
    path = finding.metrics.get("artifact")
    if not path:
        return ""
    target = str(path)
    if folder is not None:
        try:
            target = os.path.relpath(os.path.abspath(target), os.path.abspath(folder))
        except ValueError:  # another drive (Windows): no relative path exists
            pass
    return f" [picture]({quote(Path(target).as_posix())})"


def rules_table(rules: Iterable[type[Rule]]) -> str:
    """The rules as a Markdown table (code, name, level, what it finds): the README's table."""
    lines = ["| code | name | level | what it finds |", "|---|---|---|---|"]
    for rule in rules:
        summary = rule.docs().summary.removesuffix(".")
        lines.append(f"| {rule.code} | {rule.name} | {rule.level.value} | {_cell(summary)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
