#!/usr/bin/env python3
"""Two `kaudit problems` processes on one GPU at once: does a problem that fits ever fail with
out-of-memory because of its neighbours? (issue 13: before GPU sharing, problems that need a few
MB failed as KP501 "out of memory" when two kaudit processes each assumed they owned the GPU.)

Both processes audit the same problems (`-j JOBS` each, `--device cuda`, one GPU: the first
visible one), writing JSON; this script then counts, per process, the problems, the KP501
findings, those that say "out of memory", and the jobs that ran once more alone on the GPU
(a problem's `retried_alone_on_gpu`), prints one line per process and writes them all to `--json`.

    python bench/gpu_share.py KernelBench/KernelBench/level1 [--problems 16] [--jobs 4]
                              [--processes 2] [--json OUT/gpu_share.json]
    python bench/gpu_share.py level1/19_ReLU.py level1/23_Softmax.py ...

Problems: the files named, and the first `--problems` files of each folder named, in natural
order (KernelBench level 1's activations, 19-32, hold 1.6e9-element tensors: a few of them on
one GPU at once do not fit). Exit status 1 when any process reported a KP501 out of memory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def natural(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", type=Path, nargs="+")
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    files = []
    for path in args.paths:
        files += sorted((p for p in path.glob("*.py") if not p.name.startswith("_")),
                        key=natural)[:args.problems] if path.is_dir() else [path]
    if not files:
        print("no problem files", file=sys.stderr)
        return 2
    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    folder = Path(tempfile.mkdtemp(prefix="gpu-share-"))
    started = time.monotonic()
    processes = []
    for index in range(args.processes):
        output = folder / f"run{index}.json"
        command = [sys.executable, "-m", "kaudit", "problems", *map(str, files), "--device",
                   args.device, "-j", str(args.jobs), "--timeout", str(args.timeout), "-f", "json",
                   "-o", str(output), "--fail-on", "never"]
        processes.append((output, subprocess.Popen(command, env=env,
                                                   stderr=subprocess.PIPE, text=True)))
    rows = []
    for index, (output, process) in enumerate(processes):
        _, stderr = process.communicate()
        row: dict = {"process": index, "exit": process.returncode,
                     "seconds": round(time.monotonic() - started, 1)}
        try:
            report = json.loads(output.read_text())
        except (OSError, ValueError):
            row["error"] = stderr.strip().splitlines()[-3:]
            rows.append(row)
            continue
        findings = [f for p in report["problems"] for f in p["findings"]]
        failed = [f for f in findings if f["rule"] == "KP501"]
        row.update(problems=len(report["problems"]), kp501=len(failed),
                   kp501_out_of_memory=sum("out of memory" in f["message"] for f in failed),
                   retried_alone=sum(bool(p.get("retried_alone_on_gpu"))
                                     for p in report["problems"]),
                   temp=report["summary"].get("temp"),
                   kp501_messages=[f["message"][:200] for f in failed])
        rows.append(row)
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "kp501_messages"}))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"gpu": gpu, "files": [str(f) for f in files],
                                         "jobs": args.jobs, "runs": rows}, indent=1))
    return 0 if all(row.get("kp501_out_of_memory") == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
