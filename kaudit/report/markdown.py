"""A Markdown summary for `$GITHUB_STEP_SUMMARY` or a pull-request comment.

User text (paths, messages, run names) is never Markdown: `text` escapes what CommonMark would
read as markup, and puts what GitHub rewrites in plain text (`:emoji:` codes, @mentions, #refs,
bare links) into code spans, which GitHub leaves alone; `code` makes a code span of any text."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kaudit import __version__
from kaudit.report.model import Report
from kaudit.discover import natural_key
from kaudit.findings import Finding
from kaudit.verdicts import TRUSTED, VERDICTS
from kaudit.rule import Rule

MAX_ROWS = 50
#: backtick code spans a message holds (kept as code spans)
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
#: plain text GitHub would turn into an emoji, a mention, an issue link or a link
_GITHUB_REWRITES = re.compile(r":[\w+-]+:|@[\w-]+|#\d+|\b(?:https?://|www\.)\S+")
#: characters CommonMark or GFM tables may read as markup inside a line (an underscore inside
#: a word never is: snake_case stays readable)
_MARKUP = re.compile(r"[\\`*\[\]<>|~&!]|(?<![^\W_])_|_(?![^\W_])")


def code(value: object) -> str:
    """A code span of `value`, on one line, safe in a table cell."""
    content = " ".join(str(value).splitlines())
    if not content:
        return ""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", content)), default=0) + 1)
    pad = " " if content[0] == "`" or content[-1] == "`" or \
        (content[0] == " " and content[-1] == " " and content.strip()) else ""
    return f"{fence}{pad}{content.replace('|', chr(92) + '|')}{pad}{fence}"


def text(value: object) -> str:
    """Plain text, on one line, safe in a table cell: its own backtick spans stay code."""
    content = " ".join(str(value).splitlines())
    out, position = [], 0
    for match in _CODE_SPAN.finditer(content):
        out.append(_plain(content[position:match.start()]))
        out.append(code(match.group(2)))
        position = match.end()
    out.append(_plain(content[position:]))
    return "".join(out)


def _plain(content: str) -> str:
    out, position = [], 0
    for match in _GITHUB_REWRITES.finditer(content):
        out.append(_escape(content[position:match.start()]))
        out.append(code(match.group()))
        position = match.end()
    out.append(_escape(content[position:]))
    return "".join(out)


def _escape(content: str) -> str:
    return _MARKUP.sub(lambda match: "\\" + match.group(), content)


def render(report: Report, folder: str | None = None) -> str:
    """`folder`: where the Markdown goes, so that links to pictures are relative to it; None:
    links as the findings give them."""
    total = report.summary.get("total", {})
    lines = [f"## kaudit {__version__}", ""]
    levels = Counter(f.level.value for f in report.findings)
    plural = "" if report.files_scanned == 1 else "s"
    head = (f"{report.files_scanned} kernel{plural} scanned ({report.files_skipped} skipped): "
            f"{levels['error']} errors, {levels['warning']} warnings, {levels['note']} notes")
    if any(f.baseline_state for f in report.findings):
        head += f", {sum(f.baseline_state == 'new' for f in report.findings)} new against the " \
                "baseline"
    hidden = [f"{n} {k}s" for k in ("error", "warning", "note") if (n := report.hidden.get(k))]
    if hidden:
        head += f"; not shown: {', '.join(hidden)}"
    lines += [head + ".", ""]
    if total:
        lines += ["| verdict | kernels |", "|---|---|"]
        lines += [f"| {name} | {total.get(name.replace('-', '_'), 0)} |"
                  for name in reversed(VERDICTS)]
        lines.append("")
    for title, rows in (("Per run", report.summary.get("runs", [])),
                        ("Per level", report.summary.get("levels", []))):
        if any(row["key"] is not None for row in rows):
            lines += [f"### {title}", "", _figures_header(), "|---|---|---|---|---|---|---|---|---|"]
            lines += [_figures_row(row) for row in rows]
            lines.append("")
    questionable = sorted((v for v in report.verdicts if v.verdict != TRUSTED),
                          key=lambda v: natural_key(v.path))
    if questionable:
        lines += ["### Kernels not trusted", "", "| kernel | claimed | verdict | reasons |",
                  "|---|---|---|---|"]
        for verdict in questionable[:MAX_ROWS]:
            claimed = text(verdict.submission.claim.said)
            if verdict.speedup is not None:
                claimed += f", {verdict.speedup:.2f}x"
            if verdict.measured:
                claimed += f" (measured {verdict.measured['speedup']:.2f}x)"
            lines.append(f"| {code(verdict.path)} | {claimed} | **{verdict.verdict}** | "
                         f"{text(', '.join(verdict.reasons))} |")
        if len(questionable) > MAX_ROWS:
            lines.append(f"| ... {len(questionable) - MAX_ROWS} more | | | |")
        lines.append("")
    if report.findings:
        lines += ["### Findings", "", "| location | rule | level | message |", "|---|---|---|---|"]
        for finding in report.findings[:MAX_ROWS]:
            mark = f" ({finding.baseline_state})" if finding.baseline_state else ""
            lines.append(f"| {code(f'{finding.path}:{finding.line}')} | {finding.rule}{mark} | "
                         f"{finding.level.value} | {text(finding.message)}"
                         f"{_picture(finding, folder)} |")
        if len(report.findings) > MAX_ROWS:
            lines.append(f"| ... {len(report.findings) - MAX_ROWS} more | | | |")
        lines.append("")
    if report.errors:
        lines += ["### Errors", "", "| path | error |", "|---|---|"]
        lines += [f"| {code(e.path)} | {text(e.message)} |" for e in report.errors]
    return "\n".join(lines).rstrip() + "\n"


def _figures_header() -> str:
    return ("| group | kernels | claimed correct | surviving | median claimed speedup | "
            "median surviving speedup | fast_1 | median verified speedup | fast_1 verified |")


def _figures_row(row: dict[str, Any]) -> str:
    def speed(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    fast = "-" if row["fast_1"] is None else f"{row['fast_1']:.0%}"
    verified = "-" if row.get("fast_1_verified") is None else f"{row['fast_1_verified']:.0%}"
    return (f"| {text(row['key']) if row['key'] is not None else '(none)'} | {row['kernels']} | "
            f"{row['claimed_correct']} | {row['surviving']} | "
            f"{speed(row['median_claimed_speedup'])} | {speed(row['median_surviving_speedup'])} | "
            f"{fast} | {speed(row.get('median_verified_speedup'))} | {verified} |")


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
