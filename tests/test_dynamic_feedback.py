"""Long runs in CI logs and what the dynamic pass could not do: progress lines when stderr is not a
terminal (`kaudit problems`, `scan --dynamic`), the `unverified` verdict of kernels the dynamic
pass did not audit, and the memory cap of `kaudit problems` (`--memory-limit`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import kaudit.progress
from kaudit.findings import Finding, Level, Location
from kaudit.progress import DelayedProgress
from kaudit.results import Claim, Submission
from kaudit.rule import all_rules, rule_by_code
from kaudit import verdicts
from kaudit.verdicts import judge, summarize
from tests.conftest import DYNAMIC_FIXTURES, PROBLEM_FIXTURES, ROOT

LINE = re.compile(r"^\[(\d+)/(\d+)\] (.+) (\S+) (\d+\.\d)s$")


def finding(code: str) -> Finding:
    rule = rule_by_code(code)
    return rule().finding(Location("k.py", 5), "message")


# -- 7. progress lines ------------------------------------------------------------------------


def test_progress_lines_wait_a_few_seconds_then_flush_each(monkeypatch, capsys):
    clock = [100.0]
    monkeypatch.setattr(kaudit.progress.time, "monotonic", lambda: clock[0])
    progress = DelayedProgress("running")
    progress.finished(1, 3, "a.py", "trusted", 0.4)
    assert capsys.readouterr().err == "", "a short run prints nothing"
    clock[0] += kaudit.progress.LINES_AFTER_S
    progress.finished(2, 3, "b c.py", "KP101,KP201", 2.25)
    assert capsys.readouterr().err == "[1/3] a.py trusted 0.4s\n[2/3] b c.py KP101,KP201 2.2s\n"
    progress.finished(3, 3, "new\nline.py", "unverified", 12.0)
    assert capsys.readouterr().err == "[3/3] new\\nline.py unverified 12.0s\n"


def test_kaudit_problems_prints_a_line_per_problem_as_it_finishes():
    pytest.importorskip("torch", reason="kaudit problems needs torch")
    command = [sys.executable, "-m", "kaudit", "problems", str(PROBLEM_FIXTURES / "bad_hangs.py"),
               str(PROBLEM_FIXTURES / "bad_tiny_output.py"), "--device", "cpu", "--timeout", "5",
               "-f", "json"]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        first = proc.stderr.readline()
        running = proc.poll() is None  # the line came while the second problem still ran
        rest, _ = proc.stderr.read(), proc.wait(timeout=300)
        stdout = proc.stdout.read()
    assert running, "the line is flushed when the problem finishes, not at the end"
    done, total, path, result, seconds = LINE.match(first.rstrip("\n")).groups()
    assert (done, total, result) == ("1", "2", "KP501") and path.endswith("bad_hangs.py")
    assert float(seconds) >= 5
    second = LINE.match(rest.splitlines()[0]).groups()
    assert second[:2] == ("2", "2") and second[3] == "KP101,KP102,KP103,KP201"
    assert len(json.loads(stdout)["problems"]) == 2


def test_scan_dynamic_prints_a_line_per_kernel_with_its_verdict(monkeypatch, in_tmp):
    pytest.importorskip("torch", reason="scan --dynamic needs torch")
    import kaudit.cli

    monkeypatch.setattr(kaudit.progress, "LINES_AFTER_S", 0.0)
    folder = DYNAMIC_FIXTURES / "bad_needs_cuda"
    result = CliRunner().invoke(kaudit.cli.app, ["scan", str(folder), "--dynamic", "--device",
                                                 "cpu", "--no-cache", "-f", "json"])
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("[")]
    done, total, path, verdict, _ = LINE.match(line).groups()
    assert (done, total, verdict) == ("1", "1", "unverified")
    assert path.endswith("bad_needs_cuda/kernel.py")


# -- 14. not audited is not trusted ------------------------------------------------------------


def test_the_not_run_rules_are_the_dynamic_not_audited_ones():
    tagged = {r.code for r in all_rules() if verdicts.NOT_AUDITED_TAG in r.tags}
    assert tagged >= {"KD500", "KD502", "KD503"}
    assert "KD501" not in tagged  # a kernel that fails is rejected, not unverified


@pytest.mark.parametrize(("codes", "verdict", "reasons"), [
    (["KD500"], "unverified", ["KD500"]),
    (["KD502"], "unverified", ["KD502"]),
    (["KD503", "KA104"], "unverified", ["KD503", "KA104"]),
    (["KD503", "KA101"], "rejected", ["KA101"]),
    (["KD501"], "rejected", ["KD501"]),
    (["KA308"], "trusted", []),
])
def test_verdicts_of_kernels_not_audited(codes, verdict, reasons):
    found = judge("k.py", Submission("plain", claim=Claim(correctness=True)),
                  [finding(code) for code in codes], None, 10.0)
    assert (found.verdict, found.reasons) == (verdict, reasons)
    totals = summarize([found])["total"]
    assert totals["unverified"] == (verdict == "unverified")
    assert totals["surviving"] == (verdict == "trusted")


def test_a_plain_run_stopped_by_a_full_disk_leaves_the_audit_incomplete():
    """On the H200 a kernel whose plain run found the disk full kept status "ok" beside its
    KD504: the result cache stored it, and a resumed scan never audited it again."""
    import errno

    from kaudit.dynamic.judge import Adder, second_opinion
    from kaudit.dynamic.kernels import KernelRun
    from kaudit.dynamic.result_cache import NOT_STORED
    from kaudit.dynamic.runner import RunResult
    from kaudit.dynamic.tolerance import resolve

    run = KernelRun("k.py", status="ok")
    full = RunResult("error", error_type="OSError", error="No space left on device",
                     errno=errno.ENOSPC)
    second_opinion(Adder(run, Location("k.py", 5)), full, [], [], resolve(None, None, None))
    assert [f.rule for f in run.findings] == ["KD504"]
    assert run.status in NOT_STORED


def test_a_cpu_run_is_not_a_pass():
    pytest.importorskip("torch", reason="scan --dynamic needs torch")

    def scan(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "kaudit", "scan",
                               str(DYNAMIC_FIXTURES / "bad_needs_cuda"), "--dynamic", "--device",
                               "cpu", "--no-cache", *args], capture_output=True, text=True,
                              cwd=ROOT, timeout=600).stdout

    assert "1 kernel: 0 claimed-incorrect, 0 rejected, 1 unverified, 0 suspicious, 0 trusted" \
        in scan()
    data = json.loads(scan("-f", "json"))
    (verdict,) = data["verdicts"]
    assert (verdict["verdict"], verdict["reasons"]) == ("unverified", ["KD500"])
    assert data["summary"]["total"]["unverified"] == 1 and data["summary"]["total"]["trusted"] == 0
    assert "| unverified | 1 |" in scan("-f", "markdown")


# -- 15. the memory cap -----------------------------------------------------------------------


def test_memory_limit_values():
    from kaudit.dynamic.limits import (
        MIN_MEMORY_LIMIT,
        job_memory_limit,
        parse_memory_limit,
        physical_memory,
    )

    assert parse_memory_limit("24G") == 24 << 30
    assert parse_memory_limit("1.5gib") == 3 << 29
    assert parse_memory_limit("512M") == 512 << 20
    assert parse_memory_limit("none") == 0 and job_memory_limit(0) is None
    for bad in ("16", "lots", "-1G", "1e3G"):
        with pytest.raises(ValueError, match="--memory-limit"):
            parse_memory_limit(bad)
    assert parse_memory_limit(str(MIN_MEMORY_LIMIT)) == MIN_MEMORY_LIMIT
    # by default one job may use the whole machine, whatever --jobs says
    assert job_memory_limit(None) == physical_memory()


BIG = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.empty(1 << 31)]  # 8 GiB of float32


def get_init_inputs():
    return []
"""


def test_kp501_names_the_cap_and_the_option(tmp_path):
    pytest.importorskip("torch", reason="kaudit problems needs torch")
    (tmp_path / "big.py").write_text(BIG)
    proc = subprocess.run([sys.executable, "-m", "kaudit", "problems", "big.py", "--device", "cpu",
                           "--seeds", "1", "--memory-limit", "3G", "-f", "json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    (problem,) = json.loads(proc.stdout)["problems"]
    (kp501,) = problem["findings"]
    assert kp501["rule"] == "KP501" and "out of memory" in kp501["message"]
    assert kp501["message"].endswith("(memory cap: 3.0 GiB of address space per job; raise it "
                                     "with --memory-limit)")


@pytest.mark.parametrize(("value", "message"), [
    ("16", "kaudit: --memory-limit: '16' is under 256.0 MiB; give a unit (e.g. 24G) or none"),
    ("big", "kaudit: --memory-limit: not a size: 'big' (e.g. 24G, 512M, or none)")])
def test_a_bad_memory_limit_is_a_usage_error(value, message):
    pytest.importorskip("torch", reason="kaudit problems needs torch")
    proc = subprocess.run([sys.executable, "-m", "kaudit", "problems",
                           str(PROBLEM_FIXTURES / "good_matmul.py"), "--memory-limit", value],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip() == message


def test_scan_dynamic_takes_the_memory_limit(monkeypatch, in_tmp):
    pytest.importorskip("torch", reason="scan --dynamic needs torch")
    import kaudit.cli
    import kaudit.dynamic.pipeline

    seen = []

    def stand_in(items, options, config, baseline=None, on_kernel=None):
        seen.append(options.memory_limit)
        return kaudit.dynamic.pipeline.DynamicPass("cpu")

    monkeypatch.setattr(kaudit.dynamic.pipeline, "run_pass", stand_in)
    (in_tmp / "k.py").write_text("class ModelNew:\n    pass\n")
    result = CliRunner().invoke(kaudit.cli.app, ["scan", "k.py", "--dynamic", "--no-cache",
                                                 "--memory-limit", "2G"])
    assert seen == [2 << 30], result.output


def test_an_audit_stops_when_a_full_disk_stopped_its_plain_run(monkeypatch):
    """Nothing more runs for an audit that is incomplete anyway (its shape sweep, timing and
    profile would have taken the GPU and disk again)."""
    import errno

    pytest.importorskip("torch", reason="scan --dynamic needs torch")
    from kaudit.dynamic import kernels
    from kaudit.dynamic.options import DynamicOptions
    from kaudit.dynamic.runner import RunResult

    ran, real = [], kernels.run_job

    def run_job(job):
        ran.append(job.target)
        if job.target == kernels.PLAIN_TARGET:
            return RunResult("error", error_type="OSError", error="No space left on device",
                             errno=errno.ENOSPC)
        return real(job)

    monkeypatch.setattr(kernels, "run_job", run_job)
    monkeypatch.setattr(kernels, "shape_sweep", lambda *a: ran.append("shape sweep"))
    kernel = DYNAMIC_FIXTURES / "good_pytorch_linear" / "kernel.py"
    run = kernels.audit_kernel(str(kernel), "kernel.py", kernel.read_text(),
                               DynamicOptions(device="cpu", timeout=240), "cpu")
    assert run.status == "incomplete" and "KD504" in [f.rule for f in run.findings]
    assert ran[-1] == kernels.PLAIN_TARGET, ran
