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

    python bench/gpu_report.py RES_DIR_OR_TGZ [--device cuda|cpu] [--top N]
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
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
