"""`kaudit.audit_kernel`: one kernel and its reference problem, held in memory, audited by both
passes (for training loops and harnesses that gate every sample; no files needed from the caller).

    audit = kaudit.audit_kernel(kernel_src, problem_src, kaudit.DynamicOptions(device="cuda"))
    reward = speedup if audit.verdict == "trusted" else 0.0

The two texts are written into a temporary folder of their own (removed after) as `kernel.py` and
`problem.py`, scanned like `kaudit scan kernel.py --dynamic --problem problem.py`, and findings
are named by `kernel.py`."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kaudit.api import scan_paths
from kaudit.config import Config
from kaudit.dynamic.options import DynamicOptions
from kaudit.findings import Finding
from kaudit.verdicts import CLAIMED_INCORRECT, REJECTED, UNVERIFIED

KERNEL_NAME, PROBLEM_NAME = "kernel.py", "problem.py"
#: verdicts that say the kernel must not count
FAILING = (CLAIMED_INCORRECT, REJECTED, UNVERIFIED)


@dataclass
class KernelAudit:
    #: trusted, suspicious (warnings), rejected (an error) or unverified (not audited: no CUDA
    #: for a CUDA kernel, no ModelNew, a reference that fails, an audit that did not complete)
    verdict: str
    reasons: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    #: the dynamic run's status ("ok", "failed", "needs-cuda", ...; None: it did not run), its
    #: seconds, and the numbers its findings carry, by rule
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Neither rejected nor unverified (a suspicious kernel passes; read `verdict` to be
        stricter)."""
        return self.verdict not in FAILING

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reasons": self.reasons,
                "findings": [f.to_dict() for f in self.findings], "metrics": self.metrics}


def audit_kernel(kernel_src: str, problem_src: str | None,
                 options: DynamicOptions | None = None, config: Config | None = None
                 ) -> KernelAudit:
    """Audit `kernel_src` (a KernelBench `ModelNew` module) against `problem_src` (its `Model`,
    `get_inputs`, `get_init_inputs`; None: the dynamic pass reports KD502 and the verdict is
    unverified). Raises what `kaudit.scan_paths` raises for unusable options."""
    from kaudit.dynamic import scratch  # the dynamic side: only from here on

    options = options or DynamicOptions()
    folder = scratch.folder()
    try:
        kernel = Path(folder, KERNEL_NAME)
        kernel.write_text(kernel_src, encoding="utf-8")
        problem = None
        if problem_src is not None:
            problem = Path(folder, PROBLEM_NAME)
            problem.write_text(problem_src, encoding="utf-8")
        options = dataclasses.replace(options, problem=str(problem) if problem else None)
        outcomes = []
        started = time.monotonic()
        report = scan_paths([str(kernel)], config or Config(), dynamic=options,
                            on_kernel=outcomes.append)
        seconds = time.monotonic() - started
    finally:
        scratch.remove(folder)
    findings = [f.with_path(KERNEL_NAME) for f in report.findings]
    metrics: dict[str, Any] = {"status": outcomes[0].status if outcomes else None,
                               "seconds": round(seconds, 3)}
    for finding in findings:
        if finding.metrics:
            metrics.setdefault(finding.rule, finding.metrics)
    if not report.verdicts:
        reasons = [e.message for e in report.errors] or ["no ModelNew in the kernel"]
        return KernelAudit(UNVERIFIED, reasons, findings, metrics)
    (verdict,) = report.verdicts
    return KernelAudit(verdict.verdict, verdict.reasons, findings, metrics)
