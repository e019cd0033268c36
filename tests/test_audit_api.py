"""For training loops: `kaudit.audit_kernel` on texts held in memory, and the KernelBench drop-in
`kaudit.integrations.kernelbench.eval_kernel_against_ref` (CPU: plain PyTorch and Triton kernels
under Triton's interpreter; KernelBench itself replaced by a stand-in)."""

from __future__ import annotations

import inspect

import pytest

from tests.conftest import DYNAMIC_FIXTURES

pytest.importorskip("torch", reason="the dynamic pass needs torch (kaudit[dynamic])")

import kaudit  # noqa: E402
import kaudit.integrations.kernelbench as kb  # noqa: E402
from kaudit.findings import Finding, Level, Location  # noqa: E402

CPU = kaudit.DynamicOptions(device="cpu", timeout=240)


def texts(name: str) -> tuple[str, str]:
    folder = DYNAMIC_FIXTURES / name
    return (folder / "kernel.py").read_text(), (folder / "problem.py").read_text()


def test_an_honest_triton_kernel_is_trusted():
    kernel, problem = texts("good_gelu_triton")
    audit = kaudit.audit_kernel(kernel, problem, CPU)
    assert (audit.verdict, audit.reasons, audit.passed) == ("trusted", [], True)
    assert audit.metrics["status"] == "ok" and audit.metrics["seconds"] > 0


def test_a_kernel_that_zeroes_its_input_is_rejected():
    kernel, problem = texts("bad_zeroes_input")
    audit = kaudit.audit_kernel(kernel, problem, CPU)
    assert audit.verdict == "rejected" and not audit.passed
    assert "KD402" in audit.reasons
    assert {f.path for f in audit.findings} == {"kernel.py"}, "named by kernel.py, not a temp path"


def test_no_problem_is_unverified():
    kernel, _ = texts("good_gelu_triton")
    audit = kaudit.audit_kernel(kernel, None, CPU)
    assert audit.verdict == "unverified"
    assert [f.rule for f in audit.findings if f.pass_ == "dynamic"] == ["KD502"]


def test_drop_in_keeps_kernelbenchs_parameters():
    assert list(inspect.signature(kb.eval_kernel_against_ref).parameters) == [
        "original_model_src", "custom_model_src", "seed_num", "num_correct_trials",
        "num_perf_trials", "measure_performance", "timing_method", "verbose", "build_dir",
        "device", "backend", "precision", "check_for_excessive_speedup",
        "excessive_speedup_threshold"]
    fields = set(kb.KernelExecResult().model_dump())
    assert fields == {"compiled", "correctness", "metadata", "runtime", "runtime_stats",
                      "ref_runtime", "ref_runtime_stats", "audit"}


def test_drop_in_without_kernelbench_is_kaudits_verdict(monkeypatch):
    monkeypatch.setattr(kb, "_kernelbench_eval", lambda: None)
    kernel, problem = texts("good_gelu_triton")
    result = kb.eval_kernel_against_ref(problem, kernel, device="cpu")
    assert (result.compiled, result.correctness, result.runtime) == (True, True, -1.0)
    assert result.metadata["kaudit_verdict"] == "trusted"
    assert result.audit.verdict == "trusted"

    broken = "raise ImportError('no such extension')\n\n" + kernel
    result = kb.eval_kernel_against_ref(problem, broken, device="cpu")
    assert (result.compiled, result.correctness) == (False, False)
    assert "KD501" in result.audit.reasons


def audit_of(verdict: str) -> kaudit.KernelAudit:
    finding = Finding("KD402", "input-mutation", Level.ERROR, Location("kernel.py", 5),
                      "input 0 changed")
    return kaudit.KernelAudit(verdict, ["KD402"] if verdict == "rejected" else [],
                              [finding] if verdict == "rejected" else [], {"status": "ok"})


class StandIn:
    """KernelBench's function: records its arguments, answers with its result's fields."""

    def __init__(self) -> None:
        self.calls: list = []

    def __call__(self, original, custom, **options):
        self.calls.append((original, custom, options))
        return kb.KernelExecResult(compiled=True, correctness=True, metadata={"hardware": "H200"},
                                   runtime=12.5, runtime_stats={"mean": 12.5}, ref_runtime=20.0)


def test_drop_in_runs_kernelbench_only_for_kernels_kaudit_passes(monkeypatch):
    theirs = StandIn()
    monkeypatch.setattr(kb, "_kernelbench_eval", lambda: theirs)
    monkeypatch.setattr(kb, "audit_kernel", lambda *args, **kwargs: audit_of("trusted"))
    result = kb.eval_kernel_against_ref("problem", "kernel", seed_num=7, measure_performance=True,
                                        num_perf_trials=5, device=0, precision="fp16")
    (original, custom, options), = theirs.calls
    assert (original, custom) == ("problem", "kernel")
    assert options["seed_num"] == 7 and options["measure_performance"] is True
    assert options["num_perf_trials"] == 5 and options["device"] == 0
    assert options["precision"] == "fp16"
    assert (result.compiled, result.correctness, result.runtime, result.ref_runtime) == \
        (True, True, 12.5, 20.0)
    assert result.metadata == {"hardware": "H200", "kaudit_verdict": "trusted",
                               "kaudit_reasons": []}

    monkeypatch.setattr(kb, "audit_kernel", lambda *args, **kwargs: audit_of("rejected"))
    result = kb.eval_kernel_against_ref("problem", "kernel", measure_performance=True)
    assert len(theirs.calls) == 1, "a rejected kernel never runs in the harness's process"
    assert (result.correctness, result.runtime) == (False, -1.0)
    assert result.metadata == {"kaudit_verdict": "rejected", "kaudit_reasons": ["KD402"]}
