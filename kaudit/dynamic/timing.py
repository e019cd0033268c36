"""Verified speedups (`kaudit scan --dynamic --timing`): the reference and the candidate timed in
one job, on one device, and judged here.

`--timing` is `auto` (on with `--dynamic` on CUDA, off on the CPU), `on`, `off` or `kernelbench`.
A kernel that passed the dynamic checks (no error) gets a timing job (`harness/timing_job.py`), a
plain run in its own process: no poisoning, so nothing tells it apart from a benchmark's timing.
From the per-trial times it hands back, this module computes, in kaudit's process:

- `measured`: the candidate's and the reference's median milliseconds in the alternating trials,
  the speedup (their ratio), the IQR, the trial count, the method and the device (with its clocks
  before and after, when torch can read them), and the reference's median before the kernel file
  was imported (`reference_before_ms`: far below `reference_ms` on a quiet device, the kernel
  may have slowed the reference down);
- the method: `cuda` (CUDA events, checked against the wall clock: when the candidate's median wall
  time exceeds its median event time by more than `EVENT_SLACK` and `EVENT_SLACK_MS`, the events
  missed work, on another stream say, and both sides are taken by the wall clock: `cuda-wall`),
  `cpu` (the wall clock), `kernelbench` / `kernelbench-host` (KernelBench's `cuda_event` and
  `host_time` methods, mean of the trials, for seeing where a claim came from);
- KD406 when an output of a timed trial (two trials, drawn with the scan's key, on inputs A and B
  unscaled) is wrong against the reference outputs; KD405 when the kernel rebound what the timing
  relies on (then no measurement), and the checks of the reported times against kaudit's own
  clock on the trials (`kaudit.dynamic.witness`: forged times, work moved between trials);
- KD701 (`speedup_findings`) when the speedup the results tree claims exceeds the measured one by
  more than `--speedup-tolerance` (1.5x): an error when the claim is over `ERROR_CLAIM` (2x) and
  the measurement under `NO_SPEEDUP` (1.1x) by the medians, and, unless the kernel was timed
  alone on its GPU (`alone`: holding its exclusive lock, see `timing_lane`), by each side's
  fastest trial too (other work on a shared GPU adds its time to both sides' trials and pulls
  the medians' ratio towards 1: a speedup only the fastest trials show is then a warning; timed
  alone, a kernel cannot turn the error into a warning by skipping its work in one trial),
  unless the claimed runtime is over `OTHER_CONDITIONS` (5x) the measured one: the
  claim was timed on larger inputs (KernelBenchX times at its template's sizes, kaudit at its
  test's), where the same kernel may well be faster than the reference. A claimed runtime far
  *under* the measured one stays an error: that is what a kernel that did less work when it was
  timed claims.
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kaudit.dynamic.judge import (
    Adder,
    Watched,
    _layout_problem,
    fails_again,
    output_name,
    passed_checks,
    size_limit,
)
from kaudit.dynamic.witness import Unavailable, Witness
from kaudit.dynamic.options import DEFAULT_SPEEDUP_TOLERANCE, TimingSettings
from kaudit.dynamic.runner import Job, OutputError, RunResult, run_job
from kaudit.findings import Level

if TYPE_CHECKING:
    from kaudit.discover import WorkItem
    from kaudit.dynamic.kernels import KernelRun
    from kaudit.results import BaselineTimings

TIMING_TARGET = "timing_job.py:run"
#: KD701 is an error when the claim is over ERROR_CLAIM and the measured speedup under NO_SPEEDUP
ERROR_CLAIM, NO_SPEEDUP = 2.0, 1.1
#: a claimed runtime this many times the measured one was timed on larger inputs
OTHER_CONDITIONS = 5.0
#: events "missed work" when the median wall time exceeds the median event time by both of these
EVENT_SLACK, EVENT_SLACK_MS = 1.5, 0.05
#: KernelBench's numbers (src/kernelbench/timing.py, eval.py): 3 warm-up calls, 100 trials in
#: eval_from_generations, the first trial discarded
KERNELBENCH_WARMUP, KERNELBENCH_TRIALS, KERNELBENCH_DISCARD = 3, 100, 1


def timing_job(settings: TimingSettings, common: dict, kernel: str, build: str, key: str,
               path: str, **job: Any) -> Job:
    """The timing job of one kernel; `job`: the other `Job` fields (env, files, visible, ...)."""
    kernelbench = settings.mode == "kernelbench"
    schedule = random.Random(f"{key}\0timing\0{path}")
    low = settings.min_trials
    checks = [2 * schedule.randrange(low // 2), 2 * schedule.randrange(low // 2) + 1]
    args = {**common, "kernel": kernel, "build_dir": build,
            "method": "kernelbench" if kernelbench else "robust",
            "warmup": KERNELBENCH_WARMUP if kernelbench else settings.warmup,
            "min_trials": low, "budget_s": settings.budget_s,
            "max_trials": KERNELBENCH_TRIALS if kernelbench else settings.max_trials,
            "discard": KERNELBENCH_DISCARD, "check": [] if kernelbench else checks}
    return Job(TIMING_TARGET, args, **job)


def measure(add: Adder, run_metrics: dict, job: Job, refs: dict, watched: Watched,
            tolerance: Any, device: str) -> dict[str, Any] | None:
    """Run the timing job and judge it: the measurement (also in `run_metrics["measured"]`), or
    None when there is none (a failed job, tampering, a wrong timed output). `watched`: the
    watched calls' outputs on inputs A and B. The robust method's trials are witnessed on
    kaudit's own clock (`kaudit.dynamic.witness`)."""
    with contextlib.ExitStack() as stack:
        witness = _witness(run_metrics) if job.args["method"] == "robust" else None
        if witness is not None:
            stack.enter_context(witness)
            job = replace(job, args={**job.args, "marks": witness.path},
                          visible=(*job.visible, witness.folder))
        result = stack.enter_context(run_job(job))
        if not result.ok:
            run_metrics["timing_error"] = result.describe()
            return None
        info = result.value if isinstance(result.value, dict) else {}
        if info.get("tampered"):
            names = [str(n) for n in info["tampered"][:12]]
            add("KD405", f"tampering: during the timing run the kernel had replaced what the "
                f"timing relies on: {', '.join(names)}", tampered=names, reason="timing")
            return None
        if _wrong_when_timed(add, result, job.args.get("check", []), refs, watched, tolerance):
            return None
        try:
            if witness is not None and witness.judge(add, info, run_metrics):
                return None
            measured = measurement(info, job.args["method"], device,
                                   alone=result.held_gpu_alone)
        except (KeyError, TypeError, ValueError) as exc:
            run_metrics["timing_error"] = f"unusable timings: {exc}"
            return None
    run_metrics["measured"] = measured
    return measured


def _timed_trial_fails(reference: list, outputs: list, passed: list, tolerance: Any) -> str | None:
    """What a timed trial's outputs fail of what the watched outputs passed, or None."""
    if len(outputs) != len(reference) or any(
            o.shape != r.shape or o.dtype != r.dtype for r, o in zip(reference, outputs)):
        return "its outputs' layout differs from the reference's"
    for index, (r, o) in enumerate(zip(reference, outputs)):
        problem = fails_again(r, o, passed[index], tolerance, output_name(index, reference))
        if problem:
            return problem
    return None


def _witness(run_metrics: dict) -> Witness | None:
    try:
        return Witness()
    except Unavailable as exc:
        run_metrics["witness"] = str(exc)
        return None


def _wrong_when_timed(add: Adder, result: RunResult, checks: list[int], refs: dict,
                      watched: Watched, tolerance: Any) -> bool:
    """KD406 when a checked trial's outputs (trial t used inputs A when t is even, B when odd)
    fail a check the watched outputs passed (`judge.passed_checks`): a kernel exact when
    watched and cheaper when timed is caught, one equally a little off in both is not. A trial
    on B is held to what the watched call on B passed where it passed a check, else to A's (a
    real kernel whose tanh-form GELU passed allclose on A and missed it on B, watched and
    timed alike, was rejected as only right when watched while B's bar was A's)."""
    passed = {"a": [passed_checks(r, w, tolerance) for r, w in zip(refs["a"], watched.a)]}
    passed["b"] = list(passed["a"])
    if not _layout_problem(refs["b"], watched.b):
        passed["b"] = [on_b if any(on_b) else on_a for on_a, on_b in zip(passed["a"], (
            passed_checks(r, w, tolerance) for r, w in zip(refs["b"], watched.b)))]
    for trial in checks:
        kind = "a" if trial % 2 == 0 else "b"
        reference = refs[kind]
        try:
            outputs = result.load_tensors(f"check{trial}.pt", size_limit(reference))
        except (OutputError, FileNotFoundError) as exc:
            add("KD406", f"only right when watched: the timing run's outputs are unusable: {exc}",
                reason="timing")
            return True
        wrong = _timed_trial_fails(reference, outputs, passed[kind], tolerance)
        if wrong:
            add("KD406", f"only right when watched: the watched calls gave the reference's answer, "
                f"but in the timing run (no poisoning, the reference timed beside it) trial "
                f"{trial + 1} is wrong: {wrong}", reason="timing", trial=trial + 1)
            return True
    return False


def measurement(info: dict, method: str, device: str, alone: bool = False) -> dict[str, Any]:
    """The `measured` record from a timing job's per-trial times (see the module docstring);
    `alone`: timed holding the GPU's exclusive lock, which kaudit's process knows."""
    candidate, reference = info["candidate"], info["reference"]
    kernelbench = method == "kernelbench"
    events = device == "cuda" and all(t.get("event") is not None for t in candidate + reference)
    wall = [float(t["wall"]) for t in candidate]
    missed = False
    if events and not kernelbench:
        event_median = statistics.median(float(t["event"]) for t in candidate)
        missed = statistics.median(wall) > max(EVENT_SLACK * event_median,
                                               event_median + EVENT_SLACK_MS)
    use = "event" if events and not missed else "wall"
    ours = [float(t[use]) for t in candidate]
    theirs = [float(t[use]) for t in reference]
    if not ours or not theirs:
        raise ValueError("no trials")
    if kernelbench:  # KernelBench reports the mean, to 3 significant figures
        runtime, reference_ms = _sig3(statistics.fmean(ours)), _sig3(statistics.fmean(theirs))
        name = "kernelbench" if events else "kernelbench-host"
        reference_before = None
    else:
        runtime, reference_ms = statistics.median(ours), statistics.median(theirs)
        name = "cpu" if device != "cuda" else ("cuda" if use == "event" else "cuda-wall")
        # timed like the other trials (events on CUDA): comparable unless the events missed work
        before = [float(v) for v in info.get("reference_before") or []]
        reference_before = statistics.median(before) if before and use == "event" or \
            before and device != "cuda" else None
    # the reference alternating with the kernel spreads drift over both (a busy machine slows
    # both); its time before the kernel file was imported is reported beside it, not used: a
    # machine that got busier since would pass for a kernel that slowed the reference down
    baseline = reference_ms
    if runtime <= 0 or not math.isfinite(runtime):
        raise ValueError(f"candidate time {runtime}")
    measured = {"runtime_ms": round(runtime, 6), "reference_ms": round(baseline, 6),
                "speedup": round(baseline / runtime, 4), "iqr": round(_iqr(ours), 6),
                "trials": len(ours), "method": name, "device": str(info.get("device", device))}
    extras = {"reference_iqr": round(_iqr(theirs), 6),
              # each side's least disturbed trial: other work on a shared GPU adds its time to
              # both sides' trials alike, which pulls the medians' ratio towards 1
              "fastest_speedup": round(min(theirs) / min(ours), 4) if min(ours) > 0 else None,
              "reference_before_ms": round(reference_before, 6) if reference_before else None,
              "reference_during_ms": round(reference_ms, 6),
              "clock_mhz": [info.get("clock_mhz_before"), info.get("clock_mhz_after")]
              if info.get("clock_mhz_before") else None,
              "events_missed_work": missed or None,
              "alone": alone or None,
              "flush_bytes": info.get("flush_bytes") or None}
    measured.update({k: v for k, v in extras.items() if v is not None})
    return measured


def _iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    quartiles = statistics.quantiles(values, n=4, method="inclusive")
    return quartiles[2] - quartiles[0]


def _sig3(value: float) -> float:
    return float(f"{value:.3g}")


def speedup_findings(add: Adder, claimed: float | None, measured: dict | None,
                     tolerance: float = DEFAULT_SPEEDUP_TOLERANCE,
                     claimed_runtime_ms: float | None = None) -> None:
    """KD701: the claimed speedup exceeds the measured one by more than `tolerance`."""
    if claimed is None or not measured or not measured.get("speedup"):
        return
    verified = float(measured["speedup"])
    if claimed <= verified * tolerance:
        return
    runtime = float(measured["runtime_ms"])
    unlike = ""
    if claimed_runtime_ms and runtime > 0 and claimed_runtime_ms > OTHER_CONDITIONS * runtime:
        unlike = (f"; the claim's runtime, {claimed_runtime_ms:.4g} ms, is over "
                  f"{OTHER_CONDITIONS:g}x the measured one: timed on larger inputs, so a warning")
    error = claimed > ERROR_CLAIM and verified < NO_SPEEDUP and not unlike
    fastest = measured.get("fastest_speedup")
    busy = ""
    if error and fastest is not None and fastest >= NO_SPEEDUP and not measured.get("alone"):
        error = False
        busy = (f"; each side's fastest trial gives {fastest:.3g}x: the medians may hold the "
                f"time of other work on a busy GPU, so a warning")
    add("KD701", f"speedup not reproduced: claimed {claimed:.3g}x, measured {verified:.3g}x "
        f"({measured['runtime_ms']:.4g} ms against the reference's {measured['reference_ms']:.4g}"
        f" ms, median of {measured['trials']} trials, IQR {measured['iqr']:.3g} ms, method "
        f"{measured['method']} on {measured['device']}): more than {tolerance:g}x below the claim"
        + (f"; a claim over {ERROR_CLAIM:g}x for a kernel measured under {NO_SPEEDUP:g}x"
           if error else unlike or busy),
        level=Level.ERROR if error else None, claimed=claimed, measured=verified,
        ratio=round(claimed / verified, 3), tolerance=tolerance)


def check_claims(items: Iterable[WorkItem], runs: Iterable[KernelRun],
                 timings: BaselineTimings | None, tolerance: float) -> None:
    """KD701 for every measured kernel whose results tree claims a speedup (its `speedup`, or the
    baseline timings over its runtime)."""
    from kaudit.dynamic.kernels import forward_location
    from kaudit.results import BaselineTimings, Submission

    measured = {run.path: run for run in runs if run.metrics.get("measured")}
    for item in items:
        run = measured.get(item.display)
        if run is None:
            continue
        submission = item.submission or Submission("plain")
        claimed = (timings or BaselineTimings()).speedup(submission)
        if claimed is None:
            continue
        text = item.text if item.text is not None else \
            Path(item.file).read_text(encoding="utf-8", errors="replace")
        speedup_findings(Adder(run, forward_location(item.display, text)), claimed,
                         run.metrics["measured"], tolerance, submission.claim.runtime_ms)
