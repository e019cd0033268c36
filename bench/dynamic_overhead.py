#!/usr/bin/env python3
"""What `kaudit scan --dynamic` costs next to the correctness check a benchmark runs anyway.

For each case (a folder with problem.py and kernel.py) it times, compilation left out of both:

- the plain check benchmarks commonly use, in a fresh `sys.executable` process: import the problem
  and the kernel (timed on its own: load_inline compiles here, into a fresh TORCH_EXTENSIONS_DIR),
  build Model and ModelNew under one seed (ModelNew gets Model's matching state_dict entries), then
  5 trials (inputs from get_inputs() under seeds 0..4, reference and candidate forward,
  torch.allclose with atol = rtol = 1e-2). Its compile part is the kernel import time;
- kaudit's audit of the same kernel (`audit_kernel`), with an extension cache warmed by one untimed
  audit first, so its compile part is a cache hit. Triton compiles at the first launch, not at
  import: the audit's Triton cache lives in the kernel's build folder, warmed by that same untimed
  audit; the plain check's (~/.triton) by its first run.
- with `--sandbox both` (the default where the OS sandbox works), the audit twice, without and
  with the sandbox, interleaved: the sandbox's own cost is the ratio of the two.

    python bench/dynamic_overhead.py [--device cpu|cuda] [--cases NAME_OR_DIR ...] [--repeat N]
                                     [--sandbox both|on|off] [--json PATH]
                                     [--timing off|on|kernelbench|both]

`--timing on` (or `kernelbench`) adds the timing job of verified speedups to every audit (default
off, so the figures stay those of the checks); `--timing both` audits with timing off and on,
interleaved, sandboxed where the sandbox works: what timing adds is the ratio of the two.

Default cases: the good_* folders of fixtures/dynamic/ and bench/fixtures/ that can run on the
device. The target is audit / plain-excluding-compile <= 2 on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kaudit.dynamic import sandbox
from kaudit.dynamic.kernels import (
    DynamicOptions,
    audit_kernel,
    cuda_reason,
    uses_triton,
)
from kaudit.dynamic.problems import resolve_device
from kaudit.dynamic.timing import TimingSettings
from kaudit.dynamic.tolerance import resolve

REPO_ROOT = Path(__file__).resolve().parent.parent
CASE_ROOTS = (REPO_ROOT / "fixtures" / "dynamic", REPO_ROOT / "bench" / "fixtures")
TOLERANCE = "kernelbench-v0"  # atol = rtol = 1e-2, as in the plain check
TIMEOUT_S = 600

# The plain check, run as `python -c PLAIN_CHECK problem.py kernel.py device`; its last stdout line
# is a JSON object.
PLAIN_CHECK = r"""
import importlib.util, json, sys, time
import torch

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

problem_path, kernel_path, device = sys.argv[1:]
problem = load("problem", problem_path)
start = time.perf_counter()
kernel = load("kernel", kernel_path)
compile_s = time.perf_counter() - start
init_inputs = problem.get_init_inputs()
torch.manual_seed(42)
model = problem.Model(*init_inputs).to(device)
torch.manual_seed(42)
model_new = kernel.ModelNew(*init_inputs)
own = model_new.state_dict()
model_new.load_state_dict({k: v for k, v in model.state_dict().items()
                           if k in own and getattr(own[k], "shape", None) == v.shape}, strict=False)
model_new = model_new.to(device)
passed = 0
with torch.no_grad():
    for seed in range(5):
        torch.manual_seed(seed)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in problem.get_inputs()]
        reference = model(*inputs)
        candidate = model_new(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        passed += bool(torch.allclose(reference, candidate, atol=1e-2, rtol=1e-2))
print(json.dumps({"compile_s": compile_s, "passed": passed, "trials": 5}))
"""


class CaseFailed(Exception):
    """A case that could not be measured: its plain check crashed or its audit did not run."""


def runs_on(folder: Path, device: str) -> bool:
    text = (folder / "kernel.py").read_text(encoding="utf-8")
    if device == "cpu":
        return cuda_reason(text) is None
    # a load_inline C++ extension without CUDA sources dereferences host pointers
    return not ("load_inline" in text and cuda_reason(text) is None)


def find_cases(names: list[str] | None, device: str) -> list[Path]:
    if not names:
        return [folder for root in CASE_ROOTS for folder in sorted(root.glob("good_*"))
                if (folder / "kernel.py").is_file() and runs_on(folder, device)]
    cases = []
    for name in names:
        candidates = [Path(name), *(root / name for root in CASE_ROOTS)]
        found = next((c for c in candidates if (c / "kernel.py").is_file()), None)
        if found is None:
            raise SystemExit(f"no case {name!r}: give a folder name under "
                             f"{', '.join(str(r.relative_to(REPO_ROOT)) for r in CASE_ROOTS)} "
                             "or a folder path")
        cases.append(found.resolve())
    return cases


def plain_check(folder: Path, device: str) -> dict[str, float]:
    text = (folder / "kernel.py").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="kaudit-plain-") as scratch:
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": os.path.join(scratch, "extensions")}
        if device == "cpu" and uses_triton(text):
            env["TRITON_INTERPRET"] = "1"  # as kaudit does for the candidate
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", PLAIN_CHECK, str(folder / "problem.py"),
                               str(folder / "kernel.py"), device], cwd=scratch, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise CaseFailed(f"plain check exited {proc.returncode}: {proc.stderr.strip()[-600:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, "compile_s": result["compile_s"],
            "excl_compile_s": wall - result["compile_s"], "passed": result["passed"],
            "trials": result["trials"]}


def audit(folder: Path, options: DynamicOptions, device: str) -> dict:
    kernel = folder / "kernel.py"
    start = time.perf_counter()
    run = audit_kernel(str(kernel), str(kernel), kernel.read_text(encoding="utf-8"), options,
                       device)
    wall = time.perf_counter() - start
    messages = "; ".join(f"{f.rule}: {f.message}" for f in run.findings)
    if run.status != "ok":
        raise CaseFailed(f"audit status {run.status}: {messages}")
    return {"wall_s": wall, "findings": sorted(f.rule for f in run.findings)}


#: what a two-variant run compares: the first variant's figure's name, the ratio's, and their
#: table headers (first variant, last variant, ratio)
COMPARED = {
    "sandbox": ("unsandboxed_s", "sandbox_ratio",
                ("audit, no sandbox (s)", "audit, sandbox (s)", "sandbox x")),
    "timing": ("untimed_s", "timing_ratio",
               ("audit, timing off (s)", "audit, timing on (s)", "timing x")),
}


def measure(folder: Path, device: str, repeat: int, extensions_dir: str,
            variants: list[tuple[str, str]]) -> dict:
    """`variants`: the (sandbox mode, timing) pairs audited; the last is the audit reported, and
    with two, the ratio of the last to the first is what the one that differs adds."""
    options = {variant: DynamicOptions(resolve(TOLERANCE, None, None), device=device,
                                       timeout=TIMEOUT_S, extensions_dir=extensions_dir,
                                       timing=TimingSettings(variant[1]))
               for variant in variants}
    sandbox.set_mode(variants[-1][0])
    audit(folder, options[variants[-1]], device)  # warms the extension and Triton caches
    plains, audits = [], {variant: [] for variant in variants}
    for _ in range(repeat):  # interleaved, so drift hits all alike
        plains.append(plain_check(folder, device))
        for variant in variants:
            sandbox.set_mode(variant[0])
            audits[variant].append(audit(folder, options[variant], device))
    plain = {key: statistics.median(p[key] for p in plains)
             for key in ("wall_s", "compile_s", "excl_compile_s")}
    seconds = {variant: statistics.median(a["wall_s"] for a in runs)
               for variant, runs in audits.items()}
    audit_s = seconds[variants[-1]]
    figures = {**{f"plain_{k}": v for k, v in plain.items()}, "audit_s": audit_s,
               "ratio": audit_s / plain["excl_compile_s"],
               "plain_passed": min(p["passed"] for p in plains),
               "plain_trials": plains[0]["trials"],
               "audit_findings": audits[variants[-1]][0]["findings"],
               "samples": {"plain": plains,
                           **{f"audit_sandbox_{s}_timing_{t}_s": [a["wall_s"] for a in runs]
                              for (s, t), runs in audits.items()}}}
    if len(variants) == 2:
        first_s, ratio, _ = COMPARED["sandbox" if variants[0][0] != variants[1][0] else "timing"]
        figures.update({first_s: seconds[variants[0]], ratio: audit_s / seconds[variants[0]]})
    return figures


def compared(results: list[dict]) -> tuple[str, str, tuple[str, ...]] | None:
    """The COMPARED entry of a two-variant run, None for one variant."""
    return next((keys for keys in COMPARED.values() if any(keys[0] in r for r in results)), None)


def totals(results: list[dict]) -> dict:
    """Sums over the cases that ran, and the ratios of the sums (None when none ran)."""
    done = [r for r in results if "error" not in r]
    keys = ["plain_wall_s", "plain_compile_s", "plain_excl_compile_s", "audit_s"]
    pair = compared(done)
    if pair and all(pair[0] in r for r in done):
        keys.append(pair[0])
    sums = {key: sum(r[key] for r in done) for key in keys}
    found = {**sums, "ratio": sums["audit_s"] / sums["plain_excl_compile_s"] if done else None}
    if pair and pair[0] in sums:
        found[pair[1]] = sums["audit_s"] / sums[pair[0]]
    return found


def table(results: list[dict]) -> str:
    pair = compared(results)
    header = ("case", "plain (s)", "compile (s)", "plain-compile (s)",
              *(pair[2] if pair else ("audit (s)",)), "ratio")
    keys = ["plain_wall_s", "plain_compile_s", "plain_excl_compile_s",
            *((pair[0], "audit_s", pair[1]) if pair else ("audit_s",))]
    rows = []
    for r in results:
        if "error" in r:
            rows.append((r["case"], "FAILED", *[""] * (len(header) - 3), r["error"][:200]))
            continue
        notes = []
        if r["plain_passed"] < r["plain_trials"]:
            notes.append(f"plain passed {r['plain_passed']}/{r['plain_trials']}")
        if r["audit_findings"]:
            notes.append("audit found " + ",".join(r["audit_findings"]))
        rows.append((r["case"], *(f"{r[k]:.2f}" for k in keys),
                     f"{r['ratio']:.2f}" + (f"  ({'; '.join(notes)})" if notes else "")))
    total = totals(results)
    if total["ratio"] is not None:
        rows.append(("total", *(f"{total[k]:.2f}" for k in keys), f"{total['ratio']:.2f}"))
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header) - 1)]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]
                     for row in (header, *rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when torch sees one, else cpu")
    parser.add_argument("--cases", nargs="+", metavar="NAME_OR_DIR")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; medians reported")
    parser.add_argument("--sandbox", choices=("both", "on", "off"), default=None,
                        help="audit without and with the OS sandbox (default: both where it "
                             "works, else off)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also save the figures here")
    parser.add_argument("--timing", choices=("off", "on", "kernelbench", "both"), default="off",
                        help="also time each kernel beside its reference (verified speedups); "
                             "both: audit with timing off and on, sandboxed where it works")
    args = parser.parse_args()
    device = resolve_device(args.device or "auto")
    repeat = max(1, args.repeat)
    cases = find_cases(args.cases, device)
    works = "on" if sandbox.available() is None else "off"
    chosen = args.sandbox or ("both" if works == "on" and args.timing != "both" else works)
    if chosen == "both" and args.timing == "both":
        raise SystemExit("--sandbox both and --timing both: compare one thing at a time")
    sandboxes = ["off", "on"] if chosen == "both" else [chosen]
    timings = ["off", "on"] if args.timing == "both" else [args.timing]
    variants = [(s, t) for s in sandboxes for t in timings]
    results = []

    def save() -> None:  # after every case: a run cut short keeps the cases it finished
        if args.json:
            args.json.write_text(json.dumps({"device": device, "repeat": repeat,
                                             "sandbox": chosen, "timing": args.timing,
                                             "cases": results, "total": totals(results)},
                                            indent=2) + "\n")

    with tempfile.TemporaryDirectory(prefix="kaudit-bench-extensions-") as extensions_dir:
        for folder in cases:
            print(f"{folder.name} ...", file=sys.stderr, flush=True)
            try:
                figures = measure(folder, device, repeat, extensions_dir, variants)
            except Exception as exc:  # noqa: BLE001 -- one broken case must not stop the others
                figures = {"error": f"{type(exc).__name__}: {exc}"}
            results.append({"case": folder.name, **figures})
            save()
    print(f"device {device}, repeat {repeat}, sandbox {chosen}, timing {args.timing}, median "
          "seconds, compile excluded")
    print(table(results))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
