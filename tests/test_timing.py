"""Verified speedups (`scan --dynamic --timing`, `kaudit.dynamic.timing`), on the CPU (method
`cpu`, the wall clock): the measurement from a job's per-trial times (CUDA events against the wall
clock from synthetic times), KD701 on a results tree with an honest and an inflated claim in every
output format, KernelBench's method, a kernel wrong only when timed (KD406) and one that rebinds
the timer (KD405), and the judgement of reported times against kaudit's own clock on the trials
(`kaudit.dynamic.witness`; the hostile kernels that forge them are in tests/adversarial). The CUDA
path runs with KAUDIT_TEST_DEVICE=cuda (test_cuda_timing)."""

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
from kaudit.dynamic.witness import Witness, expected_marks, judge_trials
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


def test_each_sides_fastest_trial_gives_a_second_speedup():
    # a busy GPU added 0-9 ms to trials of both sides: the medians say 1.0x, the fastest 2.0x
    busy = {"candidate": _trials(event=[1.0, 5.0, 9.0, 6.0, 4.0], wall=[1.0, 5.0, 9.0, 6.0, 4.0]),
            "reference": _trials(event=[2.0, 9.0, 5.0, 3.0, 7.0], wall=[2.0, 9.0, 5.0, 3.0, 7.0]),
            "device": "H200"}
    measured = measurement(busy, "robust", "cuda")
    assert measured["speedup"] == 1.0 and measured["fastest_speedup"] == 2.0


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


@pytest.mark.parametrize(("fastest", "alone", "expected"), [
    (None, False, "error"),     # measured before the fastest trials were reported
    (1.0, False, "error"),      # the fastest trials agree: no speedup
    (1.6, False, "warning"),    # only the fastest trials show one: a busy GPU's work in the medians
    (1.6, True, "error")])      # timed alone: one fast trial is the kernel's, not the GPU's
def test_kd701_is_an_error_only_when_the_fastest_trials_agree(fastest, alone, expected):
    run = KernelRun("k.py")
    measured = {"speedup": 1.0, "runtime_ms": 5.0, "reference_ms": 5.0, "trials": 30,
                "iqr": 3.0, "method": "cuda", "device": "H200", "fastest_speedup": fastest,
                **({"alone": True} if alone else {})}
    speedup_findings(Adder(run, Location("k.py", 3)), 3.0, measured, 1.5)
    (finding,) = run.findings
    assert finding.level.value == expected, finding.message
    assert ("fastest trial gives 1.6x" in finding.message) == (expected == "warning")


@pytest.mark.parametrize(("claimed_ms", "expected"), [
    (1.2, "error"),       # the claim was timed as kaudit timed it
    (None, "error"),      # no runtime claimed
    (25.0, "warning"),    # 25x the measured runtime: larger inputs (KernelBenchX's template)
    (0.01, "error")])     # far under it: what a kernel doing less work when timed claims
def test_kd701_is_a_warning_when_the_claim_was_timed_on_larger_inputs(claimed_ms, expected):
    run = KernelRun("k.py")
    measured = {"speedup": 0.9, "runtime_ms": 1.0, "reference_ms": 0.9, "trials": 30,
                "iqr": 0.01, "method": "cuda-events", "device": "cuda"}
    speedup_findings(Adder(run, Location("k.py", 3)), 3.0, measured, 1.5, claimed_ms)
    (finding,) = run.findings
    assert finding.level.value == expected, finding.message


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
#: exact when watched; when timed, an error of about 2e-4 of the value: within the scale-invariant
#: limits but past allclose, which its watched calls pass (a cheaper precision only when timed)
CHEAPER_WHEN_TIMED = '''import sys
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.tanh(x)
        if "timing_job" in sys.modules:
            return out * (1 + 2e-4 * torch.sign(torch.randn_like(out)))
        return out
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


#: the same 0.3 % error on 0.5 % of the elements in every call: past allclose, within the
#: scale-invariant limits, so neither wrong when watched nor when timed
SLIGHTLY_OFF = (FIXTURES / "dynamic" / "bad_fastkernels_slack_noise" / "kernel.py").read_text()


def test_an_output_slightly_off_in_every_call_is_not_wrong_only_when_timed(tmp_path):
    kernel = _pair(tmp_path / "pair", SLIGHTLY_OFF)
    options = DynamicOptions(resolve(None, None, None), device="cpu", calls=(8, 12), timing=QUICK)
    run = audit_kernel(str(kernel), str(kernel), kernel.read_text(), options, "cpu")
    assert run.findings == [], [f.message for f in run.findings]
    assert run.metrics["measured"]["trials"] >= QUICK.min_trials


#: right on inputs A; on inputs B (told apart by the sign of element {k}) 0.5 % of the elements
#: off by 0.3 %, in every call: past allclose, within the scale-invariant limits
OFF_ON_B = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.tanh(x)
        if bool(x.flatten()[{k}] > 0) == {positive}:
            out.view(-1)[::200] *= 1.003
        return out
'''


def test_an_output_a_little_off_on_inputs_b_is_not_wrong_only_when_timed(tmp_path):
    """Only the outputs on inputs A are judged for correctness, and a timed trial on inputs B was
    held to what A's passed: on the H200 a real kernel (KernelBench level 2 problem 53, GELU in
    its tanh form) passed allclose on A, missed it on B both watched and timed, and was rejected
    by KD406 as only right when watched. B's timed trial is now held to B's watched call."""
    from kaudit.dynamic.options import INPUT_SEEDS

    torch.manual_seed(INPUT_SEEDS[0])
    a = torch.randn(256, 1024).flatten()  # the problem's get_inputs(), as its job makes it
    torch.manual_seed(INPUT_SEEDS[1])
    b = torch.randn(256, 1024).flatten()
    k = int(torch.nonzero((a > 0) != (b > 0))[0])
    kernel = _pair(tmp_path / "pair", OFF_ON_B.format(k=k, positive=bool(b[k] > 0)))
    options = DynamicOptions(resolve(None, None, None), device="cpu", calls=(8, 12), timing=QUICK)
    run = audit_kernel(str(kernel), str(kernel), kernel.read_text(), options, "cpu")
    assert run.findings == [], [f.message for f in run.findings]
    assert run.metrics["measured"]["trials"] >= QUICK.min_trials


def test_the_first_call_on_inputs_b_is_held_to_a_plain_miss_where_a_passed_a_check():
    """Only a miss of both checks on B counts, and only where A's output passed one of them:
    A passing allclose only through its absolute part (a warning) still has B judged."""
    from kaudit.dynamic.judge import _right_on_b

    tolerance = resolve(None, None, None)
    ref = torch.linspace(-1, 1, 4096)
    tiny = ref * 1e-6
    within_atol = tiny + 5e-5 * torch.where(torch.arange(4096) % 2 == 0, 1.0, -1.0)
    a_little_off = ref.clone()
    a_little_off[::200] *= 1.003
    cases = {  # name: (ref A, first call on A, ref B, first call on B, A's noise), reported
        "right on A, zeros on B": ((ref, ref, -ref, torch.zeros_like(ref), None), True),
        "A within atol only, zeros on B": ((tiny, within_atol, -ref, torch.zeros_like(ref),
                                            None), True),
        "wrong on A as well": ((ref, torch.zeros_like(ref), -ref, torch.zeros_like(ref),
                                None), False),
        "A's reference is rounding noise": ((ref, ref, -ref, torch.zeros_like(ref), [0.9]),
                                            False),
        "a little off on B": ((ref, ref, ref, a_little_off, None), False),
    }
    for name, ((ref_a, plain_a, ref_b, fresh, noise), reported) in cases.items():
        run = KernelRun("k.py")
        right = _right_on_b(Adder(run, Location("k.py", 3)), [ref_a], [plain_a], [ref_b],
                            [fresh], tolerance, noise)
        assert right is not reported, name
        assert [(f.rule, f.metrics.get("reason")) for f in run.findings] == \
            ([("KD202", "inputs-b")] if reported else []), name


class _TimedTrials:
    """A timing job's checked trials, as `_wrong_when_timed` reads them."""

    def __init__(self, outputs: dict) -> None:
        self.outputs = outputs

    def load_tensors(self, name: str, max_bytes: int) -> list:
        return self.outputs[name]


def test_a_timed_trial_on_b_is_held_to_a_when_the_watched_call_on_b_passed_nothing():
    """B's watched call with another layout (never judged when A's failed with a warning) is no
    bar: the trial is held to A's, as before, instead of stopping the audit."""
    from kaudit.dynamic.judge import Watched
    from kaudit.dynamic.timing import _wrong_when_timed

    ref = torch.linspace(-1, 1, 64)
    refs = {"a": [ref], "b": [-ref]}
    for watched_b in ([torch.zeros(63)], [torch.zeros(64)]):
        for timed_b, wrong in ((-ref, False), (torch.zeros(64), True)):
            run = KernelRun("k.py")
            found = _wrong_when_timed(Adder(run, Location("k.py", 3)),
                                      _TimedTrials({"check0.pt": [ref], "check1.pt": [timed_b]}),
                                      [0, 1], refs, Watched([ref], watched_b),
                                      resolve(None, None, None))
            assert found is wrong and [f.rule for f in run.findings] == (["KD406"] if wrong
                                                                         else [])


@pytest.mark.parametrize(("source", "code", "reason"), [(WRONG_WHEN_TIMED, "KD406", "timing"),
                                                        (CHEAPER_WHEN_TIMED, "KD406", "timing"),
                                                        (REBINDS_THE_TIMER, "KD405", "timing")])
def test_what_the_timing_run_catches(tmp_path, source, code, reason):
    kernel = _pair(tmp_path / "pair", source)
    options = DynamicOptions(resolve(None, None, None), device="cpu", calls=(8, 12), timing=QUICK)
    run = audit_kernel(str(kernel), str(kernel), kernel.read_text(), options, "cpu")
    assert [(f.rule, f.metrics.get("reason"), f.level.value) for f in run.findings] == \
        [(code, reason, "error")], [f.message for f in run.findings]
    assert "measured" not in run.metrics


#: a kernel that notes when each job imports it, in a folder the test shares with it
NOTES_ITS_IMPORT = '''import os, time
import torch
import torch.nn as nn

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "imports.txt"), "a") as f:
    f.write(f"{time.time()}\\n")


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.tanh(x)
'''


def test_a_gated_timing_job_runs_no_kernel_code_before_its_turn(tmp_path, monkeypatch):
    """On a GPU the timing job is gated: its process and CUDA context are made while it waits for
    its turn alone on the GPU, and no code of the kernel runs until then (on the CPU, here, the
    gate is handed to `run_job`)."""
    import contextlib
    import dataclasses
    import time

    from kaudit.dynamic import sandbox, timing
    from kaudit.dynamic.runner import run_job

    kernel = _pair(tmp_path / "pair", NOTES_ITS_IMPORT)
    granted_at: list[float] = []

    @contextlib.contextmanager
    def turn():
        time.sleep(1.0)  # the lane drains the GPU
        granted_at.append(time.time())
        yield {}

    @contextlib.contextmanager
    def alone_in_its_turn(job):
        with run_job(dataclasses.replace(job, gated=True), turn) as result:
            result.held_gpu_alone = True  # as the lane's exclusive lock would have it
            yield result

    monkeypatch.setattr(timing, "run_job", alone_in_its_turn)
    sandbox.set_mode("off")  # the kernel notes its imports beside itself
    try:
        run = audit_kernel(str(kernel), str(kernel), kernel.read_text(),
                           DynamicOptions(resolve(None, None, None), device="cpu",
                                          calls=(8, 12), timing=QUICK), "cpu")
    finally:
        sandbox.set_mode("auto")
    assert run.findings == [] and "measured" in run.metrics, run.metrics.get("timing_error")
    imports = [float(line) for line in (kernel.parent / "imports.txt").read_text().split()]
    assert granted_at and imports[-1] > granted_at[0], "the kernel was imported before its turn"
    assert run.metrics["measured"]["alone"] is True, "recorded from kaudit's side, for KD701"


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


# -- the parent's clock on the trials (kaudit.dynamic.witness) ------------------------------------


def _witnessed(reported: dict[str, list[float]], taken: dict[str, list[float]],
               between: dict[str, float] | None = None) -> tuple[dict, list]:
    """A timing job's info and the marks of its trials: each trial reports `reported` ms and
    takes `taken` ms on the parent's clock; `between` ms pass before a trial of that model."""
    trials = len(reported["candidate"])
    info = {"trials": trials, **{name: _trials(wall=values) for name, values in reported.items()}}
    marks, now = [], 0
    for label in expected_marks(trials)[::2]:
        t, name = int(label.split()[0]), label.split()[1]
        now += int((between or {}).get(name, 0.05) * 1e6)
        marks.append((label, now))
        now += int(taken[name][t] * 1e6)
        marks.append((label.replace("start", "end"), now))
    return info, marks


def _judged(info: dict, marks: list) -> tuple[bool, list, dict]:
    run, metrics = KernelRun("k.py"), {}
    rejected = judge_trials(Adder(run, Location("k.py", 3)), info, marks, metrics)
    return rejected, [(f.rule, f.level.value, f.metrics["reason"]) for f in run.findings], metrics


def test_witnessed_honest_trials_are_clean():
    """Reported times a few microseconds inside their brackets, on a noisy clock: clean."""
    noise = [0.003, 0.02, 0.004, 0.9, 0.005, 0.006, 0.004, 0.003, 0.01, 0.004]
    candidate, reference = [0.01 + 0.001 * i for i in range(10)], [2.0 + 0.1 * i for i in range(10)]
    info, marks = _witnessed({"candidate": candidate, "reference": reference},
                             {"candidate": [c + n for c, n in zip(candidate, noise)],
                              "reference": [r + n for r, n in zip(reference, noise[::-1])]})
    rejected, found, metrics = _judged(info, marks)
    assert (rejected, found) == (False, [])
    assert metrics["witness"]["candidate"]["bracket_ms"] > metrics["witness"]["candidate"][
        "reported_ms"]
    assert metrics["witness"]["between_ms"]["candidate-candidate"] == pytest.approx(0.05)


@pytest.mark.parametrize(("reported", "forged"), [
    ({"candidate": [0.1] * 10, "reference": [2.0] * 10}, ["candidate"]),   # made faster
    ({"candidate": [1.0] * 10, "reference": [6.0] * 10}, ["reference"]),   # the reference slower
    ({"candidate": [0.02] * 10, "reference": [2.0] * 10}, ["candidate"])])  # a tiny kernel, 5x
def test_reported_times_outside_their_brackets_are_forged(reported, forged):
    taken = {"candidate": [1.0] * 10, "reference": [2.0] * 10}
    if forged == ["candidate"] and reported["candidate"][0] == 0.02:
        taken["candidate"] = [0.15] * 10
    rejected, found, _ = _judged(*_witnessed(reported, taken))
    assert (rejected, found) == (True, [("KD405", "error", "timing-forged")])


def test_marks_that_are_not_the_trials_are_tampering():
    info, marks = _witnessed({"candidate": [1.0] * 4, "reference": [1.0] * 4},
                             {"candidate": [1.0] * 4, "reference": [1.0] * 4})
    missing, extra = marks[:-1], [marks[0], ("0 reference end", 5), *marks[1:]]
    unstamped, swapped = [*marks[:3], (marks[3][0], -1), *marks[4:]], marks[2:4] + marks[:2]
    for changed in (missing, extra, unstamped, swapped + marks[4:]):
        rejected, found, _ = _judged(info, changed)
        assert (rejected, found) == (True, [("KD405", "error", "timing-marks")]), changed[:4]
    short = {**info, "candidate": info["candidate"][:3]}
    assert _judged(short, marks)[1] == [("KD405", "error", "timing-marks")]


def test_time_between_the_candidates_trials_is_work_moved_out():
    times = {"candidate": [0.05] * 12, "reference": [1.0] * 12}
    moved = _judged(*_witnessed(times, times, {"candidate": 3.0, "reference": 0.05}))
    assert moved[:2] == (False, [("KD405", "warning", "timing-moved-work")])
    # the same gaps beside both models, or a small difference, are not
    assert _judged(*_witnessed(times, times, {"candidate": 0.1, "reference": 0.1}))[1] == []
    assert _judged(*_witnessed(times, times, {"candidate": 0.2, "reference": 0.05}))[1] == []


def test_the_witness_stamps_marks_as_they_are_sent(tmp_path, monkeypatch):
    """The job's side (`_connect` in the timing job) against the parent's, through a folder
    deeper than a socket address holds."""
    import tempfile
    import time

    from kaudit.dynamic.harness.timing_job import _connect

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with Witness() as witness:
        assert len(witness.path) > 108
        send = _connect(witness.path)
        send(b"0 reference start")
        time.sleep(0.05)
        send(b"0 reference end")
        del send
        marks = witness.marks()
    assert witness.connected and [label for label, _ in marks] == ["0 reference start",
                                                                   "0 reference end"]
    assert 40e6 < marks[1][1] - marks[0][1] < 5e9, marks
    assert _connect(str(tmp_path / "nothing")) is None
