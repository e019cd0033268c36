"""Fixes carried by the JSON and SARIF reports: each finding that `kaudit fix` would fix by
default gets its `fix`.

The files are read again after the scan; a fix is attached only to a finding found again, with
the same fingerprint, in the file as it is now. Notes' fixes are left out: computing a fix costs
more than scanning the file, and honest CUDA kernels often draw a KA308 note, so carrying them
would slow every JSON and SARIF scan several times; `kaudit fix --select KA308 --diff` shows them.
Nothing of the fix machinery (libcst) is loaded when no finding could have a fix."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from kaudit.config import Config
from kaudit.findings import Finding, Level
from kaudit.rule import rule_by_code
from kaudit.source import LineIndex, read_source

if TYPE_CHECKING:
    from kaudit.report.model import Report


def fixed_by_default(finding: Finding) -> bool:
    """What `kaudit fix` fixes without `--select`: errors, warnings and unused suppressions
    (KA004). Other notes' fixes (KA308's launch checks) change code nothing calls wrong."""
    return finding.level.rank >= Level.WARNING.rank or finding.rule == "KA004"


def attach_fixes(report: Report, config: Config | None = None) -> None:
    """Set `Finding.fix` (its JSON form) on the findings of `report` that have a safe fix."""
    by_path: dict[str, list[int]] = {}
    for i, finding in enumerate(report.findings):
        rule = rule_by_code(finding.rule)
        if finding.fix is None and rule is not None and rule.fixable() \
                and fixed_by_default(finding) \
                and "#L" not in finding.path:  # kernels inside JSONL records are not fixed
            by_path.setdefault(finding.path, []).append(i)
    if not by_path:
        return
    from kaudit.fix.engine import fixes_of_text  # libcst

    for path, indices in by_path.items():
        text, problem = read_source(Path(path))
        if text is None or problem is not None:
            continue
        fixes = fixes_of_text(path, text, config or Config())
        index = LineIndex(text)
        for i in indices:
            finding = report.findings[i]
            fix = fixes.get((finding.rule, finding.fingerprint))
            if fix is not None:
                report.findings[i] = dataclasses.replace(finding, fix=fix.to_dict(path, index))
