#!/usr/bin/env python3
"""The tables of a `bench/gpu_checks.sh` run, from its results folder (`res/`, or `res.tgz`).

- the dynamic fixtures (`fixtures.jsonl`, `fixtures_fk.jsonl`) against their `# expect:` markers,
  as `tests/test_dynamic.py` judges them on CUDA (the CPU C++ extensions left out, KD500 only
  on a CPU run): how many are as marked, and each that is not;
- every other scan stream (`*.jsonl`): verdicts and statuses, the claimed against the verified
  speedups, and the median seconds per kind of job (`job_seconds`: where an audit's time goes);
- the figures of `bench/problems_speed.py` (`problems_l1.json`: kaudit against the naive check,
  runs again alone, waits for the GPU, why each problem that did not run whole failed) and of
  `bench/dynamic_overhead.py` (`overhead_*.json`: totals).

- with `--keep-cudal1 RUN`, the `cudal1_full` stream's verdicts added to
  `bench/results/cudal1_h100_xsm.jsonl` (the check leaves those tasks out next time) and the
  whole CUDA-L1 file summarised so far.

    python bench/gpu_report.py RES_DIR_OR_TGZ [--device cuda|cpu] [--top N] [--keep-cudal1 RUN]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.conftest import (  # noqa: E402 - the suite's own reading of the markers
    CPU_ONLY,
    CPU_ONLY_FINDINGS,
    DYNAMIC_FIXTURES,
    GPU_ONLY_FINDINGS,
    expected_findings,
)

FIXTURE_STREAMS = ("fixtures.jsonl", "fixtures_fk.jsonl")
#: kaudit's verdicts on CUDA-L1's h100_xsm.json, kept over sessions (`--keep-cudal1`); the
#: `cudal1_full` check leaves these tasks out
CUDAL1_KEPT = ROOT / "bench" / "results" / "cudal1_h100_xsm.jsonl"
CUDAL1_KERNELS = 249


def lines(path: Path) -> list[dict]:
    """A stream's complete lines (a killed scan may leave half a line)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def fixtures(folder: Path, device: str) -> list[str]:
    streamed = {Path(line["path"]).parent.name: line
                for name in FIXTURE_STREAMS if (folder / name).exists()
                for line in lines(folder / name)}
    if not streamed:
        return []
    other = CPU_ONLY_FINDINGS if device == "cuda" else GPU_ONLY_FINDINGS
    out, matched, judged = [], 0, 0
    for kernel in sorted(DYNAMIC_FIXTURES.glob("*/kernel.py")):
        name = kernel.parent.name
        if device == "cuda" and name in CPU_ONLY:
            continue
        expected = {code for code, _ in expected_findings(kernel) if code not in other}
        line = streamed.get(name)
        if line is None:
            out.append(f"- {name}: not streamed (expected {sorted(expected)})")
            continue
        judged += 1
        got = {f["rule"] for f in line["findings"] if f["rule"].startswith("KD")}
        if got == expected:
            matched += 1
        else:
            out.append(f"- {name}: expected {sorted(expected)}, got {sorted(got)} "
                       f"({line['status']}, {line['verdict']})")
    return [f"## Fixtures on {device}: {matched} of {judged} judged as marked"] + out


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def scan(path: Path, top: int) -> list[str]:
    rows = lines(path)
    out = [f"## {path.stem}: {len(rows)} kernels",
           f"verdicts {dict(Counter(r['verdict'] for r in rows))}; "
           f"status {dict(Counter(r['status'] for r in rows))}"]
    claimed = [r for r in rows if (r.get("claimed") or {}).get("speedup") is not None
               or (r.get("measured") or {}).get("speedup") is not None]
    if claimed:
        out += ["", "| kernel | claimed | verified | verdict | errors |", "|---|---|---|---|---|"]
        claimed.sort(key=lambda r: -((r.get("claimed") or {}).get("speedup") or 0))
        for r in claimed[:top]:
            errors = sorted({f["rule"] for f in r["findings"] if f["level"] == "error"})
            out.append(f"| {r['path'][-60:]} | {_ratio((r.get('claimed') or {}).get('speedup'))} "
                       f"| {_ratio((r.get('measured') or {}).get('speedup'))} | {r['verdict']} "
                       f"| {', '.join(errors)} |")
    kinds: dict[str, list[float]] = {}
    for r in rows:
        for kind, seconds in (r.get("job_seconds") or {}).items():
            kinds.setdefault(kind, []).append(seconds)
    audits = [r["seconds"] for r in rows if r.get("seconds") and not r.get("cached")]
    if audits:
        per_job = ", ".join(f"{kind} {statistics.median(v):.1f}" for kind, v in sorted(kinds.items()))
        out.append(f"\naudit seconds: median {statistics.median(audits):.1f}, max "
                   f"{max(audits):.1f} over {len(audits)}"
                   + (f"; median per job: {per_job}" if per_job else ""))
    return out


def keep_cudal1(stream: Path, run: str) -> list[str]:
    """Add the kernels of a `cudal1_full` stream to CUDAL1_KEPT (one line per level and task:
    the newest run, unless an earlier one was whole and this one is not; verdicts and figures
    only, no code of the GPL-3.0 release), and summarise the whole file so far."""
    kept = {(r["level"], r["task_id"]): r for r in lines(CUDAL1_KEPT)} \
        if CUDAL1_KEPT.exists() else {}
    for line in lines(stream):
        measured, key = line.get("measured") or {}, (line["level"], line["problem"])
        if any(f["rule"] == "KD504" for f in line["findings"]):
            line["status"] = "incomplete"  # as kaudit now says: a job stopped on a full disk
        if line["status"] != "ok" and kept.get(key, {}).get("status") == "ok":
            continue  # a disk or a neighbour cut this audit short: the whole one stays
        kept[key] = {
            "level": line["level"], "task_id": line["problem"], "verdict": line["verdict"],
            "status": line["status"],
            "errors": sorted({f["rule"] for f in line["findings"] if f["level"] == "error"}),
            "warnings": sorted({f["rule"] for f in line["findings"] if f["level"] == "warning"}),
            "verified_speedup": measured.get("speedup"), "runtime_ms": measured.get("runtime_ms"),
            "reference_ms": measured.get("reference_ms"), "seconds": line["seconds"], "run": run}
    records = [kept[key] for key in sorted(kept)]
    CUDAL1_KEPT.write_text("".join(json.dumps(r) + "\n" for r in records))
    speedups = sorted(r["verified_speedup"] for r in records if r["verified_speedup"])
    errors = Counter(code for r in records for code in r["errors"])
    out = [f"## CUDA-L1 h100_xsm.json so far: {len(records)} of {CUDAL1_KERNELS} kernels",
           f"verdicts {dict(Counter(r['verdict'] for r in records))}; "
           f"status {dict(Counter(r['status'] for r in records))}",
           f"kernels with each error: {dict(errors.most_common())}"]
    if speedups:
        out.append(f"verified speedups: {len(speedups)} timed, median "
                   f"{statistics.median(speedups):.2f}x, {speedups[0]:.2f}-{speedups[-1]:.2f}x, "
                   f"{sum(v > 1 for v in speedups)} over 1x")
    return out


def figures(folder: Path) -> list[str]:
    out = []
    for path in sorted(folder.glob("problems*.json")):
        data = json.loads(path.read_text())
        audit = data["kaudit"]
        out += [f"\n## {path.name}: {data['problems']} problems on {data['device']}, -j "
                f"{data['jobs']}: kaudit {audit['seconds']:.1f} s, naive check "
                f"{data['naive']['seconds']:.1f} s ({data['ratio']:.1f}x); {audit['statuses']}; "
                f"run again alone {audit.get('retried_alone', '-')}; GPU waits "
                f"{audit.get('gpu_wait_s', '-')} s (summed)"]
        if audit.get("gpu_sizing"):
            out.append(f"GPU memory asked first against held at most: {audit['gpu_sizing']}")
        if audit.get("job_seconds"):
            out.append("seconds summed over the problems: " + ", ".join(
                f"{kind} {seconds}" for kind, seconds in audit["job_seconds"].items()))
        out += [f"- {p['problem']} {p['status']}: {'; '.join(p['why'])[:240]}"
                for p in audit.get("not_ok", [])]
    for path in sorted(folder.glob("overhead*.json")):
        data = json.loads(path.read_text())
        total = data.get("total") or {}
        out.append(f"\n## {path.name}: timing {data['timing']}, sandbox {data['sandbox']}: "
                   + ", ".join(f"{key} {value:.2f}" for key, value in total.items()
                               if isinstance(value, (int, float))))
        out += [f"- {case['case']}: " + (case["error"][:200] if "error" in case else
                                         f"audit {case['audit_s']:.2f} s, plain excl. compile "
                                         f"{case['plain_excl_compile_s']:.2f} s")
                for case in data["cases"]]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the res/ folder, or res.tgz")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--top", type=int, default=20, help="rows per speedup table")
    parser.add_argument("--keep-cudal1", metavar="RUN", help="add the run's cudal1_full "
                        f"verdicts to {CUDAL1_KEPT.relative_to(ROOT)}, labelled RUN (e.g. "
                        "'2026-12-03 H200, torch 2.11, kaudit REV'), and summarise the file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.results
        if folder.is_file():
            with tarfile.open(folder) as packed:
                packed.extractall(scratch, filter="data")
            folder = Path(scratch) / "res"
        report = fixtures(folder, args.device)
        for path in sorted(folder.glob("*.jsonl")):
            if path.name not in FIXTURE_STREAMS:
                report += [""] + scan(path, args.top)
        report += figures(folder)
        if args.keep_cudal1 and (folder / "cudal1_full.jsonl").exists():
            report += [""] + keep_cudal1(folder / "cudal1_full.jsonl", args.keep_cudal1)
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
