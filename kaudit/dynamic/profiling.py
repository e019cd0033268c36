"""The profiled run of a kernel that passed (CUDA only): a plain job that records a few calls of
the reference's and the candidate's forward with `torch.profiler` (`harness/profile_job.py`),
judged here by `kaudit.dynamic.attribution` (KD601 library-share, KD602 no-gpu-work, KD403 from
the trace). A job that fails or hands back an unusable record leaves `profile_error` in the run's
metrics and no finding: the profiler's own failures (no CUPTI, say) must not reject a kernel."""

from __future__ import annotations

import json
from typing import Any

from kaudit.dynamic.attribution import OwnKernels, judge_profile
from kaudit.dynamic.judge import Adder
from kaudit.dynamic.runner import Job, run_job

PROFILE_TARGET = "profile_job.py:run"
#: unprofiled calls first (compiles, autotuning), then profiled calls, per model
PROFILE_WARMUP, PROFILE_CALLS = 2, 3
#: the largest record read back
MAX_RECORD_BYTES = 32 << 20


def profile_job(common: dict, kernel: str, build: str, **job: Any) -> Job:
    """The profiled run of one kernel; `job`: the other `Job` fields (env, files, visible, ...)."""
    args = {**common, "kernel": kernel, "build_dir": build, "warmup": PROFILE_WARMUP,
            "calls": PROFILE_CALLS}
    return Job(PROFILE_TARGET, args, **job)


def attribute(add: Adder, run_metrics: dict, job: Job, own: OwnKernels, policy: str,
              same_answer: bool = False) -> None:
    """Run the profiled job and judge its record (`same_answer`: see `judge_profile`)."""
    with run_job(job) as result:
        if not result.ok:
            run_metrics["profile_error"] = result.describe()
            return
        info = result.value if isinstance(result.value, dict) else {}
        if info.get("tampered"):
            names = [str(n) for n in info["tampered"][:12]]
            add("KD405", f"tampering: during the profiled run the kernel had replaced what the "
                f"profiler relies on: {', '.join(names)}", tampered=names, reason="profile")
            return
        try:
            path = result.path("profile.json")
            if path.stat().st_size > MAX_RECORD_BYTES:
                raise ValueError(f"profile.json is {path.stat().st_size} bytes")
            record = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(record, dict):
                raise ValueError("profile.json holds no record")
        except (OSError, ValueError) as exc:
            run_metrics["profile_error"] = f"unusable profile: {exc}"
            return
    try:
        judge_profile(add, record, own, policy, run_metrics, same_answer)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        run_metrics["profile_error"] = f"unusable profile: {type(exc).__name__}: {exc}"
