"""KernelBench's `eval_kernel_against_ref`, gated by kaudit: a harness changes one import,

    from kaudit.integrations.kernelbench import eval_kernel_against_ref

and every sample is audited (both passes, in kaudit's sandboxed child processes) before KernelBench
runs it. The parameters are KernelBench's (src/kernelbench/eval.py); the result has the fields
of its `KernelExecResult` (compiled, correctness, metadata, runtime, runtime_stats, ref_runtime,
ref_runtime_stats) plus `audit`, a `kaudit.KernelAudit`.

- A kernel kaudit rejects, or could not audit (unverified), has `correctness` False and is not run
  in this process at all; `metadata` says why (`kaudit_verdict`, `kaudit_reasons`).
- Otherwise, when KernelBench is installed and CUDA is available, KernelBench's own function runs
  it (its correctness trials, its timing), and `correctness` is KernelBench's.
- Without KernelBench (or without CUDA: Triton kernels run under Triton's CPU interpreter), the
  result is kaudit's alone: `compiled` unless the kernel failed to import or compile,
  `correctness` when its audit ran and passed; no timing (runtime -1).

`device` picks where kaudit's audit runs: None for CUDA when torch sees it, else the CPU; a CUDA
index or device means CUDA. kaudit's audit runs the problem in its own dtype; `precision` is
passed on to KernelBench."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from kaudit.audit import KernelAudit, audit_kernel
from kaudit.dynamic.options import DynamicOptions

#: KD501's phase when the candidate failed before it ran: it did not compile
NOT_COMPILED_PHASE = "import or compile"


@dataclass
class KernelExecResult:
    """KernelBench's KernelExecResult's fields (runtimes in microseconds), plus `audit`."""

    compiled: bool = False
    correctness: bool = False
    metadata: dict = field(default_factory=dict)
    runtime: float = -1.0
    runtime_stats: dict = field(default_factory=dict)
    ref_runtime: float = -1.0
    ref_runtime_stats: dict = field(default_factory=dict)
    audit: KernelAudit | None = None

    def model_dump(self) -> dict[str, Any]:
        """As KernelBench's pydantic result dumps itself, with the audit as a dict."""
        data = {k: v for k, v in asdict(self).items() if k != "audit"}
        data["audit"] = self.audit.to_dict() if self.audit is not None else None
        return data


def eval_kernel_against_ref(
    original_model_src: str,
    custom_model_src: str,
    seed_num: int = 42,
    num_correct_trials: int = 1,
    num_perf_trials: int = 10,
    measure_performance: bool = False,
    timing_method: str = "cuda_event",
    verbose: bool = False,
    build_dir: os.PathLike | None = None,
    device: Any = None,
    backend: str = "cuda",
    precision: Any = None,
    check_for_excessive_speedup: bool = True,
    excessive_speedup_threshold: float = 10,
) -> KernelExecResult:
    audit = audit_kernel(custom_model_src, original_model_src,
                         DynamicOptions(device=_device(device), init_seed=seed_num,
                                        extensions_dir=str(build_dir) if build_dir else None))
    gate = {"kaudit_verdict": audit.verdict, "kaudit_reasons": audit.reasons}
    if audit.passed:
        kernelbench = _kernelbench_eval()
        if kernelbench is not None:
            options = {"seed_num": seed_num, "num_correct_trials": num_correct_trials,
                       "num_perf_trials": num_perf_trials,
                       "measure_performance": measure_performance,
                       "timing_method": timing_method, "verbose": verbose,
                       "build_dir": build_dir, "backend": backend,
                       "check_for_excessive_speedup": check_for_excessive_speedup,
                       "excessive_speedup_threshold": excessive_speedup_threshold}
            if device is not None:
                options["device"] = device
            if precision is not None:
                options["precision"] = precision
            theirs = kernelbench(original_model_src, custom_model_src, **options)
            if theirs is None:  # KernelBench's "lock file" case: it did not evaluate
                return KernelExecResult(metadata=gate, audit=audit)
            return KernelExecResult(
                compiled=bool(theirs.compiled), correctness=bool(theirs.correctness),
                metadata={**dict(theirs.metadata or {}), **gate}, runtime=theirs.runtime,
                runtime_stats=dict(theirs.runtime_stats or {}), ref_runtime=theirs.ref_runtime,
                ref_runtime_stats=dict(theirs.ref_runtime_stats or {}), audit=audit)
    status = audit.metrics.get("status")
    not_compiled = any(f.rule == "KD501" and f.metrics.get("phase") == NOT_COMPILED_PHASE
                       for f in audit.findings)
    return KernelExecResult(compiled=status in ("ok", "failed") and not not_compiled,
                            correctness=audit.passed and status == "ok",
                            metadata=gate, audit=audit)


def _device(device: Any) -> str:
    if device is None:
        return "auto"
    text = str(device)
    return "cpu" if text == "cpu" else "cuda"


def _kernelbench_eval():
    """KernelBench's own function when it is installed and can run (it needs CUDA), else None."""
    try:
        import torch
        from kernelbench.eval import eval_kernel_against_ref as theirs
    except ImportError:
        return None
    return theirs if torch.cuda.is_available() else None
