"""`scan --dynamic` on other benchmarks' layouts (`kaudit.dynamic.adapted`), on the CPU: the
fixtures of fixtures/benchmarks/dynamic/ (plain PyTorch, each benchmark's own shape) run through
their wrappers, with their benchmark's check, and give the findings their kernels deserve
(FastKernels candidates on the inputs of their capture reports); a submission whose problem
cannot be built is a KD502 note saying why."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FIXTURES, ROOT
from tests.test_cli import kaudit

torch = pytest.importorskip("torch", reason="the dynamic pass needs torch; CI installs it")

from kaudit.adapters import adapt  # noqa: E402
from kaudit.adapters.model import Size  # noqa: E402
from kaudit.discover import discover  # noqa: E402
from kaudit.dynamic.adapted import input_names, smallest  # noqa: E402
from kaudit.dynamic.kernels import DynamicOptions, audit_items  # noqa: E402
from kaudit.dynamic.tolerance import resolve  # noqa: E402

DYNAMIC = FIXTURES / "benchmarks" / "dynamic"


@pytest.fixture(scope="module")
def runs():
    items = adapt(discover([str(DYNAMIC), str(FIXTURES / "benchmarks" / "fastkernels" / "set"),
                            str(FIXTURES / "benchmarks" / "kernelbenchx" / "submissions")])).items
    options = DynamicOptions(resolve(None, None, None), device="cpu", calls=(8, 12), timeout=240)
    return {run.path.split("benchmarks/", 1)[1]: run for run in audit_items(items, options, "cpu")}


def findings(run):
    return sorted((f.rule, f.line) for f in run.findings)


def test_atrex_model_runs_with_its_inputs_by_name_and_its_check(runs):
    honest = runs["dynamic/atrex/data/silu_mul/generated_kernel.py"]
    assert (honest.status, findings(honest)) == ("ok", []), honest.findings
    assert honest.metrics["tolerance"] == "atrex" and honest.metrics["benchmark_accepts"]
    assert honest.problem.endswith("silu_mul/reference.py")
    cached = runs["dynamic/atrex/data/silu_mul_cached/generated_kernel.py"]
    assert findings(cached) == [("KD401", 5)]  # at `class Model`


def test_kernelbenchx_function_runs_with_the_arguments_of_its_test(runs):
    honest = runs["dynamic/kernelbenchx/submissions/softplus.py"]
    assert (honest.status, findings(honest)) == ("ok", []), honest.findings
    assert honest.metrics["tolerance"] == "kernelbenchx"
    short = runs["dynamic/kernelbenchx/submissions_bad/softplus.py"]
    (unwritten,) = short.findings  # `def kernel_function`: the harness's other name
    assert (unwritten.rule, unwritten.line) == ("KD101", 4)
    assert unwritten.metrics["numel"] == 32 * 48 and unwritten.metrics["unwritten"] == 48


def test_kernelbenchx_out_buffer_written_as_the_reference_writes_it_is_no_mutation(runs):
    """The test passes `out=`; the reference writes it. Its inputs are taken as the test made them
    (not after the reference filled `out`), and a kernel that leaves `out` as the reference does,
    a last bit apart, has modified nothing it should not have (KD402 was an error here)."""
    honest = runs["dynamic/kernelbenchx/submissions/sqrt_exp.py"]
    assert (honest.status, findings(honest)) == ("ok", []), honest.findings


def test_kernelbenchx_kernel_is_checked_at_the_sizes_it_is_timed_at(runs):
    """The checkout's timing template (metrics/golden_metrics/softplus_perf.py) times 2^12 to
    2^23 elements; within the CPU budget (16 MiB an input) the smallest, the middle and the
    largest run. A grid capped at 256 programs of 1024 is right at the test's 32x48 and wrong
    at 2^22 elements (KD302, a warning); the honest kernel is right at all three."""
    pytest.importorskip("triton", reason="Triton kernels run on the CPU under its interpreter")
    honest = runs["dynamic/kernelbenchx/submissions/softplus.py"]
    assert honest.metrics["timed_sweep"]["ran"] == [
        "[4096] float32 (timed input 1 of 12)", "[131072] float32 (timed input 6 of 12)",
        "[4194304] float32 (timed input 11 of 12)"]
    capped = runs["dynamic/kernelbenchx/submissions_timed/softplus.py"]
    (finding,) = capped.findings
    assert (finding.rule, finding.line, finding.level.value) == ("KD302", 18, "warning")
    assert finding.metrics["wrong_at"] == 1 and "[4194304] float32" in finding.message
    assert finding.message.startswith("wrong at the sizes the benchmark times it at")
    assert capped.metrics["benchmark_accepts"]  # its test's sizes pass KernelBenchX's check


def test_kernelbenchx_triton_submission_runs_under_the_interpreter(runs):
    pytest.importorskip("triton", reason="Triton kernels run on the CPU under its interpreter")
    relu = runs["kernelbenchx/submissions/relu.py"]
    assert (relu.status, findings(relu)) == ("ok", []), relu.findings
    assert relu.problem.endswith("Activation/relu.py")


def test_cuda_l1_records_run_from_their_ref_code(runs):
    honest = runs["dynamic/cuda-l1/optimized_cuda_code/cpu_toy.json#L6/custom_code"]
    assert (honest.status, findings(honest)) == ("ok", [])
    assert honest.metrics["tolerance"] == "kernelbench-v0"
    mutating = runs["dynamic/cuda-l1/optimized_cuda_code/cpu_toy.json#L12/custom_code"]
    assert [f.rule for f in mutating.findings] == ["KD402"]
    # BatchNorm folded with its running statistics: right in eval mode, where CUDA-L1's check
    # calls both models (in KernelBench's training mode it is KD202)
    folded = runs["dynamic/cuda-l1/optimized_cuda_code/cpu_toy.json#L18/custom_code"]
    assert (folded.status, findings(folded)) == ("ok", []), folded.findings


def test_fastkernels_candidate_runs_on_its_smallest_captured_case(runs):
    """The Triton candidate of the toy checkout runs under the interpreter on the smallest of
    its captured cases, its init rebuilt from the recipe (a dataclass of the package), with the
    baseline's weights, judged by FastKernels' check."""
    pytest.importorskip("triton", reason="Triton kernels run on the CPU under its interpreter")
    honest = runs["dynamic/fastkernels/fastkernels/tasks/candidate/L1/rms_norm.py"]
    assert (honest.status, findings(honest)) == ("ok", []), honest.findings
    assert honest.metrics["tolerance"] == "fastkernels" and honest.metrics["benchmark_accepts"]
    assert honest.metrics["size"] == "x=[4, 96] float32, residual=None"
    assert honest.problem.endswith("tasks/baseline/L1/rms_norm.py")


def test_fastkernels_slack_on_captured_inputs(runs):
    """One column in 256 zeroed: FastKernels' 99 % rule accepts it, kaudit does not (KD203)."""
    slack = runs["dynamic/fastkernels/fastkernels/tasks/candidate/L1/silu_mul.py"]
    (finding,) = slack.findings
    assert (finding.rule, finding.line, finding.level.value) == ("KD203", 5, "error")
    assert finding.metrics["outside"] == 8 and finding.metrics["numel"] == 8 * 256


def test_fastkernels_without_buildable_captured_inputs_is_a_note(runs):
    handle = runs["dynamic/fastkernels/fastkernels/tasks/candidate/L1/all_reduce.py"]
    (note,) = handle.findings
    assert (handle.status, note.rule) == ("no-problem", "KD502")
    assert "its init holds a runtime handle (ProcessGroup)" in note.message
    lone = runs["fastkernels/set/L1/gelu.py"]  # a results set without its checkout
    (note,) = lone.findings
    assert note.rule == "KD502" and "baseline of L1/gelu was not found" in note.message


def test_smallest_size_and_input_names():
    sizes = (Size("0", {}, {"tokens": 4096, "hidden": 4096}), Size("1", {}, {"tokens": 100}),
             Size("2", {}, {"tokens": 8, "hidden": 8}))
    assert smallest(sizes).id == "2" and smallest(()) is None
    source = "def _make_inputs(n):\n    x = 1\n    return {'gate': x, 'x': x}\n"
    assert input_names(source, "_make_inputs") == ["gate", "x"]
    assert input_names("def _make_inputs(n):\n    return make(n)\n", "_make_inputs") == []
    assert input_names("def (", "_make_inputs") == []


def test_timed_sweep_in_the_scan_summary(runs):
    from kaudit.dynamic.shapes import summary

    swept = [runs[k] for k in ("dynamic/kernelbenchx/submissions/softplus.py",
                               "dynamic/kernelbenchx/submissions_timed/softplus.py")]
    assert summary(swept) == {"timed_sweep": {"kernels": 2, "wrong": 1, "inputs_run": 6}}
    assert summary([runs["fastkernels/set/L1/gelu.py"]]) == {}


def test_cli_scan_dynamic_on_an_adapted_layout():
    proc = kaudit("scan", str(DYNAMIC / "atrex" / "data" / "silu_mul_cached"), "--dynamic",
                  "--device", "cpu", "--no-cache", "--format", "json", cwd=ROOT)
    data = json.loads(proc.stdout)
    dynamic = [f for f in data["findings"] if f["pass"] == "dynamic"]
    assert [(f["rule"], f["line"]) for f in dynamic] == [("KD401", 5)], proc.stderr
    (verdict,) = data["verdicts"]
    assert verdict["verdict"] == "rejected" and "KD401" in verdict["reasons"]
    # its first call is right: Atrex-Bench's check accepts what kaudit rejects
    assert data["summary"]["dynamic"]["benchmark_check"] == {
        "judged": 1, "accepted": 1, "accepted_but_rejected": 1}


def test_problems_of_other_benchmarks_run_with_their_check():
    """`kaudit problems` finds Atrex-Bench operator folders and KernelBenchX task files, runs
    them through their wrappers and probes them with their benchmark's check: Atrex-Bench's atol
    1e-2 outweighs rtol on a ReLU whose median output is 0 (KP201)."""
    proc = kaudit("problems", str(FIXTURES / "benchmarks" / "atrex" / "data"),
                  str(DYNAMIC / "kernelbenchx"), "--device", "cpu", "--seeds", "2",
                  "--format", "json", cwd=ROOT)
    data = json.loads(proc.stdout)
    by_path = {p["path"].split("benchmarks/", 1)[1]: p for p in data["problems"]}
    assert set(by_path) == {"atrex/data/scaled_relu/reference.py",
                            "dynamic/kernelbenchx/data/kernelbenchx/Activation/softplus.py",
                            "dynamic/kernelbenchx/data/kernelbenchx/Math/sqrt_exp.py"}
    out_buffer = by_path["dynamic/kernelbenchx/data/kernelbenchx/Math/sqrt_exp.py"]
    assert out_buffer["status"] == "ok", out_buffer["findings"]
    relu = by_path["atrex/data/scaled_relu/reference.py"]
    assert relu["tolerance"] == {"preset": "atrex", "atol": 0.01, "rtol": 0.05}
    assert relu["shape"] == [1024, 4096]  # the smaller of its two sizes
    assert [(f["rule"], f["line"]) for f in relu["findings"]] == [("KP201", 5)]  # class Model
    softplus = by_path["dynamic/kernelbenchx/data/kernelbenchx/Activation/softplus.py"]
    assert softplus["tolerance"]["preset"] == "kernelbenchx"
    assert softplus["shape"] == [32, 48]  # its test's largest call, not its first
    assert not softplus["findings"]
