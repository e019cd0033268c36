#!/usr/bin/env python3
"""Job start-up benchmark: the wall time of trivial `run_job` jobs (import torch, return its
version) started in a fresh interpreter (KAUDIT_FORKSERVER=0) and forked by the fork server, both
without the OS sandbox, then forked by the fork server inside the sandbox (where it works), in one
run.

    python bench/job_startup.py [--jobs N (default 10)] [--json]

The fork server's first job, which starts the server, is timed on its own; the means cover the N
jobs after it. A kernel audit runs three jobs (reference, candidate and, for a kernel found right,
its plain run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
from kaudit.dynamic import forkserver, sandbox  # noqa: E402
from kaudit.dynamic.runner import Job, run_job  # noqa: E402

TRIVIAL_JOB = "def run(args, out_dir):\n    import torch\n    return torch.__version__\n"


def timed_job(job: Job) -> float:
    start = time.perf_counter()
    with run_job(job) as result:
        seconds = time.perf_counter() - start
        if not result.ok:
            raise SystemExit(f"the trivial job failed: {result.describe()}")
    return seconds


def timed_jobs(job: Job, count: int, fork_server: bool) -> list[float]:
    os.environ["KAUDIT_FORKSERVER"] = "1" if fork_server else "0"
    return [timed_job(job) for _ in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kaudit-job-startup-") as tmp:
        path = Path(tmp) / "trivial.py"
        path.write_text(TRIVIAL_JOB)
        job = Job(f"{path}:run", timeout=300)
        sandbox.set_mode("off")
        plain = timed_jobs(job, args.jobs, fork_server=False)
        forkserver.shutdown()
        (first,) = timed_jobs(job, 1, fork_server=True)
        if forkserver.server_pid() is None:
            raise SystemExit("the fork server did not start")
        forked = timed_jobs(job, args.jobs, fork_server=True)
        sandboxed = None
        if sandbox.available() is None:
            sandbox.set_mode("on")
            sandboxed = statistics.mean(timed_jobs(job, args.jobs, fork_server=True))
    plain_mean, forked_mean = statistics.mean(plain), statistics.mean(forked)
    figures = {"jobs": args.jobs, "cores": os.cpu_count(), "plain_mean_s": round(plain_mean, 4),
               "forkserver_first_job_s": round(first, 4),
               "forkserver_mean_s": round(forked_mean, 4),
               "speedup": round(plain_mean / forked_mean, 1),
               "sandboxed_mean_s": round(sandboxed, 4) if sandboxed is not None else None}
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"{args.jobs} trivial jobs each way, {figures['cores']} cores")
        for label, value in (("fresh interpreter (KAUDIT_FORKSERVER=0)", f"{plain_mean:.3f} s/job"),
                             ("fork server, first job (starts it)", f"{first:.3f} s"),
                             ("fork server, next jobs", f"{forked_mean:.3f} s/job"),
                             ("ratio fresh / forked", f"{figures['speedup']} x"),
                             ("fork server, in the OS sandbox", f"{sandboxed:.3f} s/job"
                              if sandboxed is not None else "unavailable")):
            print(f"{label:42} {value:>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
