"""One pipeline: `kaudit.scan_paths(..., dynamic=DynamicOptions(...))` discovers once and judges
once from both passes; a failure in one kernel's audit is a KD504 finding for it; SARIF holds one
run per pass; `--stream` writes a line per kernel; dynamic results are cached by content, so a
killed scan resumes with only the kernels it had not finished."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DYNAMIC_FIXTURES, ROOT

pytest.importorskip("torch", reason="the dynamic pass needs torch (kaudit[dynamic])")

import kaudit  # noqa: E402
import kaudit.dynamic.kernels  # noqa: E402
from kaudit.dynamic.kernels import KernelRun  # noqa: E402

LINEAR = DYNAMIC_FIXTURES / "good_pytorch_linear"


def linear_copies(folder: Path, count: int) -> list[Path]:
    """`count` honest kernels with their problem, each text its own (distinct cache keys)."""
    kernels = []
    for index in range(count):
        target = folder / f"k{index}"
        shutil.copytree(LINEAR, target)
        kernel = target / "kernel.py"
        kernel.write_text(kernel.read_text() + f"\n# copy {index}\n")
        kernels.append(kernel)
    return kernels


def test_scan_paths_runs_both_passes_and_judges_once(in_tmp):
    shutil.copytree(DYNAMIC_FIXTURES / "bad_zeroes_input", in_tmp / "zeroes")
    linear_copies(in_tmp, 1)
    (in_tmp / "alone").mkdir()
    shutil.copy(LINEAR / "kernel.py", in_tmp / "alone" / "kernel.py")  # no problem: KD502
    outcomes = []
    report = kaudit.scan_paths(["."], kaudit.Config(),
                               dynamic=kaudit.DynamicOptions(device="cpu", timeout=240),
                               on_kernel=outcomes.append)
    verdicts = {v.path: v for v in report.verdicts}
    assert verdicts["zeroes/kernel.py"].verdict == "rejected"
    assert "KD402" in verdicts["zeroes/kernel.py"].reasons
    # plain PyTorch: rejected by the static pass alone (KA101); nothing dynamic against it
    assert [r for r in verdicts["k0/kernel.py"].reasons if r.startswith("KD")] == []
    assert [f.rule for f in report.findings if f.path == "alone/kernel.py" and f.pass_ == "dynamic"
            ] == ["KD502"]
    assert report.summary["dynamic"]["kernels"] == 3
    assert report.summary["total"]["kernels"] == len(report.verdicts) == 3
    dynamic = [f for f in report.findings if f.pass_ == "dynamic"]
    assert {f.rule for f in dynamic} == {"KD402", "KD502"}
    assert all(f.fingerprint for f in dynamic)
    # the stream saw each kernel once, with the verdict the report holds
    assert sorted((o.verdict.path, o.verdict.verdict) for o in outcomes) == \
        sorted((v.path, v.verdict) for v in report.verdicts)
    assert all(o.status is not None and o.seconds is not None for o in outcomes)

    from kaudit.report import sarif

    log = json.loads(sarif.render_scan(report, kaudit.Config().is_enabled))
    static, dynamic_run = log["runs"]
    assert dynamic_run["automationDetails"]["id"] == "kaudit/dynamic/"
    assert {r["ruleId"] for r in dynamic_run["results"]} == {"KD402", "KD502"}
    assert not any(r["ruleId"].startswith("KD") for r in static["results"])


def test_a_failing_audit_is_a_finding_for_that_kernel_only(in_tmp, monkeypatch):
    first, second = linear_copies(in_tmp, 2)

    def audit(file, display, *args, **kwargs) -> KernelRun:
        if display.startswith("k0/"):
            raise RuntimeError("a bug in judging")
        return KernelRun(display, "problem.py", "ok")

    monkeypatch.setattr(kaudit.dynamic.kernels, "audit_kernel", audit)
    report = kaudit.scan_paths(["."], kaudit.Config(), dynamic=kaudit.DynamicOptions(device="cpu"))
    verdicts = {v.path: v for v in report.verdicts}
    assert verdicts["k0/kernel.py"].verdict == "rejected"  # KA101 and KD504
    (finding,) = [f for f in report.findings if f.path == "k0/kernel.py" and f.rule == "KD504"]
    assert "RuntimeError: a bug in judging" in finding.message
    assert not [r for r in verdicts["k1/kernel.py"].reasons if r.startswith("KD")]
    assert report.summary["dynamic"]["statuses"] == {"incomplete": 1, "ok": 1}


def test_dynamic_options_take_a_preset_name():
    assert kaudit.DynamicOptions(tolerance="atrex").tolerance.name == "atrex"
    assert kaudit.DynamicOptions().tolerance.name == "kernelbench"
    with pytest.raises(ValueError, match="unknown tolerance preset"):
        kaudit.DynamicOptions(tolerance="nope")


def test_an_unknown_device_is_a_config_error(in_tmp):
    linear_copies(in_tmp, 1)
    with pytest.raises(kaudit.config.ConfigError, match="unknown device"):
        kaudit.scan_paths(["."], dynamic=kaudit.DynamicOptions(device="tpu"))


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_a_killed_scan_resumes_with_what_is_missing(in_tmp):
    linear_copies(in_tmp, 3)
    command = [sys.executable, "-m", "kaudit", "scan", ".", "--dynamic", "--device", "cpu",
               "--cache-dir", "cache", "-f", "json", "-o", "report.json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.Popen([*command, "--stream", "first.jsonl"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not _lines(in_tmp / "first.jsonl") and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)  # killed as a job scheduler would
        killed.wait()
    finished = _lines(in_tmp / "first.jsonl")
    assert 1 <= len(finished) < 3, "killed after its first kernel, before the last"
    assert not (in_tmp / "report.json").exists()

    subprocess.run([*command, "--stream", "second.jsonl"], env=env, timeout=600,
                   capture_output=True, check=False)
    resumed = {line["path"]: line for line in _lines(in_tmp / "second.jsonl")}
    assert set(resumed) == {"k0/kernel.py", "k1/kernel.py", "k2/kernel.py"}
    assert {path for path, line in resumed.items() if line["cached"]} == \
        {line["path"] for line in finished}, "only the missing kernels ran again"
    assert all(line["status"] == "ok" for line in resumed.values())
    # where each audit's time went, by kind of job
    for line in resumed.values():
        seconds = line["job_seconds"]
        assert all(seconds[kind] > 0 for kind in ("reference", "candidate", "plain_run")), seconds
        assert all(s >= 0 for s in seconds.values()) and "candidate:forward" in seconds, seconds
        assert line["gpu_memory"] is None, "no GPU: nothing asked of one"
    report = json.loads((in_tmp / "report.json").read_text())
    assert report["summary"]["dynamic"]["cached"] == len(finished)
    # each line is its verdict's whole record, claims and measurements too
    verdicts = {verdict["path"]: verdict for verdict in report["verdicts"]}
    assert all(line[key] == verdicts[path][key] for path, line in resumed.items()
               for key in ("claimed", "layout", "verdict", "reasons"))


def test_a_cache_entry_changed_by_anything_else_is_run_again(in_tmp, monkeypatch):
    """Entries are signed with the installation key: a row a kernel wrote is not believed."""
    import sqlite3

    linear_copies(in_tmp, 1)
    ran = []

    def audit(file, display, *args, **kwargs) -> KernelRun:
        ran.append(display)
        return KernelRun(display, "problem.py", "ok")

    monkeypatch.setattr(kaudit.dynamic.kernels, "audit_kernel", audit)
    config = kaudit.Config(cache_dir=str(in_tmp / "cache"))
    options = kaudit.DynamicOptions(device="cpu")
    kaudit.scan_paths(["."], config, dynamic=options)
    resumed = kaudit.scan_paths(["."], config, dynamic=options)
    assert ran == ["k0/kernel.py"]
    assert not any("signed" in w for w in resumed.warnings)
    with sqlite3.connect(in_tmp / "cache" / "dynamic.sqlite") as db:
        db.execute("UPDATE signed_dynamic_results SET value = replace(value, '\"ok\"', "
                   "'\"ok\" ')")
    report = kaudit.scan_paths(["."], config, dynamic=options)
    assert ran == ["k0/kernel.py", "k0/kernel.py"]
    # said, since a key that did not survive (a container's home folder) looks just like this
    assert [w for w in report.warnings if "not signed with this installation's key" in w]


def test_timeouts_and_incomplete_audits_are_run_again(in_tmp, monkeypatch):
    from kaudit.findings import Finding, Level, Location

    linear_copies(in_tmp, 3)
    ran = []

    def audit(file, display, *args, **kwargs) -> KernelRun:
        ran.append(display)
        if display.startswith("k0/"):
            return KernelRun(display, "problem.py", "incomplete")
        if display.startswith("k1/"):
            return KernelRun(display, "problem.py", "failed", [Finding(
                "KD501", "candidate-failed", Level.ERROR, Location(display, 5),
                "the kernel timed out", pass_="dynamic", metrics={"status": "timeout"})])
        return KernelRun(display, "problem.py", "ok")

    monkeypatch.setattr(kaudit.dynamic.kernels, "audit_kernel", audit)
    config = kaudit.Config(cache_dir=str(in_tmp / "cache"))
    for _ in range(2):
        kaudit.scan_paths(["."], config, dynamic=kaudit.DynamicOptions(device="cpu"))
    assert sorted(ran) == ["k0/kernel.py", "k0/kernel.py", "k1/kernel.py", "k1/kernel.py",
                           "k2/kernel.py"]
