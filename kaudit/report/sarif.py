"""SARIF 2.1.0 for GitHub code scanning (see the rules in docs: one run, %SRCROOT%-relative URIs,
1-based regions, a stable primaryLocationLineHash, `results` even when empty)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import sarif_om as sarif
from jschema_to_python.to_json import to_json

from kaudit import __version__
from kaudit.report.model import Report
from kaudit.findings import Finding
from kaudit.fix.report import attach_fixes
from kaudit.rule import Rule, all_rules

SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
INFORMATION_URI = "https://github.com/kaudit/kaudit"
SEVERITY = {"error": "error", "warning": "warning", "note": "recommendation"}


def source_root(start: Path | None = None) -> Path:
    """The repository root (nearest folder holding .git) or, outside a repository, the cwd."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / ".git").exists():
            return directory
    return here


def render(report: Report, rules: list[type[Rule]], category: str = "kaudit/static/",
           root: Path | None = None) -> str:
    """A SARIF log of one run: `report`'s findings of `rules`."""
    return dumps(log([run(report, rules, category, root)]))


def render_scan(report: Report, enabled: Callable[[str], bool], root: Path | None = None) -> str:
    """The SARIF log of a scan: a run of the static pass and, when the dynamic pass ran, one of
    its own (category kaudit/dynamic/), each with its enabled rules."""
    return dumps(log(scan_runs(report, enabled, root)))


def scan_runs(report: Report, enabled: Callable[[str], bool], root: Path | None = None
              ) -> list[dict]:
    audits = ("static", "dynamic") if report.dynamic else ("static",)
    return [run(report, [r for r in all_rules() if r.audit == audit and enabled(r.code)],
                f"kaudit/{audit}/", root) for audit in audits]


def log(runs: list[dict]) -> dict:
    return {"runs": runs, "version": "2.1.0", "$schema": SCHEMA_URI}


def dumps(data: dict) -> str:
    return json.dumps(data, indent=2) + "\n"


def run(report: Report, rules: list[type[Rule]], category: str = "kaudit/static/",
        root: Path | None = None) -> dict:
    """One SARIF run, as JSON data: `report`'s findings of `rules`."""
    root = root or source_root()
    index = {rule.code: i for i, rule in enumerate(rules)}
    attach_fixes(report)
    sarif_run = sarif.Run(
        tool=sarif.Tool(driver=sarif.ToolComponent(
            name="kaudit", version=__version__, semantic_version=__version__,
            information_uri=INFORMATION_URI, rules=[_descriptor(rule) for rule in rules])),
        automation_details=sarif.RunAutomationDetails(id=category),
        original_uri_base_ids={"%SRCROOT%": sarif.ArtifactLocation(uri=root.as_uri() + "/")},
        column_kind="unicodeCodePoints",
        invocations=[_invocation(report)],
        results=[_result(f, index, root) for f in report.findings if f.rule in index],
    )
    data = json.loads(to_json(sarif_run))
    _restore_levels(data, rules, [f for f in report.findings if f.rule in index])
    measured = [{"path": v.path, "claimed_speedup": v.speedup, **v.measured}
                for v in report.verdicts if v.measured]
    if measured and any(rule.audit == "dynamic" for rule in rules):  # the dynamic run's
        data.setdefault("properties", {})["measured"] = measured
    return data


def _restore_levels(run: dict, rules: list[type[Rule]], findings: list[Finding]) -> None:
    """jschema-to-python drops fields equal to their schema default ("warning"); put them back so
    every rule and result states its level."""
    for descriptor, rule in zip(run["tool"]["driver"]["rules"], rules):
        descriptor.setdefault("defaultConfiguration", {})["level"] = rule.level.value
    for result, finding in zip(run["results"], findings):
        result["level"] = finding.level.value


def _descriptor(rule: type[Rule]) -> sarif.ReportingDescriptor:
    docs = rule.docs()
    properties = sarif.PropertyBag(tags=list(rule.tags)[:10])
    properties.precision = rule.precision.value
    setattr(properties, "problem.severity", SEVERITY[rule.level.value])
    return sarif.ReportingDescriptor(
        id=rule.code,
        name=rule.name,
        short_description=sarif.MultiformatMessageString(text=docs.summary),
        full_description=sarif.MultiformatMessageString(text=docs.what),
        help=sarif.MultiformatMessageString(text=docs.markdown, markdown=docs.markdown),
        default_configuration=sarif.ReportingConfiguration(level=rule.level.value),
        properties=properties,
    )


def _artifact(path: str, root: Path) -> sarif.ArtifactLocation:
    absolute = Path(os.path.abspath(path))
    try:
        relative = absolute.relative_to(root)
    except ValueError:
        return sarif.ArtifactLocation(uri=absolute.as_uri())
    return sarif.ArtifactLocation(uri=quote(relative.as_posix()), uri_base_id="%SRCROOT%")


def _result(finding: Finding, index: dict[str, int], root: Path) -> sarif.Result:
    loc = finding.location
    path, message = finding.path, finding.message
    region = sarif.Region(start_line=loc.line, start_column=loc.column,
                          end_line=loc.end_line, end_column=loc.end_column)
    if "#L" in path:  # a kernel inside a JSONL file: point at its line there
        path, _, inner = path.partition("#L")
        record_line, _, field = inner.partition("/")
        region = sarif.Region(start_line=int(record_line))
        message = f"{field} line {loc.line}: {message}"
    return sarif.Result(
        rule_id=finding.rule,
        rule_index=index[finding.rule],
        level=finding.level.value,
        message=sarif.Message(text=message),
        locations=[sarif.Location(physical_location=sarif.PhysicalLocation(
            artifact_location=_artifact(path, root), region=region))],
        partial_fingerprints={"primaryLocationLineHash": finding.fingerprint},
        baseline_state=finding.baseline_state or None,
        # the numbers behind the message (coverage, errors, picture path), as in JSON
        properties={"metrics": finding.metrics} if finding.metrics else None,
        fixes=_fixes(finding, root),
    )


def _fixes(finding: Finding, root: Path) -> list[sarif.Fix] | None:
    """The finding's fix as SARIF: replacements (a deleted region and the text put there)."""
    if not finding.fix:
        return None
    changes: dict[str, list[sarif.Replacement]] = {}
    for edit in finding.fix["edits"]:
        region = sarif.Region(start_line=edit["line"], start_column=edit["column"],
                              end_line=edit["end_line"], end_column=edit["end_column"])
        inserted = sarif.ArtifactContent(text=edit["text"]) if edit["text"] else None
        changes.setdefault(edit["path"], []).append(
            sarif.Replacement(deleted_region=region, inserted_content=inserted))
    artifact_changes = [sarif.ArtifactChange(artifact_location=_artifact(path, root),
                                             replacements=replacements)
                        for path, replacements in changes.items()]
    return [sarif.Fix(description=sarif.Message(text=finding.fix["description"]),
                      artifact_changes=artifact_changes)]


def _invocation(report: Report) -> sarif.Invocation:
    notifications = [
        sarif.Notification(
            level="error",
            message=sarif.Message(text=f"{error.path}: {error.message}"),
        )
        for error in report.errors
    ]
    return sarif.Invocation(
        execution_successful=not any(e.internal for e in report.errors),
        tool_execution_notifications=notifications or None,
    )
