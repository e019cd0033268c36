"""Exit codes, kept apart from rendering: 0 nothing at or above the threshold, 1 something is,
2 usage or internal error."""

from __future__ import annotations

from kaudit.report.model import Report
from kaudit.findings import Level

FAIL_ON_CHOICES = ("error", "warning", "note", "never")
EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def exit_code(report: Report, fail_on: str) -> int:
    if any(error.internal for error in report.errors):
        return EXIT_ERROR
    if fail_on == "never":
        return EXIT_CLEAN
    threshold = Level(fail_on).rank
    # Findings accepted in a baseline ("unchanged") never fail a run; new ones do.
    failing = any(f.level.rank >= threshold and f.baseline_state != "unchanged"
                  for f in report.findings) or (report.errors and threshold <= Level.ERROR.rank)
    return EXIT_FINDINGS if failing else EXIT_CLEAN
