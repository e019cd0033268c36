#!/usr/bin/env python3
"""`kaudit scan --dynamic` over a tree of real kernels: cold, with a warm build cache, and resumed.

Three runs of the same command in one process tree, each timed end to end:
- cold: an empty build cache and an empty result cache (every extension compiled);
- warm build: the build cache of the cold run, a new result cache (every kernel audited again,
  nothing compiled);
- resumed: the warm run's result cache as well (nothing audited again).
`--only cold` and then `--only warm` with the same `--work` split them over two commands.
`--limit-s` bounds the runs together, and `--json` is written after each run, so a command cut
short keeps the runs it finished. Nothing is asserted: the figures go into the README.

    python bench/dynamic_corpus.py TREE --problems KERNELBENCH_FOLDER [--device cuda] [--jobs N]
                                   [--baseline-timings FILE] [--work DIR] [--only cold|warm]
                                   [--limit-s S] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


#: seconds kept for the resumed run (every kernel read from the result cache: 6.7-7.0 s for 14
#: kernels on the H200) when a warm run comes before it under one `--limit-s`
RESUMED_S = 30.0


def run_bounded(command: list[str], limit_s: float | None, stderr_path: Path) -> tuple[object, str]:
    """Run kaudit in its own session, output to files (its jobs would hold a pipe open), and kill
    the whole session when it outlives `limit_s`: the figures of a killed run are what it streamed."""
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr,
                                   start_new_session=True)
        try:
            rc: object = process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            rc = "killed"
    return rc, stderr_path.read_text(errors="replace")


def scan(tree: Path, args: argparse.Namespace, build: Path, cache: Path, work: Path, name: str,
         limit_s: float | None) -> dict:
    stream, report = work / f"{name}.jsonl", work / f"{name}.json"
    for left in (stream, report):  # an earlier command's, which a killed run would not replace
        left.unlink(missing_ok=True)
    command = [sys.executable, "-m", "kaudit", "scan", str(tree), "--dynamic", "--device", args.device,
               "-j", str(args.jobs), "--build-cache", str(build), "--cache-dir", str(cache),
               "--problems", str(args.problems), "--stream", str(stream), "-f", "json",
               "-o", str(report), "--fail-on", "never"]
    if args.baseline_timings:
        command += ["--baseline-timings", str(args.baseline_timings)]
    started = time.perf_counter()
    rc, stderr = run_bounded(command, limit_s, work / f"{name}.stderr")
    seconds = time.perf_counter() - started
    lines = [json.loads(line) for line in stream.read_text().splitlines() if line.strip()] \
        if stream.exists() else []
    verdicts: dict[str, int] = {}
    for line in lines:
        verdicts[str(line.get("verdict"))] = verdicts.get(str(line.get("verdict")), 0) + 1
    summary = json.loads(report.read_text()).get("summary", {}).get("total") if report.exists() else None
    figures = {"seconds": round(seconds, 1), "rc": rc, "kernels": len(lines),
            "cached": sum(bool(line.get("cached")) for line in lines), "verdicts": verdicts,
            "summary": summary, "stderr_tail": stderr[-600:]}
    print(f"{name}: {figures['seconds']} s, {figures['kernels']} kernels streamed "
          f"({figures['cached']} from the result cache), verdicts {figures['verdicts']}, rc {rc}",
          flush=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", type=Path)
    parser.add_argument("--problems", type=Path, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--baseline-timings", type=Path)
    parser.add_argument("--work", type=Path, help="keep caches and reports here (default: a temp folder)")
    parser.add_argument("--only", choices=("cold", "warm"), help="one run: cold, or warm and resumed")
    parser.add_argument("--limit-s", type=float,
                        help="the seconds of all the runs together: a run still going at its "
                             "part is killed (see `limit` in main)")
    parser.add_argument("--json", type=Path, metavar="PATH")
    args = parser.parse_args()
    deadline = time.monotonic() + args.limit_s if args.limit_s else None
    planned = [("cold", "cache-cold", "cold")] if args.only != "warm" else []
    if args.only != "cold":
        planned += [("warm_build", "cache-warm", "warm"), ("resumed", "cache-warm", "resumed")]

    def limit(run: str) -> float | None:
        """What is left, less RESUMED_S for the resumed run after a warm one, and half the
        rest for a warm run after a cold one."""
        if deadline is None:
            return None
        resumed_later = run != "resumed" and args.only != "cold"
        left = deadline - time.monotonic() - (RESUMED_S if resumed_later else 0.0)
        return max(1.0, left / 2 if run == "cold" and args.only is None else left)

    with tempfile.TemporaryDirectory() as temporary:
        work = args.work or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        runs = {}
        for run, cache, name in planned:
            runs[run] = scan(args.tree, args, work / "builds", work / cache, work, name,
                             limit(run))
            if args.json:  # after each run: a command killed later keeps the runs before
                args.json.write_text(json.dumps({"device": args.device, "jobs": args.jobs,
                                                 "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
