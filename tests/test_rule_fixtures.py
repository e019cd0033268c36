"""The rule suite generated from fixtures: every `bad_*` fixture fires exactly where its markers
say, every `good_*` look-alike stays silent, and every rule has both kinds.

Errors and warnings from every rule must match the markers, so a rule that misfires on another
rule's fixture fails here. Notes are compared only for the fixture's own rule and the codes its
markers name, so adding a note-level rule does not require re-marking every fixture."""

from __future__ import annotations

import pytest

from kaudit import Config, Level, scan_paths
from kaudit.rule import all_rules
from tests.conftest import (
    FIXTURES,
    RULE_FIXTURES,
    dynamic_fixtures,
    expected_findings,
    fixture_policy,
    problem_fixtures,
    rule_fixtures,
)


@pytest.mark.parametrize("fixture", rule_fixtures(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_findings_match_markers(fixture):
    report = scan_paths([str(fixture)], Config(policy=fixture_policy(fixture)))
    assert not report.errors, report.errors
    expected = expected_findings(fixture)
    compared_notes = {fixture.parent.name} | {code for code, _ in expected}
    actual = {(f.rule, f.line) for f in report.findings
              if f.level is not Level.NOTE or f.rule in compared_notes}
    messages = "\n".join(f"{f.rule}:{f.line}: {f.message}" for f in report.findings)
    assert actual == expected, f"findings differ from markers:\n{messages}"
    if fixture.name.startswith("bad_"):
        assert any(code == fixture.parent.name for code, _ in expected), "a bad fixture must fire"
    else:
        assert fixture.name.startswith("good_"), "fixtures are named bad_* or good_*"
        assert all(code != fixture.parent.name for code, _ in expected)


#: rules no kernel fixture can fire: what they report comes from the machine, not the kernel
ENVIRONMENT_ONLY = {"KD504": "a full disk or an error in kaudit: tests/test_sandbox.py makes both"}


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_every_rule_has_bad_and_good_fixtures(rule):
    if rule.code in ENVIRONMENT_ONLY:
        pytest.skip(ENVIRONMENT_ONLY[rule.code])
    if rule.audit == "problems":
        # KP rules judge benchmark problems: their fixtures are problem files in
        # fixtures/problems/, marked on the `class Model` line and run by tests/test_problems.py
        marked = {code for path in problem_fixtures() for code, _ in expected_findings(path)
                  if path.name.startswith("bad_")}
        assert rule.code in marked, f"{rule.code} needs a problem fixture that fires"
        assert any(p.name.startswith("good_") for p in problem_fixtures())
        return
    if rule.audit == "dynamic":
        # KD rules run kernels against their problems: their fixtures are paired folders in
        # fixtures/dynamic/, marked on ModelNew's `def forward` line and run by tests/test_dynamic.py
        marked = {code for folder in dynamic_fixtures() if folder.name.startswith("bad_")
                  for code, _ in expected_findings(folder / "kernel.py")}
        # KD701 judges a claimed speedup: its fixture is a results tree with an honest and an
        # inflated claim, fixtures/timing/, run by tests/test_timing.py
        marked |= {code for path in (FIXTURES / "timing").rglob("*_kernel.py")
                   for code, _ in expected_findings(path)}
        assert rule.code in marked, f"{rule.code} needs a dynamic fixture that fires"
        assert any(p.name.startswith("good_") for p in dynamic_fixtures())
        return
    folder = RULE_FIXTURES / rule.code
    names = [p.name for p in folder.glob("*.py")] if folder.is_dir() else []
    assert any(n.startswith("bad_") for n in names), f"{rule.code} needs a fixture that fires"
    assert any(n.startswith("good_") for n in names), f"{rule.code} needs an honest look-alike"


def test_fixture_folders_name_real_rules():
    codes = {rule.code for rule in all_rules()}
    assert {p.name for p in RULE_FIXTURES.iterdir() if p.is_dir()} <= codes


def test_a_fallback_behind_a_guard_no_benchmark_input_takes_is_a_warning():
    """KA102 rejects a branch the benchmark's inputs may take (a size threshold, a failing
    build); one for another device, another dtype or an empty input, or one that pins the rank or
    the reduction axis the problem fixes, is a warning (the dynamic pass tells whether the kernel
    ran)."""
    folder = RULE_FIXTURES / "KA102"
    levels = {}
    for name in ("bad_small_size_dispatch", "bad_try_except_gelu", "bad_device_early_return",
                 "bad_elif_dtype_layernorm", "bad_empty_input_guard", "bad_rank_and_axis_guard"):
        report = scan_paths([str(folder / f"{name}.py")], Config())
        (finding,) = [f for f in report.findings if f.rule == "KA102"]
        levels[name] = finding.level
    assert levels == {"bad_small_size_dispatch": Level.ERROR, "bad_try_except_gelu": Level.ERROR,
                      "bad_device_early_return": Level.WARNING,
                      "bad_elif_dtype_layernorm": Level.WARNING,
                      "bad_empty_input_guard": Level.WARNING,
                      "bad_rank_and_axis_guard": Level.WARNING}
    # the same in an extension's C++ (KA106): `if (!x.is_cuda())` against `if (cols > 1024)`
    cpp = {name: {f.level for f in scan_paths([str(RULE_FIXTURES / "KA106" / f"{name}.py")],
                                              Config()).findings if f.rule == "KA106"}
           for name in ("bad_device_guarded_cpu_path", "bad_size_gated_aten_fallback")}
    assert cpp == {"bad_device_guarded_cpu_path": {Level.WARNING},
                   "bad_size_gated_aten_fallback": {Level.ERROR}}
