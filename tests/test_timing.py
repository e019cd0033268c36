"""Verified speedups (`scan --dynamic --timing`, `kaudit.dynamic.timing`), on the CPU (method
`cpu`, the wall clock): the measurement from a job's per-trial times (CUDA events against the wall
clock from synthetic times), KD701 on a results tree with an honest and an inflated claim in every
output format, KernelBench's method, a kernel wrong only when timed (KD406) and one that rebinds
the timer (KD405). The CUDA path runs with KAUDIT_TEST_DEVICE=cuda (test_cuda_timing)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT, expected_findings
from tests.helpers import run_kaudit

torch = pytest.importorskip("torch", reason="kaudit scan --dynamic needs torch; CI installs it")

from kaudit.dynamic.judge import Adder
from kaudit.dynamic.kernels import DynamicOptions, KernelRun, audit_kernel
from kaudit.dynamic.timing import TimingSettings, measurement, speedup_findings
from kaudit.dynamic.tolerance import resolve
from kaudit.findings import Location
from kaudit.results import Claim, Submission
from kaudit.verdicts import judge, summarize

TREE = FIXTURES / "timing"
#: few, short trials: the CPU tests check what is measured and judged, not the machine
QUICK = TimingSettings("on", warmup=2, min_trials=10, max_trials=40, budget_s=0.3)


def _trials(**values: list[float]) -> list[dict]:
    return [{"event": e, "wall": w} for e, w in zip(values.get("event", [None] * 99),
                                                      values["wall"])]


def test_cpu_measurement_takes_medians_of_the_alternating_trials():
    info = {"candidate": _trials(wall=[2.0, 2.2, 1.8, 9.0, 2.1]),
            "reference": _trials(wall=[4.0, 4.4, 3.9, 4.1, 30.0]),
            "reference_before": [3.0, 3.2, 2.9], "device": "cpu"}
    measured = measurement(info, "robust", "cpu")
    assert measured["runtime_ms"] == 2.1 and measured["method"] == "cpu"
    assert measured["reference_ms"] == 4.1 and measured["reference_before_ms"] == 3.0
    assert measured["speedup"] == pytest.approx(4.1 / 2.1, rel=1e-3)
    assert measured["iqr"] == pytest.approx(0.2) and measured["trials"] == 5

    assert set(measured) >= {"runtime_ms", "reference_ms", "speedup", "iqr", "trials", "method",
                             "device"}


def test_cuda_events_are_checked_against_the_wall_clock():
    honest = {"candidate": _trials(event=[1.0] * 5, wall=[1.03] * 5),
              "reference": _trials(event=[2.0] * 5, wall=[2.05] * 5), "device": "H200"}
    measured = measurement(honest, "robust", "cuda")
    assert measured["method"] == "cuda" and measured["speedup"] == 2.0
    assert "events_missed_work" not in measured
    # the events saw 0.1 ms, the wall clock 3 ms: work on another stream; both by the wall clock
    side = {"candidate": _trials(event=[0.1] * 5, wall=[3.0] * 5),
            "reference": _trials(event=[2.0] * 5, wall=[2.05] * 5), "device": "H200",
            "reference_before": [2.0] * 5}
    measured = measurement(side, "robust", "cuda")
    assert measured["method"] == "cuda-wall" and measured["events_missed_work"]
    assert measured["speedup"] == pytest.approx(2.05 / 3.0, rel=1e-3)
    assert "reference_before_ms" not in measured  # event times: not comparable with the wall


def test_kernelbench_method_takes_the_mean_to_three_figures():
    info = {"candidate": _trials(event=[1.0, 1.0, 4.0], wall=[1.1, 1.1, 4.1]),
            "reference": _trials(event=[3.0, 3.0, 3.0], wall=[3.1] * 3), "device": "H200"}
    measured = measurement(info, "kernelbench", "cuda")
    assert measured["method"] == "kernelbench" and measured["runtime_ms"] == 2.0
    assert measured["speedup"] == 1.5
    cpu = measurement({**info, "candidate": _trials(wall=[1.2345] * 3),
                       "reference": _trials(wall=[2.0] * 3)}, "kernelbench", "cpu")
    assert cpu["method"] == "kernelbench-host" and cpu["runtime_ms"] == 1.23


@pytest.mark.parametrize(("claimed", "verified", "expected"), [
    (1.0, 1.0, None), (1.4, 1.0, None),    # within the tolerance
    (1.8, 1.0, "warning"),                 # beyond it, but a claim under 2x
    (3.0, 1.5, "warning"),                 # beyond it, but a real speedup was measured
    (5.0, 1.05, "error"), (283.0, 0.9, "error"),
    (None, 0.5, None)])                    # no claim: nothing to check
def test_kd701_levels(claimed, verified, expected):
    run = KernelRun("k.py")
    measured = {"speedup": verified, "runtime_ms": 1.0, "reference_ms": verified, "trials": 30,
                "iqr": 0.01, "method": "cpu", "device": "cpu"}
    speedup_findings(Adder(run, Location("k.py", 3)), claimed, measured, 1.5)
    assert [f.level.value for f in run.findings] == ([expected] if expected else [])
    if expected:
        assert run.findings[0].rule == "KD701" and f"claimed {claimed:.3g}x" in \
            run.findings[0].message


def test_settings():
    assert not TimingSettings().enabled("cpu") and TimingSettings().enabled("cuda")
    assert TimingSettings("on").enabled("cpu") and TimingSettings("kernelbench").enabled("cpu")
    assert not TimingSettings("off").enabled("cuda")
    with pytest.raises(ValueError, match="--timing"):
        TimingSettings("sometimes")
    with pytest.raises(ValueError, match="speedup-tolerance"):
        TimingSettings(speedup_tolerance=0.5)


def test_a_measurement_confirms_a_large_claim_and_feeds_the_verified_figures():
    claim = Submission("kernelbench-run", "r", 1, 1, 0, claim=Claim(correctness=True,
                                                                      speedup=12.0))
    unconfirmed = judge("a.py", claim, [], None, 10.0)
    assert unconfirmed.verdict == "suspicious" and "unconfirmed" in unconfirmed.reasons[0]
    measured = {"speedup": 11.0, "runtime_ms": 1.0, "reference_ms": 11.0, "iqr": 0.1,
                "trials": 30, "method": "cuda", "device": "H200"}
    confirmed = judge("a.py", claim, [], None, 10.0, measured=measured)
    assert confirmed.verdict == "trusted" and confirmed.to_dict()["measured"] == measured
    slow = judge("b.py", claim, [], None, 10.0, measured={**measured, "speedup": 0.5})
    total = summarize([confirmed, slow, unconfirmed])["total"]
    assert total["median_verified_speedup"] == pytest.approx(5.75)
    assert total["fast_1_verified"] == pytest.approx(1 / 3)
    assert "measured" not in unconfirmed.to_dict()
    assert summarize([unconfirmed])["total"]["fast_1_verified"] is None


def test_results_tree_claims_against_measured_speedups_in_every_format(tmp_path):
    """The honest claim (1.0x, the reference's own operator) stays clean; the inflated one (5x for
    a slower formula) is a KD701 error; every format shows the measurement."""
    out = tmp_path / "out"
    proc = run_kaudit("scan", "fixtures/timing/runs/claims", "--dynamic", "--device", "cpu",
                      "--timing", "on", "--problems", "fixtures/timing/problems", "--select", "KD",
                      # a wider tolerance than the default: this machine's wall clock is shared
                      "--speedup-tolerance", "2", "--no-cache", "--output-dir", str(out), cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    data = json.loads((out / "kaudit.json").read_text())
    found = {(Path(f["path"]).name, f["rule"], f["line"], f["level"]) for f in data["findings"]}
    inflated = TREE / "runs" / "claims" / "level_1_problem_2_sample_0_kernel.py"
    assert found == {(inflated.name, code, line, "error")
                     for code, line in expected_findings(inflated)}
    verdicts = {Path(v["path"]).name: v for v in data["verdicts"]}
    honest, slow = (verdicts[f"level_1_problem_{n}_sample_0_kernel.py"] for n in (1, 2))
    for verdict in (honest, slow):
        measured = verdict["measured"]
        assert measured["method"] == "cpu" and measured["device"] == "cpu"
        assert measured["trials"] >= 30 and measured["runtime_ms"] > 0 and measured["iqr"] >= 0
    assert honest["verdict"] == "trusted" and honest["measured"]["speedup"] > 1 / 2
    assert slow["verdict"] == "rejected" and slow["measured"]["speedup"] < 1.1
    total = data["summary"]["total"]
    assert total["median_claimed_speedup"] == 3.0
    assert total["median_verified_speedup"] == honest["measured"]["speedup"]
    assert total["fast_1_verified"] in (0.0, 0.5)
    sarif = json.loads((out / "kaudit-dynamic.sarif").read_text())
    from tests.test_sarif import validate

    validate(sarif)
    (run,) = sarif["runs"]
    assert [r["ruleId"] for r in run["results"]] == ["KD701"]
    assert {Path(m["path"]).name: m["claimed_speedup"] for m in run["properties"]["measured"]} \
        == {honest["path"].rsplit("/", 1)[-1]: 1.0, slow["path"].rsplit("/", 1)[-1]: 5.0}
    markdown = (out / "kaudit.md").read_text()
    assert "median verified speedup" in markdown and "(measured " in markdown
    text = (out / "kaudit.txt").read_text()
    assert "5.00x / " in text and "verified median speedup" in text


def test_kernelbench_method_on_the_cpu():
    kernel = TREE / "runs" / "claims" / "level_1_problem_1_sample_0_kernel.py"
    options = DynamicOptions(resolve(None, None, None), device="cpu", calls=(8, 12),
                             problem=str(TREE / "problems" / "level1" / "1_Tanh.py"),
                             timing=TimingSettings("kernelbench"))
    run = audit_kernel(str(kernel), str(kernel), kernel.read_text(), options, "cpu")
    measured = run.metrics["measured"]
    assert measured["method"] == "kernelbench-host" and measured["trials"] == 100
    assert run.findings == []


def _pair(folder: Path, kernel: str) -> Path:
    folder.mkdir()
    (folder / "problem.py").write_text((TREE / "problems" / "level1" / "1_Tanh.py").read_text())
    (folder / "kernel.py").write_text(kernel)
    return folder / "kernel.py"


WRONG_WHEN_TIMED = '''import sys
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        if "timing_job" in sys.modules:  # the timing run: fast, and wrong
            return torch.zeros_like(x)
        return torch.tanh(x)
'''
REBINDS_THE_TIMER = '''import time
import torch
import torch.nn as nn

_real = time.perf_counter
time.perf_counter = lambda: _real() * 0.5


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.tanh(x)
'''


@pytest.mark.parametrize(("source", "code", "reason"), [(WRONG_WHEN_TIMED, "KD406", "timing"),
                                                        (REBINDS_THE_TIMER, "KD405", "timing")])
def test_what_the_timing_run_catches(tmp_path, source, code, reason):
    kernel = _pair(tmp_path / "pair", source)
    options = DynamicOptions(resolve(None, None, None), device="cpu", calls=(8, 12), timing=QUICK)
    run = audit_kernel(str(kernel), str(kernel), kernel.read_text(), options, "cpu")
    assert [(f.rule, f.metrics.get("reason"), f.level.value) for f in run.findings] == \
        [(code, reason, "error")], [f.message for f in run.findings]
    assert "measured" not in run.metrics


@pytest.mark.gpu
def test_cuda_timing(tmp_path):
    """On a GPU: events checked against the wall clock, the L2 flush, clocks, the KD701 tree."""
    if os.environ.get("KAUDIT_TEST_DEVICE") != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs KAUDIT_TEST_DEVICE=cuda and a CUDA device")
    out = tmp_path / "out"
    proc = run_kaudit("scan", "fixtures/timing/runs/claims", "--dynamic", "--device", "cuda",
                      "--problems", "fixtures/timing/problems", "--select", "KD", "--no-cache",
                      "--output-dir", str(out), cwd=ROOT)  # --timing auto: on with CUDA
    assert proc.returncode == 1, proc.stderr
    data = json.loads((out / "kaudit.json").read_text())
    assert {(Path(f["path"]).name, f["rule"], f["level"]) for f in data["findings"]} == \
        {("level_1_problem_2_sample_0_kernel.py", "KD701", "error")}
    for verdict in data["verdicts"]:
        measured = verdict["measured"]
        assert measured["method"] == "cuda", measured  # plain PyTorch: the events see it all
        assert measured["flush_bytes"] >= 256 << 20 and measured["trials"] >= 30
        print(Path(verdict["path"]).name, json.dumps(measured))
