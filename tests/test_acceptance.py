"""The benchmarks' own checks where the dynamic pass asks "would the benchmark accept this"
(`kaudit.dynamic.acceptance`): constants for the trivial-output probes under each check, and
KD203 for a pass that relies on FastKernels' 1 % slack. On CPU tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kaudit.dynamic.acceptance import (  # noqa: E402
    accepts_all,
    best_constant,
    report_slack,
    report_unwritten_slack,
)
from kaudit.dynamic.tolerance import PRESETS  # noqa: E402
from kaudit.findings import Level  # noqa: E402


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, code, message, level=None, **metrics):
        self.calls.append((code, level, message, metrics))


def test_best_constant_per_check():
    narrow = torch.linspace(1.0, 1.0 + 2e-3, 1000)
    # allclose scales rtol by the candidate: 1e-2 on ~1 covers the whole span
    ok, value = best_constant([narrow], PRESETS["kernelbench-v0"])
    assert ok and 1.0 <= value <= 1.002
    # assert_close scales it by the reference: 1e-5 cannot cover a span of 2e-3
    assert best_constant([narrow], PRESETS["kernelbenchx"]) == (False, None)
    # FastKernels: 99 % of the elements near one value and 1 % far away: a constant passes
    mostly = torch.ones(1000)
    mostly[:10] = 50.0
    ok, value = best_constant([mostly], PRESETS["fastkernels"])
    assert ok and value == pytest.approx(1.0, abs=1e-3)
    mostly[:11] = 50.0  # 1.1 %: no constant is within the bound for 99 %
    assert best_constant([mostly], PRESETS["fastkernels"]) == (False, None)
    # against every reference at once, and never for non-finite ones
    assert not best_constant([torch.ones(8), torch.full((8,), 2.0)], PRESETS["atrex"])[0]
    assert best_constant([torch.tensor([1.0, float("nan")])], PRESETS["atrex"]) == (False, None)


def test_zeros_under_fastkernels_fail_whatever_the_scale():
    tiny = torch.full((100,), 1e-9)
    assert PRESETS["kernelbench"].accepts(tiny, torch.zeros_like(tiny))  # atol 1e-4
    assert not PRESETS["fastkernels"].accepts(tiny, torch.zeros_like(tiny))  # all-zero output
    assert accepts_all([tiny], [tiny.clone()], PRESETS["fastkernels"])
    assert not accepts_all([tiny], [], PRESETS["fastkernels"])


def test_kernelbenchx_requires_the_reference_dtype_and_exact_other_dtypes():
    check = PRESETS["kernelbenchx"]
    reference = torch.ones(4)
    assert not check.accepts(reference, reference.double())
    assert check.for_dtype("complex64") == (0.0, 0.0)
    assert check.for_dtype("float32") == (1e-5, 1e-5)
    assert check.check_text("float32") == "kernelbenchx check (atol 1e-05, rtol 1e-05)"
    assert PRESETS["kernelbench"].check_text("float32") == \
        "kernelbench allclose (atol 0.0001, rtol 0.0001)"
    assert "99 % of elements" in PRESETS["fastkernels"].check_text("float32")


def test_slack_reported_with_the_level_of_kaudits_own_check():
    reference = torch.linspace(1.0, 2.0, 1000)
    noisy = reference.clone()
    noisy[:5] *= 1.003
    add = Recorder()
    assert report_slack(add, "the output", "", reference, noisy, PRESETS["fastkernels"], True,
                        "numbers", {"output": 0})
    (code, level, message, metrics), = add.calls
    assert code == "KD203" and level is None and metrics["outside"] == 5
    assert "5 of 1000 elements" in message
    assert report_slack(add, "the output", "", reference, noisy, PRESETS["fastkernels"], False,
                        "numbers", {})
    assert add.calls[-1][1] is Level.ERROR
    # every element within: no slack used; an every-element check has none
    assert not report_slack(add, "x", "", reference, reference, PRESETS["fastkernels"], True,
                            "", {})
    assert not report_slack(add, "x", "", reference, noisy, PRESETS["kernelbench"], True, "", {})
    noisy[:20] = 0.0  # 2 %: the check fails, KD202's business
    assert not report_slack(add, "x", "", reference, noisy, PRESETS["fastkernels"], False, "", {})
    assert len(add.calls) == 2


def test_unwritten_elements_within_the_slack():
    reference = torch.linspace(1.0, 2.0, 1000)
    plain = reference.clone()
    mask = torch.zeros(1000, dtype=torch.bool)
    mask[-5:] = True
    plain[-5:] = float("nan")  # whatever the memory held
    add = Recorder()
    report_unwritten_slack(add, [reference], [plain], {0: mask}, PRESETS["fastkernels"])
    (code, level, message, metrics), = add.calls
    assert code == "KD203" and metrics["unwritten"] == 5 and metrics["matched_written"] == 0.995
    mask[-20:] = True  # 2 % unwritten: beyond the slack, KD101 alone
    report_unwritten_slack(add, [reference], [plain], {0: mask}, PRESETS["fastkernels"])
    report_unwritten_slack(add, [reference], [plain], {0: mask[:0]}, PRESETS["kernelbench"])
    assert len(add.calls) == 1
