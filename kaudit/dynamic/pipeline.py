"""The dynamic pass inside one scan (`kaudit.scan_paths(..., dynamic=DynamicOptions(...))`): the
kernels the static pass read, run against their reference problems (`kernels.audit_items`), each
kernel's findings handed back the moment it ends, named and fingerprinted like static ones and
marked against the baseline. `kaudit.api` judges the verdicts once, from both passes.

The kernels run on `options.executor` (`kaudit.dynamic.executors`: this machine, or a Ray
cluster), which also chooses the device and guards the jobs (`selfcheck.jobs_guarded`: the
sandbox mode set and checked, stale temporary folders removed, kaudit's own code fingerprinted
before the first job and checked after the last). The result cache is read and written here."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kaudit.baseline import mark_findings
from kaudit.config import Config
from kaudit.discover import WorkItem
from kaudit.dynamic import acceptance, scratch, shapes
from kaudit.dynamic.executors import executor_for
from kaudit.dynamic.kernels import KernelRun, audit_items
from kaudit.dynamic.options import DynamicOptions
from kaudit.dynamic.result_cache import DynamicCache
from kaudit.dynamic.timing import check_claims
from kaudit.findings import Finding, assign_fingerprints
from kaudit.results import BaselineTimings
from kaudit.source import split_lines


@dataclass
class DynamicPass:
    """What the dynamic pass adds to a scan."""

    device: str
    #: the dynamic findings of each scanned file, by `WorkItem.key`
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    runs: list[KernelRun] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: the temporary disk of the pass: its limit and the peak its jobs' folders reached (bytes)
    temp: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"device": self.device, "kernels": len(self.runs),
                "statuses": dict(Counter(run.status for run in self.runs)),
                "cached": sum(run.cached for run in self.runs), "temp": self.temp,
                **acceptance.summary(self.runs), **shapes.summary(self.runs)}


def run_pass(items: list[WorkItem], options: DynamicOptions, config: Config,
             baseline: set | None = None,
             on_kernel: Callable[[int, int, WorkItem, list[Finding], KernelRun, float], None]
             | None = None
             ) -> DynamicPass:
    """Run the kernels among `items` (the static pass's scanned items, one per file);
    `on_kernel(done, total, item, findings, run, seconds)` when each ends, with its reported findings.
    Raises ConfigError for an unusable device or executor (`--executor ray` without Ray, or
    without a GPU in the cluster for a CUDA run), SandboxError and InstallationChanged."""
    if options.policy != config.policy:  # KD601's level follows the scan's policy
        options = dataclasses.replace(options, policy=config.policy)
    with executor_for(options) as executor:
        device = executor.device()
        result = DynamicPass(device)
        cache = _open_cache(config, options, device, result.warnings)
        timings = BaselineTimings.load(config.baseline_timings) if config.baseline_timings \
            else None

        def finished(done: int, total: int, item: WorkItem, run: KernelRun,
                     seconds: float) -> None:
            check_claims([item], [run], timings, options.timing.speedup_tolerance)  # KD701
            findings = _reported(item, run, config, baseline)
            result.findings[item.key] = findings
            if on_kernel is not None:
                on_kernel(done, total, item, findings, run, seconds)

        budget = scratch.start_budget(options.temp_limit)
        try:
            with executor.guarded(device):
                result.runs = audit_items(items, options, device, finished, cache, executor)
        finally:
            result.temp = budget.usage()
            result.warnings.extend(executor.warnings)
            if cache is not None:
                cache.close()
                if cache.warning:
                    result.warnings.append(cache.warning)
    return result


def _open_cache(config: Config, options: DynamicOptions, device: str, warnings: list[str]
                ) -> DynamicCache | None:
    if not config.cache_dir:
        return None
    try:
        return DynamicCache(config.cache_dir, options, device)
    except Exception as exc:  # noqa: BLE001 - an unusable cache: the scan goes on without it
        warnings.append(f"dynamic result cache {config.cache_dir} not usable "
                        f"({type(exc).__name__}: {exc}); running every kernel")
        return None


def _reported(item: WorkItem, run: KernelRun, config: Config, baseline: set | None
              ) -> list[Finding]:
    """A run's findings as the report shows them: enabled rules only, fingerprinted against
    the kernel's lines, marked against the baseline."""
    try:
        text = item.text if item.text is not None else \
            Path(item.file).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    findings = assign_fingerprints([f for f in run.findings if config.is_enabled(f.rule)],
                                   {item.display: split_lines(text)})
    return mark_findings(findings, baseline) if baseline is not None else findings
