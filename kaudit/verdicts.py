"""Verdicts on what a benchmark run claimed: per kernel `rejected`, `suspicious` or `trusted`,
with reasons, and summaries per run and per level (claims that survive, claimed vs surviving
median speedup, the fast_p-style share of trusted kernels faster than the baseline)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kaudit.findings import Finding, Level
from kaudit.results import BaselineTimings, Submission

REJECTED, SUSPICIOUS, TRUSTED = "rejected", "suspicious", "trusted"


@dataclass
class Verdict:
    path: str
    submission: Submission
    verdict: str
    reasons: list[str] = field(default_factory=list)
    speedup: float | None = None

    def to_dict(self) -> dict[str, Any]:
        s = self.submission
        return {
            "path": self.path, "run": s.run, "level": s.level, "problem": s.problem,
            "sample": s.sample, "layout": s.layout, "reference": s.reference,
            "claimed": {"compiled": s.claim.compiled, "correctness": s.claim.correctness,
                        "trials": s.claim.trials, "runtime_ms": s.claim.runtime_ms,
                        "hardware": s.claim.hardware, "speedup": self.speedup},
            "verdict": self.verdict, "reasons": self.reasons,
        }


def judge(path: str, submission: Submission, findings: Iterable[Finding],
          timings: BaselineTimings | None, suspicious_speedup: float) -> Verdict:
    findings = list(findings)
    speedup = (timings or BaselineTimings()).speedup(submission)
    errors = sorted({f.rule for f in findings if f.level is Level.ERROR})
    warnings = sorted({f.rule for f in findings if f.level is Level.WARNING})
    if errors:
        return Verdict(path, submission, REJECTED, errors + warnings, speedup)
    reasons = list(warnings)
    if speedup is not None and speedup > suspicious_speedup:
        reasons.append(f"claimed {speedup:.1f}x > {suspicious_speedup:g}x, unconfirmed")
    return Verdict(path, submission, SUSPICIOUS if reasons else TRUSTED, reasons, speedup)


def summarize(verdicts: list[Verdict]) -> dict[str, Any]:
    """Totals, and the same figures per run and per level."""
    def group(key) -> list[dict[str, Any]]:
        groups: dict[Any, list[Verdict]] = {}
        for verdict in verdicts:
            groups.setdefault(key(verdict), []).append(verdict)
        return [{"key": k, **_figures(v)} for k, v in sorted(groups.items(), key=lambda kv: str(kv[0]))]

    return {
        "total": _figures(verdicts),
        "runs": group(lambda v: v.submission.run),
        "levels": group(lambda v: v.submission.level),
    }


def _figures(verdicts: list[Verdict]) -> dict[str, Any]:
    claimed = [v for v in verdicts if v.submission.claim.correctness]
    surviving = [v for v in claimed if v.verdict == TRUSTED]
    claimed_speedups = [v.speedup for v in claimed if v.speedup is not None]
    surviving_speedups = [v.speedup for v in surviving if v.speedup is not None]
    fast = [v for v in surviving if v.speedup is not None and v.speedup > 1.0]
    return {
        "kernels": len(verdicts),
        "rejected": sum(v.verdict == REJECTED for v in verdicts),
        "suspicious": sum(v.verdict == SUSPICIOUS for v in verdicts),
        "trusted": sum(v.verdict == TRUSTED for v in verdicts),
        "claimed_correct": len(claimed),
        "surviving": len(surviving),
        "median_claimed_speedup": statistics.median(claimed_speedups) if claimed_speedups else None,
        "median_surviving_speedup":
            statistics.median(surviving_speedups) if surviving_speedups else None,
        "fast_1": len(fast) / len(verdicts) if verdicts else None,
    }
