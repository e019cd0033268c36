#!/usr/bin/env python3
"""Run-to-run spread of verified speedups (`--timing`) on the honest fixtures.

Each case (a good_* folder of fixtures/dynamic/ and bench/fixtures/ that runs on the device, or
those named) is audited `--repeat` times with timing on; for each, the measured speedups' median,
their range over the median (the run-to-run spread) and the median of the within-run IQR over the
runtime. Nothing is asserted: the figures go into the README.

    python bench/timing_spread.py [--device cpu|cuda] [--cases NAME ...] [--repeat N]
                                  [--method on|kernelbench] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from kaudit.dynamic.kernels import DynamicOptions, audit_kernel
from kaudit.dynamic.problems import resolve_device
from kaudit.dynamic.timing import TimingSettings
from kaudit.dynamic.tolerance import resolve

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynamic_overhead import find_cases  # noqa: E402 - the same cases as the overhead bench


def spread(folder: Path, device: str, repeat: int, method: str, extensions: str) -> dict:
    options = DynamicOptions(resolve(None, None, None), device=device, timeout=600,
                             extensions_dir=extensions, timing=TimingSettings(method))
    kernel = folder / "kernel.py"
    runs = []
    for _ in range(repeat):
        run = audit_kernel(str(kernel), str(kernel), kernel.read_text(encoding="utf-8"), options,
                           device)
        if "measured" not in run.metrics:
            raise RuntimeError(f"not measured: {run.status}, "
                               f"{[f.rule for f in run.findings]}, "
                               f"{run.metrics.get('timing_error')}")
        runs.append(run.metrics["measured"])
    speedups = [m["speedup"] for m in runs]
    middle = statistics.median(speedups)
    return {"speedup_median": middle, "speedup_min": min(speedups), "speedup_max": max(speedups),
            "run_to_run_spread": (max(speedups) - min(speedups)) / middle,
            "iqr_over_runtime": statistics.median(m["iqr"] / m["runtime_ms"] for m in runs),
            "trials": statistics.median(m["trials"] for m in runs),
            "method": runs[0]["method"], "device": runs[0]["device"], "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    parser.add_argument("--cases", nargs="+", metavar="NAME_OR_DIR")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--method", choices=("on", "kernelbench"), default="on")
    parser.add_argument("--json", type=Path, metavar="PATH")
    args = parser.parse_args()
    device = resolve_device(args.device or "auto")
    results = []
    with tempfile.TemporaryDirectory(prefix="kaudit-bench-extensions-") as extensions:
        for folder in find_cases(args.cases, device):
            print(f"{folder.name} ...", file=sys.stderr, flush=True)
            try:
                figures = spread(folder, device, max(2, args.repeat), args.method, extensions)
            except Exception as exc:  # noqa: BLE001 -- one broken case must not stop the others
                figures = {"error": f"{type(exc).__name__}: {exc}"}
            results.append({"case": folder.name, **figures})
    print(f"device {device}, {args.repeat} runs per case, timing {args.method}")
    print("case  method  speedup median [min, max]  run-to-run spread  IQR/runtime  trials")
    for r in results:
        if "error" in r:
            print(f"{r['case']}  FAILED  {r['error'][:200]}")
            continue
        print(f"{r['case']}  {r['method']}  {r['speedup_median']:.3f} [{r['speedup_min']:.3f}, "
              f"{r['speedup_max']:.3f}]  {r['run_to_run_spread']:.1%}  "
              f"{r['iqr_over_runtime']:.1%}  {r['trials']:.0f}")
    if args.json:
        args.json.write_text(json.dumps({"device": device, "repeat": args.repeat,
                                         "method": args.method, "cases": results}, indent=2)
                             + "\n")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
