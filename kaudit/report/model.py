"""The report model every renderer reads: what a scan found, per file and per kernel.

Plain data, serialisable with `to_dict()`; `kaudit.api` builds it (static pass, dynamic pass,
baseline, verdicts, summary) and the renderers in this package only read it."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kaudit import __version__
from kaudit.findings import Finding, Level, ScanError
from kaudit.verdicts import Verdict

if TYPE_CHECKING:
    from kaudit.engine import FileResult


@dataclass
class Report:
    """The outcome of a scan: plain data, serialisable with `to_dict()`."""

    findings: list[Finding] = field(default_factory=list)
    files_scanned: int = 0
    files_skipped: int = 0
    errors: list[ScanError] = field(default_factory=list)
    #: one per scanned kernel: what its benchmark run claimed and whether to trust it
    verdicts: list[Verdict] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    #: findings left out of this view by level (`at_least`), per level
    hidden: dict[str, int] = field(default_factory=dict)
    #: what did not stop the scan but should be said once on stderr (an unusable cache)
    warnings: list[str] = field(default_factory=list)

    @property
    def dynamic(self) -> bool:
        """Whether the dynamic pass ran (its findings then form a run of their own in SARIF)."""
        return "dynamic" in self.summary

    def at_least(self, level: Level) -> Report:
        """This report showing only findings at or above `level`; the rest counted in `hidden`.
        Verdicts, summaries and exit codes still count every finding."""
        shown = [f for f in self.findings if f.level.rank >= level.rank]
        hidden = Counter(self.hidden)
        hidden.update(f.level.value for f in self.findings if f.level.rank < level.rank)
        return dataclasses.replace(self, findings=shown, hidden=dict(hidden))

    def add(self, result: FileResult) -> None:
        if result.skipped:
            self.files_skipped += 1
            return
        self.files_scanned += 1
        self.findings.extend(result.findings)
        self.errors.extend(result.errors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": {"name": "kaudit", "version": __version__},
            "files_scanned": self.files_scanned,
            "files_skipped": self.files_skipped,
            "findings": [f.to_dict() for f in self.findings],
            "errors": [e.to_dict() for e in self.errors],
            "verdicts": [v.to_dict() for v in self.verdicts],
            "summary": self.summary,
        } | ({"findings_hidden": self.hidden} if self.hidden else {})


@dataclass
class KernelOutcome:
    """One kernel's final verdict and findings, the moment they are known
    (`scan_paths(on_kernel=...)`, one line of `--stream`)."""

    verdict: Verdict
    findings: list[Finding]
    #: how long its dynamic audit took; None for the static pass alone
    seconds: float | None = None
    #: the dynamic pass's status ("ok", "failed", "needs-cuda", ...); None: static pass only
    status: str | None = None
    #: the dynamic result came from the cache (`--cache-dir`), not from a run in this scan
    cached: bool = False
    #: its place in its pass, for progress display: `done` of `total` kernels (or files)
    done: int = 0
    total: int = 0
    #: seconds per kind of job of its dynamic audit (reference, candidate, plain_run, timing,
    #: profile ...): where the audit's time went; None without a dynamic run
    job_seconds: dict[str, float] | None = None
    #: on a GPU, what its jobs asked first and what its candidate job held at most, in bytes
    #: (`need_bytes`, `candidate_peak_bytes`)
    gpu_memory: dict[str, int | None] | None = None

    def to_dict(self) -> dict[str, Any]:
        # the verdict's whole record (its claim and measurement too), so a killed scan's stream
        # still holds the claimed-versus-verified table
        return {**self.verdict.to_dict(),
                "findings": [f.to_dict() for f in self.findings],
                "seconds": round(self.seconds, 3) if self.seconds is not None else None,
                "status": self.status, "cached": self.cached, "job_seconds": self.job_seconds,
                "gpu_memory": self.gpu_memory}
