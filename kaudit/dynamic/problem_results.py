"""The results of `kaudit problems`: its options, one problem's measurements and findings, the
report and its summary counts. Plain data; `problems` makes them, `problems_analysis` fills them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from kaudit import __version__
from kaudit.dynamic.tolerance import Tolerance
from kaudit.findings import Finding, ScanError

DEFAULT_SCALES = (1e-3, 1.0, 1e3)
INIT_SEED = 42


@dataclass(frozen=True)
class Options:
    tolerance: Tolerance
    #: "auto", "cpu" or "cuda" ("auto": CUDA when torch sees a device)
    device: str = "auto"
    seeds: int = 3
    scales: tuple[float, ...] = DEFAULT_SCALES
    timeout: float = 300.0
    jobs: int = 1
    #: RLIMIT_AS of each job on CPU runs, in bytes; None: the default (`limits`); 0: none
    memory_limit: int | None = None
    #: bytes of temporary disk the jobs may hold at once; None: the default, 0: no limit
    temp_limit: int | None = None
    init_seed: int = INIT_SEED
    #: outputs with more elements are sampled at this many fixed positions plus their extremes
    #: (see problem_job): 4 Mi positions decide the seed-to-seed comparisons, the extremes zeros
    max_elements: int = 1 << 22
    #: another benchmark's problem is audited with its benchmark's check unless one was chosen
    benchmark_checks: bool = True

    def seed_values(self) -> list[int]:
        return list(range(self.seeds))


@dataclass
class ProblemResult:
    path: str
    line: int = 1
    #: findings span the `class Model` line: columns 1 .. end_column (exclusive)
    end_column: int = 1
    status: str = "ok"  # ok | partial | failed
    device: str | None = None
    wall_s: float = 0.0
    error: str | None = None
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    tolerance: dict[str, Any] = field(default_factory=dict)
    zeros_pass: bool | None = None
    constant_pass: bool | None = None
    constant: float | None = None
    other_input_pass: bool | None = None
    other_input_pairs: dict[str, int] = field(default_factory=dict)
    degenerate: list[str] = field(default_factory=list)
    absolute: dict[str, Any] = field(default_factory=dict)
    gap: dict[str, Any] | None = None
    recommended: dict[str, Any] | None = None
    seeds: list[dict[str, Any]] = field(default_factory=list)
    scales: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    #: it ran out of GPU memory beside other jobs and ran again alone on the GPU (`gpu_share`)
    retried_alone_on_gpu: bool = False
    #: seconds its job waited for GPU memory and locks (neighbours' jobs)
    gpu_wait_s: float = 0.0
    #: runs of its job on the GPU: more than one after running out of memory (None on the CPU)
    gpu_runs: int | None = None
    #: the share of the GPU its job asked first (`problems.gpu_needs`), the most its last run's
    #: caching allocator held (bytes) and the GPU's memory: how far the sizing was from the need
    gpu_need: float | None = None
    gpu_peak_bytes: int | None = None
    gpu_total_bytes: int | None = None
    #: the most its caching allocator held in each step of its last run (`job:` steps, bytes)
    gpu_step_peaks: dict[str, int] = field(default_factory=dict)
    #: where its time went: the job's steps (`job:import`, `job:forward`, `job:fp64` ...),
    #: every run of its job (`runs`), kaudit's comparison of the outputs (`judge`) and the wait
    #: for a turn among the `-j` running (`queued`)
    job_seconds: dict[str, float] = field(default_factory=dict)
    #: seconds from the start of the audit to this problem's turn (None: it had none)
    started_s: float | None = None

    @property
    def max_abs(self) -> float | None:
        return self.stats.get("max_abs")

    def codes(self) -> list[str]:
        return sorted({f.rule for f in self.findings})

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "status": self.status, "device": self.device,
            "wall_s": round(self.wall_s, 3), "error": self.error,
            "shape": self.shapes[0] if len(self.shapes) == 1 else self.shapes,
            "dtype": self.dtypes[0] if len(self.dtypes) == 1 else self.dtypes,
            "max_abs": self.max_abs, "std": self.stats.get("std"), "stats": self.stats,
            "tolerance": self.tolerance,
            "zeros_pass": self.zeros_pass, "constant_pass": self.constant_pass,
            "constant": self.constant, "other_input_pass": self.other_input_pass,
            "other_input_pairs": self.other_input_pairs, "degenerate": self.degenerate,
            "absolute": self.absolute, "gap": self.gap, "recommended": self.recommended,
            "seeds": self.seeds, "scales": self.scales,
            "retried_alone_on_gpu": self.retried_alone_on_gpu, "gpu_wait_s": self.gpu_wait_s,
            "gpu_runs": self.gpu_runs,
            "gpu_need": self.gpu_need, "gpu_peak_bytes": self.gpu_peak_bytes,
            "gpu_total_bytes": self.gpu_total_bytes, "gpu_step_peaks": self.gpu_step_peaks,
            "job_seconds": self.job_seconds, "started_s": self.started_s,
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass
class ProblemsReport:
    options: Options
    device: str
    problems: list[ProblemResult] = field(default_factory=list)
    errors: list[ScanError] = field(default_factory=list)
    files_skipped: int = 0
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def findings(self) -> list[Finding]:
        return [f for p in self.problems for f in p.findings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": {"name": "kaudit", "version": __version__},
            "tolerance": self.options.tolerance.to_dict(),
            "device": self.device, "seeds": self.options.seed_values(),
            "scales": list(self.options.scales),
            "problems": [p.to_dict() for p in self.problems],
            "files_skipped": self.files_skipped,
            "summary": self.summary,
            "errors": [e.to_dict() for e in self.errors],
        }

    def as_scan_report(self):  # -> kaudit.api.Report, for the SARIF renderer and the exit gate
        from kaudit.report.model import Report

        return Report(findings=self.findings, files_scanned=len(self.problems),
                      files_skipped=self.files_skipped, errors=list(self.errors))



COUNTED = {
    "zeros_pass": lambda p: bool(p.zeros_pass),
    "constant_pass": lambda p: bool(p.constant_pass),
    "other_input_pass": lambda p: bool(p.other_input_pass),
    "any_trivial_pass": lambda p: bool(p.zeros_pass or p.constant_pass or p.other_input_pass),
    "degenerate": lambda p: bool(p.degenerate),
    "absolute_dominated": lambda p: "KP201" in p.codes(),
    "ill_conditioned": lambda p: "KP301" in p.codes(),
}


def summarize(problems: list[ProblemResult]) -> dict[str, Any]:
    """Counts over all problems and per folder (a benchmark level)."""
    def counts(group: list[ProblemResult]) -> dict[str, Any]:
        row: dict[str, Any] = {"problems": len(group),
                               "ran": sum(p.status != "failed" for p in group),
                               "failed": sum(p.status == "failed" for p in group)}
        for name, test in COUNTED.items():
            row[name] = sum(test(p) for p in group)
        row["paths"] = {name: [p.path for p in group if COUNTED[name](p)]
                        for name in ("zeros_pass", "constant_pass", "other_input_pass")}
        row["paths"]["failed"] = [p.path for p in group if p.status == "failed"]
        return row

    folders: dict[str, list[ProblemResult]] = {}
    for problem in problems:
        folders.setdefault(os.path.dirname(problem.path) or ".", []).append(problem)
    summary = counts(problems)
    summary["groups"] = [{"key": key, **counts(group)} for key, group in folders.items()]
    return summary
