#!/usr/bin/env python3
"""`kaudit problems` against the naive check of the same problems, in one run.

The naive check is what a benchmark maintainer would write in an afternoon: one process, each
problem's reference on one seed's inputs, then zeros, a constant (the output's mean) and another
seed's output compared with `torch.allclose` at the benchmark's tolerance. It finds the same
blatant problems and none of the subtle ones; the figure to keep small is kaudit's time over it.
Nothing is asserted: the figures go into the README.

    python bench/problems_speed.py FOLDER [--device cpu|cuda] [--jobs N] [--limit N] [--limit-s S]
                                  [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynamic_corpus import run_bounded  # noqa: E402 - one way to run a bounded kaudit


def naive_check(files: list[Path], device: str) -> dict:
    import torch

    started = time.perf_counter()
    accepted = failed = 0
    for index, path in enumerate(files):
        try:
            spec = importlib.util.spec_from_file_location(f"problem_{index}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            outputs = []
            for seed in (0, 1):
                torch.manual_seed(seed)
                model = module.Model(*module.get_init_inputs()).to(device)
                with torch.device(device):  # made by the device: a level-1 input reaches GBs
                    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x
                              for x in module.get_inputs()]
                with torch.no_grad():
                    result = model(*inputs)
                outputs.append(result if isinstance(result, torch.Tensor) else result[0])
            reference = outputs[0].float()
            for trivial in (torch.zeros_like(reference), torch.full_like(reference, reference.mean()),
                            outputs[1].float()):
                accepted += bool(trivial.shape == reference.shape
                                 and torch.allclose(trivial, reference, atol=1e-4, rtol=1e-4))
            del module, model, inputs, outputs
        except Exception:  # noqa: BLE001 - a problem that fails counts, the run goes on
            failed += 1
        if (index + 1) % 10 == 0:  # progress: a run cut short still says how far it got
            print(f"naive check: {index + 1} problems in {time.perf_counter() - started:.1f} s",
                  file=sys.stderr, flush=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - started, "trivial_accepted": accepted,
            "failed": failed}


def kaudit_problems(device: str, jobs: int, files: list[Path], limit_s: float | None) -> dict:
    with tempfile.TemporaryDirectory() as work:
        stream = Path(work) / "stream.jsonl"
        command = [sys.executable, "-m", "kaudit", "problems", *map(str, files),
                   "--device", device, "-j", str(jobs), "-f", "json", "-o", str(Path(work) / "r.json"),
                   "--fail-on", "never", "--stream", str(stream)]
        started = time.perf_counter()
        rc, stderr = run_bounded(command, limit_s, Path(work) / "stderr.txt")
        seconds = time.perf_counter() - started
        lines = [json.loads(line) for line in stream.read_text().splitlines() if line.strip()] \
            if stream.exists() else []
        try:
            summary = json.loads((Path(work) / "r.json").read_text()).get("summary") or {}
        except (OSError, ValueError):  # a run killed by its limit writes no report
            summary = {}
    statuses: dict[str, int] = {}
    for line in lines:
        statuses[str(line.get("status"))] = statuses.get(str(line.get("status")), 0) + 1
    slowest = sorted(lines, key=lambda line: -float(line.get("seconds") or 0))[:5]
    return {"seconds": seconds, "rc": rc, "problems": len(lines),
            "statuses": statuses, "stderr_tail": stderr[-800:],
            "slowest": [(Path(line["path"]).name, round(float(line["seconds"]), 2)) for line in slowest],
            "retried_alone": sum(bool(line.get("retried_alone_on_gpu")) for line in lines),
            "gpu_sizing": gpu_sizing(lines),
            "gpu_wait_s": round(sum(float(line.get("gpu_wait_s") or 0) for line in lines), 1),
            # where the problems' time went, summed over them: the job's steps and the judging
            "job_seconds": {kind: round(sum(float((line.get("job_seconds") or {}).get(kind, 0))
                                            for line in lines), 1)
                            for kind in sorted({k for line in lines
                                                for k in line.get("job_seconds") or {}})},
            "timeline": timeline(lines, seconds, summary),
            # each problem in the order it ended: which ones hold the run up, and on what
            "each": [{"problem": Path(line["path"]).name, "seconds": line.get("seconds"),
                      "started_s": line.get("started_s"),
                      "gpu_wait_s": line.get("gpu_wait_s"), "gpu_need": line.get("gpu_need"),
                      "gpu_peak_gib": round(line["gpu_peak_bytes"] / (1 << 30), 2)
                      if line.get("gpu_peak_bytes") else None,
                      "retried_alone": bool(line.get("retried_alone_on_gpu")),
                      "gpu_runs": line.get("gpu_runs"),
                      # which step held the most GPU memory
                      "gpu_step_peaks_gib": {step: round(held / (1 << 30), 2) for step, held
                                             in (line.get("gpu_step_peaks") or {}).items()},
                      "job_seconds": line.get("job_seconds")} for line in lines],
            # why a problem did not run, or ran in part: what the next run has to fix
            "not_ok": [{"problem": Path(line["path"]).name, "status": line.get("status"),
                        "seconds": line.get("seconds"),
                        "retried_alone": line.get("retried_alone_on_gpu"),
                        "why": [f"{f['rule']}: {f['message'][:400]}" for f in line["findings"]
                                if f["rule"].startswith("KP5")]}
                       for line in lines if line.get("status") != "ok"]}


def timeline(lines: list[dict], seconds: float, summary: dict, step: float = 5.0
             ) -> dict | None:
    """When the run's turns were used: kaudit's preparation (its preload, inside the audit) and
    the sizing beside it before the first job (and the fork server's start, `start_s` long,
    ready `ready_s` after the audit began), when the first and the
    last job started, and how many jobs ran (all their runs, waits for GPU memory included) in
    each `step` seconds, averaged over it: a run bound by its scheduling shows idle turns; and
    the seconds of the command outside the audit (kaudit's start, the report, its exit)."""
    spans = [(line["started_s"], line["started_s"] + float(line["job_seconds"].get("runs", 0)))
             for line in lines if line.get("started_s") is not None and line.get("job_seconds")]
    if not spans:
        return None
    buckets = [0.0] * (int(seconds // step) + 1)
    for begin, end in spans:
        for index in range(int(begin // step), min(len(buckets), int(end // step) + 1)):
            low, high = index * step, (index + 1) * step
            buckets[index] += max(0.0, min(end, high) - max(begin, low)) / step
    audit_s = summary.get("audit_s")
    return {"preparation_s": summary.get("preparation_s"),
            "gpu_sizing_s": summary.get("gpu_sizing_s"), "fork_server": summary.get("fork_server"),
            "audit_s": audit_s,
            "outside_audit_s": round(seconds - audit_s, 2) if audit_s is not None else None,
            "first_start_s": round(min(b for b, _ in spans), 2),
            "last_start_s": round(max(b for b, _ in spans), 2),
            "last_end_s": round(max(e for _, e in spans), 2),
            f"jobs_running_per_{step:g}s": [round(b, 1) for b in buckets]}


def gpu_sizing(lines: list[dict]) -> dict | None:
    """The GPU memory each problem asked first (its sized share) against what its job's caching
    allocator held at most: over-asking makes jobs wait for each other, under-asking makes them
    run out and run again. None without those figures (the CPU, or no sizing)."""
    pairs = [(line["gpu_need"] * line["gpu_total_bytes"], line["gpu_peak_bytes"]) for line in lines
             if line.get("gpu_need") and line.get("gpu_total_bytes") and line.get("gpu_peak_bytes")]
    if not pairs:
        return None
    ratios = sorted(asked / held for asked, held in pairs)
    return {"problems": len(pairs), "median_asked_over_held": round(ratios[len(ratios) // 2], 2),
            "asked_over_twice_held": sum(r > 2 for r in ratios),
            "asked_under_held": sum(r < 1 for r in ratios),
            "asked_gib": round(sum(a for a, _ in pairs) / 2**30, 1),
            "held_gib": round(sum(h for _, h in pairs) / 2**30, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument("--limit-s", type=float, help="kill kaudit after this many seconds")
    parser.add_argument("--json", type=Path, metavar="PATH")
    args = parser.parse_args()
    files = sorted(args.folder.glob("*.py"), key=lambda p: (len(p.name.split("_")[0]), p.name))
    files = files[:args.limit] if args.limit else files
    # in a process of its own: torch's caching allocator keeps what the largest problem took,
    # and a GPU held by this process would leave kaudit's jobs short of memory
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        naive = pool.apply(naive_check, (files, args.device))
    print(f"naive check: {naive['seconds']:.1f} s", flush=True)
    audit = kaudit_problems(args.device, args.jobs, files, args.limit_s)
    figures = {"problems": len(files), "device": args.device, "jobs": args.jobs,
               "naive": naive, "kaudit": audit, "ratio": audit["seconds"] / naive["seconds"]}
    print(f"{len(files)} problems on {args.device}: naive check {naive['seconds']:.1f} s, "
          f"kaudit problems -j {args.jobs} {audit['seconds']:.1f} s "
          f"({figures['ratio']:.1f}x), {audit['problems']} streamed, {audit['statuses']}, "
          f"{audit['retried_alone']} run again alone on the GPU, {audit['gpu_wait_s']} s of "
          "waits for GPU memory (summed over jobs)")
    if audit["gpu_sizing"]:
        print(f"GPU memory asked first against held at most: {audit['gpu_sizing']}")
    if audit["timeline"]:
        print(f"timeline: {audit['timeline']}")
    print("seconds summed over the problems: " + ", ".join(
        f"{kind} {seconds}" for kind, seconds in audit["job_seconds"].items()))
    for problem in audit["not_ok"]:
        print(f"  {problem['problem']} {problem['status']}: {'; '.join(problem['why'])[:300]}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
