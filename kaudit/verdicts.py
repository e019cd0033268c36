"""Verdicts on what a benchmark run claimed, per kernel, with reasons:

- `claimed-incorrect`: the run itself marks the kernel not compiled or incorrect (not a claim);
- `rejected`: an error-level finding;
- `unverified`: the dynamic pass could not audit it (a finding of a rule tagged `not-run`:
  no CUDA, no reference problem, the reference failed), so a CPU-only run is never a pass;
- `suspicious`: warnings, or a claimed speedup above the threshold that nothing confirmed;
- `trusted`: none of these.

Summaries per run and per level: claims that survive, claimed vs surviving median speedup, and
the fast_p-style share of trusted kernels faster than the baseline; with `--timing`, the median
speedup kaudit measured for the trusted kernels and fast_1 on those verified speedups."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kaudit.discover import natural_key
from kaudit.findings import Finding, Level
from kaudit.results import BaselineTimings, Submission
from kaudit.rule import rule_by_code

CLAIMED_INCORRECT, REJECTED, UNVERIFIED, SUSPICIOUS, TRUSTED = (
    "claimed-incorrect", "rejected", "unverified", "suspicious", "trusted")
#: every verdict, the most decisive first
VERDICTS = (CLAIMED_INCORRECT, REJECTED, UNVERIFIED, SUSPICIOUS, TRUSTED)
#: the tag of the rules whose finding says "this kernel was not audited"
NOT_AUDITED_TAG = "not-run"


@dataclass
class Verdict:
    path: str
    submission: Submission
    verdict: str
    reasons: list[str] = field(default_factory=list)
    speedup: float | None = None
    #: where its findings are reported: the path the file was scanned by, which differs from
    #: `path` when several paths (runs sharing files through symlinks) reach one file
    file: str | None = None
    #: what `--timing` measured (`kaudit.dynamic.timing.measurement`); None: not timed
    measured: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        s = self.submission
        data = {
            "path": self.path, "file": self.file or self.path, "run": s.run, "level": s.level,
            "problem": s.problem, "sample": s.sample, "layout": s.layout,
            "reference": s.reference,
            "claimed": {"compiled": s.claim.compiled, "correctness": s.claim.correctness,
                        "trials": s.claim.trials, "runtime_ms": s.claim.runtime_ms,
                        "hardware": s.claim.hardware, "status": s.claim.status,
                        "speedup": self.speedup, **s.claim.extras()},
            "verdict": self.verdict, "reasons": self.reasons,
        }
        if s.benchmark != "kernelbench":  # KernelBench verdicts keep their shape
            data.update(benchmark=s.benchmark, task=s.task)
        if self.measured is not None:
            data["measured"] = dict(self.measured)
        return data


def judge(path: str, submission: Submission, findings: Iterable[Finding],
          timings: BaselineTimings | None, suspicious_speedup: float,
          file: str | None = None, incomplete: bool = False,
          measured: dict[str, Any] | None = None) -> Verdict:
    """`incomplete`: the static analysis of the file stopped on an internal error, so the absence
    of findings proves nothing. `measured`: what `--timing` measured; a claimed speedup it did not
    contradict (no KD701) is confirmed."""
    findings = list(findings)
    speedup = (timings or BaselineTimings()).speedup(submission)
    errors = sorted({f.rule for f in findings if f.level is Level.ERROR})
    warnings = sorted({f.rule for f in findings if f.level is Level.WARNING})
    # a kernel not audited (KD504 is a warning) is unverified, never merely suspicious
    not_audited = sorted({f.rule for f in findings if _not_audited(f.rule)} - set(errors)) + (
        ["internal error in the static analysis"] if incomplete else [])

    def verdict(name: str, reasons: list[str]) -> Verdict:
        return Verdict(path, submission, name, reasons, speedup,
                       file if file is not None and file != path else None, measured)

    claim = submission.claim
    if claim.incorrect:
        return verdict(CLAIMED_INCORRECT, [f"the run marks it {claim.said}"] + errors + warnings)
    if errors:
        return verdict(REJECTED, errors + warnings)
    if not_audited:
        return verdict(UNVERIFIED, not_audited + [w for w in warnings if w not in not_audited])
    reasons = list(warnings)
    if speedup is not None and speedup > suspicious_speedup and measured is None:
        reasons.append(f"claimed {speedup:.1f}x > {suspicious_speedup:g}x, unconfirmed")
    return verdict(SUSPICIOUS if reasons else TRUSTED, reasons)


def _not_audited(code: str) -> bool:
    rule = rule_by_code(code)
    return rule is not None and NOT_AUDITED_TAG in rule.tags


def summarize(verdicts: list[Verdict]) -> dict[str, Any]:
    """Totals, and the same figures per run and per level (in natural order, none last)."""
    def group(key) -> list[dict[str, Any]]:
        groups: dict[Any, list[Verdict]] = {}
        for verdict in verdicts:
            groups.setdefault(key(verdict), []).append(verdict)
        ordered = sorted(groups.items(), key=lambda kv: (kv[0] is None, natural_key(str(kv[0]))))
        return [{"key": k, **_figures(v)} for k, v in ordered]

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
    timed = any(v.speedup is not None for v in verdicts)
    verified = [v.measured["speedup"] for v in verdicts if v.measured and v.verdict == TRUSTED]
    return {
        "kernels": len(verdicts),
        **{name.replace("-", "_"): sum(v.verdict == name for v in verdicts) for name in VERDICTS},
        "claimed_correct": len(claimed),
        "surviving": len(surviving),
        "median_claimed_speedup": statistics.median(claimed_speedups) if claimed_speedups else None,
        "median_surviving_speedup":
            statistics.median(surviving_speedups) if surviving_speedups else None,
        # None without any speedup (no timings): "0% fast" would be a claim nobody measured
        "fast_1": len(fast) / len(verdicts) if verdicts and timed else None,
        # measured by --timing: the trusted kernels' verified speedups, and fast_1 on them
        "median_verified_speedup": statistics.median(verified) if verified else None,
        "fast_1_verified": sum(s > 1.0 for s in verified) / len(verdicts)
        if verdicts and any(v.measured for v in verdicts) else None,
    }
