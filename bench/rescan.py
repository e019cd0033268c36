#!/usr/bin/env python3
"""Re-scan benchmark: the first scan of a results tree next to a re-scan of the unchanged tree,
which the content-hash result cache answers, in one run.

    python bench/rescan.py [--files N (default 4000)] [--jobs J (default 2)] [--seed S] [--json]

The corpus is bench/static_throughput.py's synthetic KernelBench-style kernels. Both scans run
`python -m kaudit scan DIR --format json` end to end, with a fresh cache folder for the first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from static_throughput import REPO_ROOT, build_corpus  # noqa: E402


def timed_scan(target: Path, cache: Path, jobs: int) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "kaudit", "scan", str(target), "--format", "json",
           "--jobs", str(jobs), "--cache-dir", str(cache)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"`{' '.join(cmd)}` exited {proc.returncode}: {proc.stderr[-2000:]}")
    return seconds, json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kaudit-rescan-") as tmp:
        corpus = build_corpus(Path(tmp) / "tree", args.files, args.seed)
        cache = Path(tmp) / "cache"
        first, first_report = timed_scan(corpus.directory, cache, args.jobs)
        again, again_report = timed_scan(corpus.directory, cache, args.jobs)
        if first_report != again_report:
            raise SystemExit("the cached re-scan reported something else than the first scan")
        figures = {"files": args.files, "jobs": args.jobs, "cores": os.cpu_count(),
                   "first_scan_s": round(first, 3), "rescan_s": round(again, 3),
                   "speedup": round(first / again, 1),
                   "findings": len(first_report["findings"])}
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"{figures['files']} files, --jobs {figures['jobs']}, {figures['cores']} cores")
        print(f"first scan (empty cache)   {first:8.2f} s   {args.files / first:8.1f} files/s")
        print(f"re-scan (unchanged tree)   {again:8.2f} s   {args.files / again:8.1f} files/s")
        print(f"re-scan is {first / again:.1f}x faster; both reports identical "
              f"({figures['findings']} findings)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
