"""The composite action's scan step, run locally the way the runner would run it, and the
pre-commit hook definition."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import FIXTURES, ROOT
from tests.test_sarif import validate

SCRIPT = ROOT / "scripts" / "github-action.sh"


def run_action(tmp_path, paths: str, fail_on: str = "error", **extra: str) -> dict[str, str]:
    output, summary = tmp_path / "github_output", tmp_path / "step_summary"
    env = {**os.environ, "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary),
           "KAUDIT_PATHS": paths, "KAUDIT_FAIL_ON": fail_on,
           "KAUDIT_REPORT_DIR": str(tmp_path / "report"), **extra}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr  # the step itself never fails; the Gate step does
    return dict(line.split("=", 1) for line in output.read_text().splitlines())


@pytest.mark.skipif(shutil.which("kaudit") is None, reason="needs the installed kaudit command")
def test_scan_step_outputs_reports_and_summary(tmp_path):
    outputs = run_action(tmp_path, "fixtures/results/paired fixtures/results/jsonl")
    assert outputs["exit-code"] == "1"
    report = tmp_path / "report"
    assert outputs["report-dir"] == str(report)
    validate(json.loads((report / "kaudit-static.sarif").read_text()))
    assert outputs["sarif-static"] == str(report / "kaudit-static.sarif")
    assert (tmp_path / "step_summary").read_text() == (report / "kaudit.md").read_text()
    assert json.loads((report / "kaudit.json").read_text())["summary"]["total"]["rejected"] == 2


@pytest.mark.skipif(shutil.which("kaudit") is None, reason="needs the installed kaudit command")
def test_scan_step_gates_by_fail_on_and_reports_usage_errors(tmp_path):
    clean = run_action(tmp_path, "fixtures/results/paired", fail_on="never")
    assert clean["exit-code"] == "0"
    missing = run_action(tmp_path, "no/such/path")
    assert missing["exit-code"] == "2" and missing["sarif-static"] == ""


def test_action_definition_runs_the_script_and_uploads_per_category():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    assert any("scripts/github-action.sh" in step.get("run", "") for step in steps)
    upload = [s for s in steps if s.get("uses", "").startswith("github/codeql-action/upload-sarif")]
    assert upload and upload[0]["with"]["category"] == "kaudit-static"
    assert steps[-1]["run"].startswith("exit"), "the gate runs after the upload"
    assert {"paths", "fail-on", "baseline"} <= action["inputs"].keys()


def test_pre_commit_hook():
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "kaudit" and hook["entry"].startswith("kaudit scan")
    assert hook["language"] == "python" and hook["types"] == ["python"]
    fixture = FIXTURES / "rules" / "KA101" / "bad_torch_alias_matmul.py"
    proc = subprocess.run([*hook["entry"].split(), str(fixture)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and "KA101" in proc.stdout
