"""Renderers for `kaudit problems`: text (rich tables), JSON, Markdown and SARIF. No analysis."""

from __future__ import annotations

import json
import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from kaudit import __version__
from kaudit.dynamic.problems import ProblemResult, ProblemsReport
from kaudit.report.markdown import code, text

STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}
SARIF_CATEGORY = "kaudit/problems/"
MAX_ROWS = 200


def render_json(report: ProblemsReport) -> str:
    return json.dumps(_clean(report.to_dict()), indent=2, allow_nan=False) + "\n"


def render_sarif(report: ProblemsReport) -> str:
    from kaudit.report import sarif
    from kaudit.rule import all_rules

    rules = [r for r in all_rules() if getattr(r, "audit", "static") == "problems"]
    return sarif.render(report.as_scan_report(), rules, category=SARIF_CATEGORY)


def render_text(report: ProblemsReport, console: Console) -> None:
    if report.problems:
        console.print(_table(report))
        console.print()
    for problem in report.problems:
        if problem.findings or problem.status != "ok":
            _details(problem, console)
    for error in report.errors:
        console.print(f"[bold red]error[/bold red]: {escape(error.path)}: {escape(error.message)}",
                      soft_wrap=True)
    for line in summary_lines(report):
        console.print(line, markup=False, soft_wrap=True)


def render_markdown(report: ProblemsReport) -> str:
    lines = [f"## kaudit {__version__}: benchmark problems", "",
             f"{_tolerance_text(report)}; device {report.device}; seeds "
             f"{', '.join(map(str, report.options.seed_values()))}; input scales "
             f"{', '.join(f'{s:g}' for s in report.options.scales)}.", "",
             "| group | problems | ran | zeros pass | a constant passes | other inputs pass | "
             "degenerate | atol-dominated | ill-conditioned |",
             "|---|---|---|---|---|---|---|---|---|"]
    groups = report.summary.get("groups", [])
    rows = [(code(row["key"]), row) for row in groups]
    if len(groups) > 1:
        rows.append(("**total**", report.summary))
    for key, row in rows:
        lines.append(f"| {key} | {row['problems']} | {row['ran']} | {row['zeros_pass']} | "
                     f"{row['constant_pass']} | {row['other_input_pass']} | {row['degenerate']} | "
                     f"{row['absolute_dominated']} | {row['ill_conditioned']} |")
    lines.append("")
    flagged = [p for p in report.problems if p.findings]
    if flagged:
        lines += ["### Problems with findings", "",
                  "| problem | output | max\\|y\\| | zeros | constant | other inputs | "
                  "recommended rel. L2 | findings |", "|---|---|---|---|---|---|---|---|"]
        for problem in flagged[:MAX_ROWS]:
            lines.append(f"| {code(problem.path)} | {_output(problem)} | {_g(problem.max_abs)} | "
                         f"{_mark(problem.zeros_pass)} | {_mark(problem.constant_pass)} | "
                         f"{_mark(problem.other_input_pass)} | {_recommended(problem)} | "
                         f"{', '.join(problem.codes())} |")
        if len(flagged) > MAX_ROWS:
            lines.append(f"| ... {len(flagged) - MAX_ROWS} more | | | | | | | |")
        lines.append("")
    if report.errors:
        lines += ["### Errors", "", "| path | error |", "|---|---|"]
        lines += [f"| {code(e.path)} | {text(e.message)} |" for e in report.errors]
    return "\n".join(lines).rstrip() + "\n"


def summary_lines(report: ProblemsReport) -> list[str]:
    summary = report.summary
    lines = []
    for row in summary.get("groups", []) if len(summary.get("groups", [])) > 1 else []:
        lines.append(f"{row['key']}: {_counts(row)}")
    total = summary.get("problems", 0)
    lines.append(f"{_counts(summary) if total else 'no problems audited'} "
                 f"({_tolerance_text(report)}, device {report.device})")
    temp = summary.get("temp") or {}
    if temp.get("peak_bytes"):
        from kaudit.dynamic.limits import format_size

        limit = temp.get("limit_bytes")
        lines.append(f"temporary disk: peak {format_size(temp['peak_bytes'])}"
                     + (f" of the {format_size(limit)} limit" if limit else ", no limit"))
    return lines


def _counts(row: dict[str, Any]) -> str:
    plural = "" if row["problems"] == 1 else "s"
    text = (f"{row['problems']} problem{plural}, {row['ran']} ran: zeros pass on "
            f"{row['zeros_pass']}, a constant on {row['constant_pass']}, other inputs' output on "
            f"{row['other_input_pass']}; {row['degenerate']} degenerate, "
            f"{row['absolute_dominated']} atol-dominated, {row['ill_conditioned']} ill-conditioned")
    if row["failed"]:
        text += f"; {row['failed']} could not run"
    return text


def _table(report: ProblemsReport) -> Table:
    table = Table(Column("problem", overflow="fold"), "output", "max|y|", "std", "zeros",
                  "const", "other", "rec. rel L2", "findings",
                  title=f"benchmark problems ({_tolerance_text(report)})",
                  title_justify="left")
    for problem in report.problems:
        codes = ", ".join(problem.codes())
        if problem.status == "failed":
            table.add_row(escape(problem.path), "[red]not run[/red]", "-", "-", "-", "-", "-", "-",
                          codes)
            continue
        table.add_row(escape(problem.path), escape(_output(problem)), _g(problem.max_abs),
                      _g(problem.stats.get("std")), _tick(problem.zeros_pass),
                      _tick(problem.constant_pass), _tick(problem.other_input_pass),
                      _recommended(problem), codes)
    return table


def _details(problem: ProblemResult, console: Console) -> None:
    head = f"[bold]{escape(problem.path)}[/bold]"
    if problem.status != "failed":
        head += (f"  {escape(_output(problem))}  max|y| {_g(problem.max_abs)}  "
                 f"std {_g(problem.stats.get('std'))}")
    head += f"  [dim]({problem.device or 'no device'}, {problem.wall_s:.1f} s)[/dim]"
    console.print(head, soft_wrap=True)
    for seed in problem.seeds:
        parts = [f"max|y| {_g(seed['max_abs'])}", f"zeros {_word(seed['zeros_pass'])}",
                 f"constant {_word(seed['constant_pass'])}"
                 + (f" ({_g(seed['constant'])})" if seed.get("constant") is not None else "")]
        if "other_input_pass" in seed:
            parts.append(f"seed {seed['other_input_seed']}'s output "
                         f"{_word(seed['other_input_pass'])}")
        if seed.get("fp64_gap"):
            parts.append(f"float64 gap rel L2 {_g(seed['fp64_gap']['rel_l2'])}")
        console.print(f"  seed {seed['seed']}: " + ", ".join(parts), highlight=False,
                      soft_wrap=True)
    scales = [s for s in problem.scales if s.get("ran") and "rel_l2" in s]
    if scales:
        console.print("  input scales: " + ", ".join(
            f"{s['scale']:g} rel L2 {_g(s['rel_l2'])}" + _nonfinite(s)
            + (" [cyan]ill-conditioned[/cyan]"
                                                          if s.get("ill_conditioned") else "")
            for s in scales), highlight=False, soft_wrap=True)
    if problem.recommended and problem.recommended.get("usable"):
        console.print(f"  recommended: relative L2 <= {_g(problem.recommended['rel_l2'])}, "
                      f"max|err|/max|y| <= {_g(problem.recommended['max_rel'])}",
                      highlight=False)
    for finding in problem.findings:
        level = finding.level.value
        console.print(f"  {escape(finding.path)}:{finding.line}: [{STYLE[level]}]{finding.rule}"
                      f"[/{STYLE[level]}] [dim]{level}[/dim] {escape(finding.message)} "
                      f"[dim]({finding.name})[/dim]", soft_wrap=True)
    console.print()


def _nonfinite(scale: dict[str, Any]) -> str:
    native, reference = scale.get("native_nonfinite", 0), scale.get("reference_nonfinite", 0)
    if reference:
        return f" (float64 has {reference} NaN/Inf)"
    return f" ({native} NaN/Inf where float64 is finite)" if native else ""


def _output(problem: ProblemResult) -> str:
    return "; ".join(f"{d}{list(s)}" for d, s in zip(problem.dtypes, problem.shapes)) or "-"


def _recommended(problem: ProblemResult) -> str:
    recommended = problem.recommended
    if not recommended:
        return "-"
    if not recommended.get("usable"):
        return "noise"
    return _g(recommended["rel_l2"])


def _tolerance_text(report: ProblemsReport) -> str:
    text = report.options.tolerance.describe()
    others = sorted({p.tolerance["preset"] for p in report.problems if p.tolerance}
                    - {report.options.tolerance.name})
    return text + (f"; other benchmarks' problems: {', '.join(others)}" if others else "")


def _tick(value: bool | None) -> str:
    return {True: "[bold red]pass[/bold red]", False: "[green]fail[/green]", None: "-"}[value]


def _mark(value: bool | None) -> str:
    return {True: "**pass**", False: "fail", None: "-"}[value]


def _word(value: bool | None) -> str:
    return {True: "pass", False: "fail", None: "-"}[value]


def _g(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}"


def _clean(value: Any) -> Any:
    """JSON has no NaN or Infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value
