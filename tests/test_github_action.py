"""The composite action's scan step, run locally the way the runner would run it, and the
pre-commit hook definition."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import FIXTURES, ROOT
from tests.test_sarif import validate

SCRIPT = ROOT / "scripts" / "github-action.sh"


def run_action(tmp_path, paths: str, fail_on: str = "error", **extra: str) -> dict[str, str]:
    """The step's outputs, plus `command`: the kaudit command line it logged."""
    output, summary = tmp_path / "github_output", tmp_path / "step_summary"
    env = {**os.environ, "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary),
           "KAUDIT_PATHS": paths, "KAUDIT_FAIL_ON": fail_on,
           "KAUDIT_REPORT_DIR": str(tmp_path / "report"), **extra}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, check=False,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr  # the step itself never fails; the Gate step does
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    return {**outputs, "command": next(line for line in proc.stderr.splitlines()
                                       if line.startswith("kaudit scan "))}


def test_scan_step_outputs_reports_and_summary(tmp_path):
    outputs = run_action(tmp_path, "fixtures/results/paired fixtures/results/jsonl")
    assert outputs["exit-code"] == "1"
    report = tmp_path / "report"
    assert outputs["report-dir"] == str(report)
    validate(json.loads((report / "kaudit-static.sarif").read_text()))
    assert outputs["sarif-static"] == str(report / "kaudit-static.sarif")
    assert outputs["sarif-dynamic"] == "" and "--dynamic" not in outputs["command"]
    assert (tmp_path / "step_summary").read_text() == (report / "kaudit.md").read_text()
    assert json.loads((report / "kaudit.json").read_text())["summary"]["total"]["rejected"] == 2


def test_scan_step_gates_by_fail_on_and_reports_usage_errors(tmp_path):
    clean = run_action(tmp_path, "fixtures/results/paired", fail_on="never")
    assert clean["exit-code"] == "0"
    missing = run_action(tmp_path, "no/such/path")
    assert missing["exit-code"] == "2" and missing["sarif-static"] == ""


def test_scan_step_with_dynamic_passes_its_inputs_and_writes_both_sarif_files(tmp_path):
    pytest.importorskip("torch", reason="the dynamic pass needs torch (kaudit[dynamic])")
    problems = tmp_path / "KernelBench"
    problems.mkdir()
    outputs = run_action(tmp_path, "fixtures/dynamic/good_pytorch_linear "
                         "fixtures/dynamic/bad_wrong_function", KAUDIT_DYNAMIC="true",
                         KAUDIT_DEVICE="cpu", KAUDIT_TOLERANCE="kernelbench-v0",
                         KAUDIT_PROBLEMS=str(problems), KAUDIT_SANDBOX="auto")
    assert outputs["command"].endswith(f"--dynamic --device cpu --tolerance kernelbench-v0 "
                                       f"--problems {problems} --sandbox auto")
    assert outputs["exit-code"] == "1"
    report = tmp_path / "report"
    static, dynamic = (json.loads((report / f"kaudit-{c}.sarif").read_text())
                       for c in ("static", "dynamic"))
    validate(static)
    validate(dynamic)
    assert outputs["sarif-static"] == str(report / "kaudit-static.sarif")
    assert outputs["sarif-dynamic"] == str(report / "kaudit-dynamic.sarif")
    (run,) = dynamic["runs"]
    assert [r["ruleId"] for r in run["results"]] == ["KD202"]
    assert json.loads((report / "kaudit.json").read_text())["summary"]["dynamic"]["device"] == "cpu"


def run_install_step(tmp_path, **env: str) -> list[str]:
    """The action's install step with a stand-in python3 on PATH: the pip command lines it runs."""
    (install,) = [s for s in yaml.safe_load((ROOT / "action.yml").read_text())["runs"]["steps"]
                  if s["name"] == "Install kaudit"]
    bin_dir, log = tmp_path / "bin", tmp_path / "pip.log"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n')
    (bin_dir / "python3").chmod(0o755)
    subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", install["run"]],
                   env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                        "GITHUB_ACTION_PATH": "/action", **env}, check=True, timeout=60)
    return log.read_text().splitlines()


def test_install_step_adds_the_dynamic_extra_only_with_dynamic(tmp_path):
    assert run_install_step(tmp_path / "static", KAUDIT_REQUIREMENT="", KAUDIT_DYNAMIC="false") \
        == ["-m pip install --quiet /action"]
    assert run_install_step(tmp_path / "dynamic", KAUDIT_REQUIREMENT="kaudit==0.2.0",
                            KAUDIT_DYNAMIC="true") \
        == ["-m pip install --quiet kaudit==0.2.0", "-m pip install --quiet kaudit[dynamic]"]


def test_action_definition_runs_the_script_and_uploads_per_category():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    scan = next(step for step in steps if "scripts/github-action.sh" in step.get("run", ""))
    upload = [s for s in steps if s.get("uses", "").startswith("github/codeql-action/upload-sarif")]
    assert [(s["with"]["category"], s["with"]["sarif_file"]) for s in upload] == [
        ("kaudit-static", "${{ steps.scan.outputs.sarif-static }}"),
        ("kaudit-dynamic", "${{ steps.scan.outputs.sarif-dynamic }}")]
    assert steps[-1]["run"].startswith("exit"), "the gate runs after the uploads"
    inputs = action["inputs"]
    assert {"paths", "fail-on", "baseline"} <= inputs.keys()
    names = ("dynamic", "device", "tolerance", "problems", "sandbox")
    assert {name: inputs[name]["default"] for name in names} \
        == {"dynamic": "false", "device": "auto", "tolerance": "", "problems": "", "sandbox": "on"}
    assert {f"KAUDIT_{name.upper()}": f"${{{{ inputs.{name} }}}}"
            for name in names}.items() <= scan["env"].items()


def test_pre_commit_hook():
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "kaudit" and hook["entry"].startswith("kaudit scan")
    assert hook["language"] == "python" and hook["types"] == ["python"]
    # a KA101 error under the default policy (bad_torch_alias_matmul.py is one under strict only)
    fixture = FIXTURES / "rules" / "KA101" / "bad_pure_pytorch_tricks.py"
    # pre-commit runs the hook from its own environment: here, the interpreter's (.venv/bin)
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable),
                                                  os.environ.get("PATH", "")])}
    proc = subprocess.run([*hook["entry"].split(), str(fixture)], capture_output=True, text=True, check=False,
                          cwd=ROOT, timeout=120, env=env)
    assert proc.returncode == 1 and "KA101" in proc.stdout
