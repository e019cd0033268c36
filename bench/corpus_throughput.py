"""kaudit on real kernels, next to KernelBench's static checker on the same files in the same run.

    python bench/static_throughput.py --corpus DIR [--corpus DIR ...]
        (--kernelbench-checker PATH | --kernelbench KERNELBENCH_DIR) [--jobs 1,2] [--repeat 3] [--json]

The files are every `*.py` under the corpus folders that defines `ModelNew` (what `kaudit scan`
scans there). Both tools are timed end to end in fresh processes, interpreter start-up and imports
included: `python -m kaudit scan DIRS --format json --no-cache --jobs J`, and a child that loads
the checker from the path given (never copied into kaudit), reads each file and calls
`validate_kernel_static(code, backend, precision="fp32")` (backend "triton" when the file uses
`@triton.jit`, else "cuda"). The rounds alternate the tools, so both see the same machine;
wall and CPU seconds are each the best of the rounds. Next to wall-clock seconds the report
gives the CPU seconds the tool's processes used (user + system, workers included): on a machine
shared with other work, wall time measures the load as much as the tool, CPU time much less.
Per-file CPU times come from one more in-process pass of each tool.
Standard library only.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CHECKER_IN_REPO = ("src/kernelbench/kernel_static_checker.py", "src/kernel_static_checker.py")
SLOWEST = 5

# Runs in a child: per-file seconds of the checker, loaded from a path, over files read from stdin.
CHECKER_CHILD = r"""
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("kernelbench_static_checker", sys.argv[1])
checker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checker)
times = []
for path in json.load(sys.stdin):
    start = time.process_time()
    with open(path, encoding="utf-8", errors="replace") as handle:
        code = handle.read()
    backend = "triton" if "@triton.jit" in code else "cuda"
    checker.validate_kernel_static(code, backend=backend, precision="fp32")
    times.append(time.process_time() - start)
json.dump(times, sys.stdout)
"""

# Runs in a child: per-file seconds of kaudit's static pass, in process, over files read from stdin.
KAUDIT_CHILD = r"""
import json, sys, time
from kaudit.config import Config
from kaudit.engine import scan_file, scanning
config = Config(cache_dir=None)
paths = json.load(sys.stdin)
times = []
with scanning(config):  # as a scan runs: rules and grammar loaded first, collector tuned
    for path in paths:
        start = time.process_time()
        scan_file(path, path, True, config)
        times.append(time.process_time() - start)
json.dump(times, sys.stdout)
"""


class CorpusError(Exception):
    """A step failed in a way the user must see."""


@dataclass
class Timing:
    name: str
    seconds: float  # wall clock
    cpu_seconds: float  # user + system of the tool's processes
    files: int
    per_file: list[float] | None = None  # CPU seconds per file, in the order of the file list

    @property
    def files_per_s(self) -> float:
        return self.files / self.seconds if self.seconds > 0 else float("inf")


def find_checker(checker: str | None, kernelbench: str | None) -> Path:
    if checker:
        path = Path(checker)
        if not path.is_file():
            raise CorpusError(f"--kernelbench-checker {checker}: no such file")
        return path.resolve()
    assert kernelbench is not None
    for relative in CHECKER_IN_REPO:
        path = Path(kernelbench) / relative
        if path.is_file():
            return path.resolve()
    raise CorpusError(f"--kernelbench {kernelbench}: none of {', '.join(CHECKER_IN_REPO)} there "
                      "(check out a commit that has the static checker)")


def corpus_files(folders: list[str]) -> list[Path]:
    """The `*.py` files kaudit scans in these folders: those that mention `ModelNew`, outside
    hidden folders and `__pycache__` (as `kaudit scan` walks)."""
    found: list[Path] = []
    for folder in folders:
        root = Path(folder)
        if not root.is_dir():
            raise CorpusError(f"--corpus {folder}: not a folder")
        for directory, subdirs, names in os.walk(root, followlinks=True):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and d != "__pycache__")
            for name in sorted(names):
                path = Path(directory) / name
                if name.endswith(".py") and "ModelNew" in path.read_text(encoding="utf-8",
                                                                          errors="replace"):
                    found.append(path.resolve())
    if not found:
        raise CorpusError(f"no file defining ModelNew under {', '.join(folders)}")
    return found


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _child(args: list[str], stdin: str, timeout: float, cwd: Path | None = None,
           exit_codes: tuple[int, ...] = (0,)) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the child and the processes it waited for, stdout)."""
    # Compiled bytecode is kept (an installed kaudit has it), even where the environment says not
    # to write it: otherwise every run would compile kaudit's modules again.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cpu = _cpu_of_children()
    start = time.perf_counter()
    try:
        proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=timeout,
                              cwd=cwd, env=env)
    except subprocess.TimeoutExpired as exc:
        raise CorpusError(f"`{' '.join(args[:4])} ...` timed out after {timeout:.0f}s") from exc
    seconds = time.perf_counter() - start
    if proc.returncode not in exit_codes:
        raise CorpusError(f"`{' '.join(args[:4])} ...` exited {proc.returncode}\n{proc.stderr[-2000:]}")
    return seconds, _cpu_of_children() - cpu, proc.stdout


def time_checker(checker: Path, files: list[Path], timeout: float) -> Timing:
    seconds, cpu, out = _child([sys.executable, "-c", CHECKER_CHILD, str(checker)],
                               json.dumps([str(f) for f in files]), timeout)
    return Timing("KernelBench checker", seconds, cpu, len(files), json.loads(out))


def time_kaudit(folders: list[str], files: list[Path], jobs: int, timeout: float) -> Timing:
    command = [sys.executable, "-m", "kaudit", "scan", *[str(Path(f).resolve()) for f in folders],
               "--format", "json", "--no-cache", "--jobs", str(jobs)]
    # 1: findings; 2: an internal error in some file, reported in the JSON (the scan went on)
    seconds, cpu, out = _child(command, "", timeout, cwd=REPO_ROOT, exit_codes=(0, 1, 2))
    try:
        report = json.loads(out)
    except json.JSONDecodeError as exc:
        raise CorpusError(f"kaudit --jobs {jobs} did not print JSON: {exc}") from exc
    if report.get("files_scanned") != len(files):
        raise CorpusError(f"kaudit --jobs {jobs} scanned {report.get('files_scanned')} files, "
                          f"expected {len(files)}")
    if report.get("errors"):
        print(f"kaudit --jobs {jobs}: {len(report['errors'])} errors, e.g. {report['errors'][0]}",
              file=sys.stderr, flush=True)
    return Timing(f"kaudit --jobs {jobs}", seconds, cpu, len(files))


def kaudit_per_file(files: list[Path], timeout: float) -> list[float]:
    _, _, out = _child([sys.executable, "-c", KAUDIT_CHILD], json.dumps([str(f) for f in files]),
                       timeout, cwd=REPO_ROOT)
    return json.loads(out)


def run(folders: list[str], checker: Path, jobs_values: list[int], repeat: int,
        timeout: float) -> dict:
    files = corpus_files(folders)
    size = sum(f.stat().st_size for f in files)
    print(f"corpus: {len(files)} files ({size / 1e6:.1f} MB) under {', '.join(folders)}",
          file=sys.stderr, flush=True)
    time_kaudit(folders, files, 1, timeout)  # untimed: writes .pyc files, surfaces a broken CLI
    load_before = os.getloadavg()[0]
    best: dict[str, Timing] = {}
    for round_ in range(repeat):
        print(f"round {round_ + 1}/{repeat}", file=sys.stderr, flush=True)
        for timing in [time_checker(checker, files, timeout)] + \
                [time_kaudit(folders, files, jobs, timeout) for jobs in jobs_values]:
            kept = best.setdefault(timing.name, timing)
            kept.cpu_seconds = min(kept.cpu_seconds, timing.cpu_seconds)
            if timing.seconds < kept.seconds:
                kept.seconds, kept.per_file = timing.seconds, timing.per_file or kept.per_file
    checker_timing = best["KernelBench checker"]
    per_file = {"kaudit": kaudit_per_file(files, timeout), "KernelBench checker": checker_timing.per_file}
    rows = [{"tool": name, "files": t.files, "seconds": t.seconds, "files_per_s": t.files_per_s,
             "vs_checker": t.files_per_s / checker_timing.files_per_s, "cpu_seconds": t.cpu_seconds,
             "cpu_vs_checker": checker_timing.cpu_seconds / t.cpu_seconds if t.cpu_seconds else None}
            for name, t in best.items()]
    distributions = {}
    for tool, times in per_file.items():
        assert times is not None
        ordered = sorted(range(len(files)), key=lambda i: times[i], reverse=True)
        distributions[tool] = {
            "median_ms": statistics.median(times) * 1000,
            "p95_ms": sorted(times)[int(0.95 * (len(times) - 1))] * 1000,
            "max_ms": max(times) * 1000,
            "over_100ms": sum(t > 0.1 for t in times),
            "slowest": [{"path": str(files[i]), "ms": times[i] * 1000} for i in ordered[:SLOWEST]],
        }
    machine = {"cpus": os.cpu_count(), "load_average": [load_before, os.getloadavg()[0]]}
    return {"corpus": {"folders": folders, "files": len(files), "bytes": size},
            "checker": str(checker), "repeat": repeat, "machine": machine, "results": rows,
            "per_file": distributions}


def print_report(result: dict) -> None:
    corpus = result["corpus"]
    print(f"corpus: {corpus['files']} files, {corpus['bytes'] / 1e6:.1f} MB "
          f"({', '.join(corpus['folders'])}); checker: {result['checker']}")
    machine = result["machine"]
    print(f"machine: {machine['cpus']} CPUs, 1-minute load average {machine['load_average'][0]:.1f} "
          f"before the timed rounds, {machine['load_average'][1]:.1f} after")
    print(f"end to end, best of {result['repeat']} alternating rounds:")
    header = (f"{'tool':<22} {'files':>6} {'seconds':>8} {'files/s':>8} {'vs checker':>10} "
              f"{'CPU s':>7} {'checker CPU / CPU':>17}")
    print(header)
    print("-" * len(header))
    for row in result["results"]:
        print(f"{row['tool']:<22} {row['files']:>6} {row['seconds']:>8.2f} {row['files_per_s']:>8.0f} "
              f"{row['vs_checker']:>10.2f} {row['cpu_seconds']:>7.2f} {row['cpu_vs_checker']:>17.2f}")
    print("per file, in process (CPU time):")
    for tool, stats in result["per_file"].items():
        print(f"  {tool:<20} median {stats['median_ms']:.1f} ms, p95 {stats['p95_ms']:.1f} ms, "
              f"max {stats['max_ms']:.0f} ms, {stats['over_100ms']} over 100 ms")
        for slow in stats["slowest"]:
            print(f"      {slow['ms']:7.1f} ms  {slow['path']}")


def main(folders: list[str], checker: str | None, kernelbench: str | None, jobs_values: list[int],
         repeat: int, timeout: float, as_json: bool) -> int:
    try:
        result = run(folders, find_checker(checker, kernelbench), jobs_values, repeat, timeout)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)
    return 0
