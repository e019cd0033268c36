"""What kaudit's own judging costs next to the check a benchmark runs anyway, in the same run.

`scan --dynamic` judges a kernel's outputs in the kaudit process (`parent:judge` in
`job_seconds`): its poisoned, repeated, stale and scaled calls against the reference. This audits
the honest linear fixture on a problem scaled to an output of ROWS x ROWS float32 elements on the
CPU, and times one `torch.allclose` over two outputs of that size, the whole of a benchmark's own
correctness check; the ratio is the figure.

    python bench/judge_speed.py [--rows 4096] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LINEAR = ROOT / "fixtures" / "dynamic" / "good_pytorch_linear"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import torch

    from kaudit.dynamic.kernels import audit_kernel
    from kaudit.dynamic.options import DynamicOptions

    with tempfile.TemporaryDirectory() as folder:
        problem = (LINEAR / "problem.py").read_text()
        problem = problem.replace("randn(32, 64)", f"randn({args.rows}, 64)")
        problem = problem.replace("return [64, 48]", f"return [64, {args.rows}]")
        Path(folder, "problem.py").write_text(problem)
        kernel = Path(folder, "kernel.py")
        kernel.write_text((LINEAR / "kernel.py").read_text())
        judged = []
        for _ in range(args.repeat):
            run = audit_kernel(str(kernel), "kernel.py", kernel.read_text(),
                               DynamicOptions(device="cpu", timeout=600), "cpu")
            assert run.status == "ok", [f.message for f in run.findings]
            judged.append(run.metrics["job_seconds"]["parent:judge"])
    reference = torch.randn(args.rows, args.rows)
    output = reference + 1e-6 * torch.randn(args.rows, args.rows)
    checks = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        torch.allclose(output, reference, atol=1e-2, rtol=1e-2)
        checks.append(time.perf_counter() - started)
    judge, check = statistics.median(judged), statistics.median(checks)
    print(f"{args.rows}x{args.rows} float32 output ({args.rows * args.rows / 1e6:.1f}M "
          f"elements), medians of {args.repeat}: kaudit's judging {judge:.2f} s, one "
          f"torch.allclose {check:.3f} s: {judge / check:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
