"""Hostile kernels against `kaudit scan --dynamic`: one per attack class of the threat model (README,
"Threat model"). Each kernel in kernels/ runs against problem.py (tanh(x) * 2 + 1) and the test
asserts the outcome the defences promise: the attack is flagged, or the host is unchanged, or no
process is left. Attacks that only the OS sandbox stops skip with a reason where it is unavailable.

The kernels are written to be safe in a test run: whatever they write or overwrite is limited to
this test's temporary folders (see each kernel's docstring).

    .venv/bin/python -m pytest tests/adversarial -q                          # CPU
    KAUDIT_TEST_DEVICE=cuda .venv/bin/python -m pytest tests/adversarial -q  # on a GPU
    KAUDIT_TEST_SANDBOX=off .venv/bin/python -m pytest tests/adversarial -q  # without the sandbox
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the dynamic pass needs torch; CI installs it")

from kaudit.discover import WorkItem  # noqa: E402
from kaudit.dynamic import sandbox  # noqa: E402
from kaudit.dynamic.kernels import DynamicOptions, audit_items, audit_kernel  # noqa: E402
from kaudit.dynamic.options import TimingSettings  # noqa: E402
from kaudit.dynamic.tolerance import resolve  # noqa: E402
from tests.conftest import DYNAMIC_FIXTURES  # noqa: E402
from tests.helpers import (  # noqa: E402
    ROOT,
    kaudit_environment,
    processes_named,
    processes_under,
    run_kaudit,
    wait_until,
)

HERE = Path(__file__).resolve().parent
KERNELS = HERE / "kernels"
DEVICE = os.environ.get("KAUDIT_TEST_DEVICE", "cpu")
#: KAUDIT_TEST_SANDBOX=off runs the suite without the OS sandbox (what `auto` degrades to where
#: namespaces are unavailable): the attacks only the sandbox stops then skip
SANDBOX = os.environ.get("KAUDIT_TEST_SANDBOX", "auto")
SANDBOXED = SANDBOX != "off" and sandbox.available() is None
WHY_NOT = "KAUDIT_TEST_SANDBOX=off" if SANDBOX == "off" else sandbox.available()
NEEDS_SANDBOX = pytest.mark.skipif(not SANDBOXED, reason=f"only the OS sandbox stops this attack: "
                                                         f"{WHY_NOT}")


@pytest.fixture(autouse=True)
def sandbox_mode():
    sandbox.set_mode(SANDBOX)
    yield
    sandbox.set_mode("auto")
CPU_ONLY = pytest.mark.skipif(DEVICE != "cpu", reason="a CPU kernel (ctypes on host pointers)")


def pair(folder: Path, kernel: str) -> Path:
    """A kernel folder: problem.py and the named kernel as kernel.py."""
    folder.mkdir(parents=True)
    shutil.copy(HERE / "problem.py", folder / "problem.py")
    shutil.copy(KERNELS / f"{kernel}.py", folder / "kernel.py")
    return folder / "kernel.py"


def options(**changes) -> DynamicOptions:
    return DynamicOptions(resolve(None, None, None), device=DEVICE, timeout=240, **changes)


def audit(kernel: Path, **changes):
    return audit_kernel(str(kernel), str(kernel), kernel.read_text(), options(**changes), DEVICE)


def codes(run) -> set[str]:
    return {f.rule for f in run.findings}


def messages(run) -> str:
    return "\n".join(f"{f.rule}: {f.message}" for f in run.findings)


def kaudit(*args: str, cwd: Path, env: dict | None = None,
           timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m kaudit ARGS` in its own process, with its own TMPDIR (cwd/tmp); the dynamic
    pass in this suite's sandbox mode."""
    if "--dynamic" in args:
        args = (*args, "--sandbox", SANDBOX)
    tmp = cwd / "tmp"
    tmp.mkdir(exist_ok=True)
    full = kaudit_environment(tmp, XDG_CONFIG_HOME=str(cwd / "config"), **(env or {}))
    return run_kaudit(*args, cwd=cwd, env=full, timeout=timeout)


def dynamic_findings(proc: subprocess.CompletedProcess) -> list[dict]:
    data = json.loads(proc.stdout)
    return [f for f in data["findings"] if f["pass"] == "dynamic"]


# -- the verdict comes from outside the kernel's reach -------------------------------------------


def test_rebinding_the_save_function_is_tampering(tmp_path):
    run = audit(pair(tmp_path / "rebind", "rebind_save"))
    assert "KD405" in codes(run), messages(run)
    assert "torch.save" in next(f.message for f in run.findings if f.rule == "KD405")
    assert "KD202" in codes(run), "the lazy output itself is what gets judged"


def test_a_faked_full_disk_is_never_a_pass(tmp_path):
    """A job's own report of a full disk is believed (when it is real, neighbours have often freed
    the space by the time kaudit looks, and an honest kernel must not be rejected for it), so a
    kernel can fake one: it gets "not audited", which is never trusted, and says what it claimed."""
    from kaudit.results import Submission
    from kaudit.verdicts import judge

    run = audit(pair(tmp_path / "k", "fakes_full_disk"))
    assert "KD504" in codes(run) and run.status != "ok", messages(run)
    assert "unexpected pos" in messages(run)
    verdict = judge("kernel.py", Submission("paired-folder"), run.findings, None, 10.0)
    assert verdict.verdict == "unverified"


def test_the_reference_in_the_parent_is_out_of_reach(tmp_path):
    """The kernel searches its ancestors' memory for the reference outputs and zeroes them; its
    own output is zeros, so only a reference it could not reach makes it wrong."""
    pair(tmp_path / "memory", "parent_memory")
    proc = kaudit("scan", "memory", "--dynamic", "--device", DEVICE, "--no-cache", "-f", "json",
                  cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "KD202" in {f["rule"] for f in dynamic_findings(proc)}, proc.stdout
    log = tmp_path / "memory" / "parent_memory.log"
    if log.exists():
        assert " overwritten" not in log.read_text().replace(": 0 overwritten", ""), \
            log.read_text()


def test_a_kernel_honest_only_when_watched_is_caught(tmp_path):
    """Its one-line checks find no trace of an auditor in the job: it is lazy there too, and
    wrong (KD202); a kernel that finds another sign is caught by the plain run (KD406, fixture
    bad_right_only_under_modes)."""
    run = audit(pair(tmp_path / "watched", "honest_when_watched"))
    assert codes(run) & {"KD202", "KD406"}, messages(run)


def test_answers_a_kernel_names_as_copies_of_its_first_are_no_cover(tmp_path):
    """The job reports answers identical to an earlier one by name (`same_as`) instead of
    writing them: a kernel that deletes its poisoned answers and names them as its unpoisoned
    first gains nothing over overwriting them, which it always could. Its unwritten rows are
    then judged on that first answer, and it is rejected all the same."""
    run = audit(pair(tmp_path / "names", "names_its_answers"))
    assert codes(run) & {"KD101", "KD202", "KD501"}, messages(run)
    assert any(f.level.value == "error" for f in run.findings), messages(run)


def test_a_kernel_that_allocates_while_tracing_is_still_rejected(tmp_path):
    """Tracing runs with the poisoning's dispatch modes off (the tracer records outputs as
    constants under them): a kernel that allocates its output there gets unpoisoned memory for
    it, as it would by leaving the modes itself, and writes one row. It is rejected all the same:
    what it leaves unwritten is not the reference's answer (KD202), or differs with what the
    allocator hands back (KD102), as the stale memory happens to be; a clean-clone run gave
    KD102 alone."""
    run = audit(pair(tmp_path / "traces", "allocates_while_tracing"))
    assert codes(run) & {"KD101", "KD102", "KD202"}, messages(run)
    assert any(f.level.value == "error" for f in run.findings), messages(run)


def test_a_kernel_right_for_its_first_calls_only_is_caught(tmp_path):
    run = audit(pair(tmp_path / "counter", "counts_calls"))
    assert "KD202" in codes(run), messages(run)
    finding = next(f for f in run.findings if f.rule == "KD202")
    assert finding.metrics["call"] > 12


# -- speedups measured on a clock the kernel cannot reach ----------------------------------------

#: few, short trials: what is judged, not the machine
TIMED = {"timing": TimingSettings("on", warmup=2, min_trials=10, max_trials=40, budget_s=0.3),
         "calls": (8, 12)}
#: honest kernels whose timing must stay clean (the CUDA ones only with KAUDIT_TEST_DEVICE=cuda)
HONEST_TIMED = ["good_pytorch_linear", "good_fastkernels_tanh", "good_gelu_triton"] + (
    ["good_gelu_cuda", "good_softmax_triton"] if DEVICE == "cuda" else [])


def timing_findings(run) -> list[tuple[str, str, str]]:
    return [(f.rule, f.level.value, f.metrics.get("reason")) for f in run.findings]


@pytest.mark.parametrize("fixture", HONEST_TIMED)
def test_honest_kernels_are_timed_without_findings(fixture):
    kernel = DYNAMIC_FIXTURES / fixture / "kernel.py"
    run = audit(kernel, **TIMED)
    assert run.findings == [], messages(run)
    assert run.metrics.get("measured"), run.metrics.get("timing_error")
    witness = run.metrics["witness"]
    assert witness["trials"] == run.metrics["measured"]["trials"], witness
    print(fixture, witness)


def test_rewritten_trial_times_are_tampering(tmp_path):
    """It finds its per-trial times with gc and divides them by 50; the brackets stamped as the
    job marked them show what its trials took."""
    run = audit(pair(tmp_path / "forger", "forges_trial_times"), **TIMED)
    assert timing_findings(run) == [("KD405", "error", "timing-forged")], messages(run)
    assert "candidate" in run.findings[0].metrics["forged"]
    assert "measured" not in run.metrics


def test_marks_written_by_the_kernel_are_tampering(tmp_path):
    run = audit(pair(tmp_path / "marks", "writes_timing_marks"), **TIMED)
    assert timing_findings(run) == [("KD405", "error", "timing-marks")], messages(run)
    assert "measured" not in run.metrics


def test_work_moved_between_trials_is_found(tmp_path):
    """Its timed calls are fast and truly so; 5 ms of work per call run in a finaliser between
    trials. A warning that adds the time back; the measurement stays."""
    run = audit(pair(tmp_path / "mover", "works_between_trials"), **TIMED)
    assert timing_findings(run) == [("KD405", "warning", "timing-moved-work")], messages(run)
    assert 4 < run.findings[0].metrics["outside_ms"] < 50, run.metrics["witness"]
    assert run.metrics["measured"]


# -- the parent protects itself ------------------------------------------------------------------


@pytest.mark.skipif(not SANDBOXED, reason="without the sandbox a job can read the key that signs "
                    f"the cache: {WHY_NOT}")
def test_the_result_cache_cannot_be_rewritten_by_a_kernel(tmp_path):
    pair(tmp_path / "cached", "poisons_cache")
    static = kaudit("scan", "cached", "-f", "json", cwd=tmp_path)
    rejected = {f["rule"] for f in json.loads(static.stdout)["findings"] if f["level"] == "error"}
    assert rejected, static.stdout
    kaudit("scan", "cached", "--dynamic", "--device", DEVICE, "-f", "json", cwd=tmp_path)
    again = kaudit("scan", "cached", "-f", "json", cwd=tmp_path)
    assert again.returncode == 1, again.stdout
    assert {f["rule"] for f in json.loads(again.stdout)["findings"]
            if f["level"] == "error"} == rejected


@CPU_ONLY
def test_a_kernel_cannot_replace_its_neighbours_build(tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    items = []
    for name, kernel in (("r1", "shared_library"), ("r2", "swaps_libraries"),
                         ("r3", "shared_library")):
        path = pair(tmp_path / name, kernel)
        items.append(WorkItem(str(path), name, True))
    builds = tmp_path / "builds"
    builds.mkdir()
    first, _, third = audit_items(items, options(extensions_dir=str(builds)), DEVICE)
    assert first.status == "ok" and not first.findings, messages(first)
    assert third.status == "ok" and not third.findings, messages(third)


def test_the_installation_cannot_be_edited_into_a_clean_report(tmp_path):
    """The kernel appends code to kaudit's renderers and exit gate. The scan must either keep the
    installation unchanged or refuse to report (exit 2)."""
    install = tmp_path / "adversarial-install"
    # "rules": a source tree run as kaudit may link kaudit/rules to ../rules
    shutil.copytree(ROOT / "kaudit", install / "kaudit",
                    ignore=shutil.ignore_patterns("__pycache__", "rules"))
    shutil.copytree(ROOT / "rules", install / "kaudit" / "rules",
                    ignore=shutil.ignore_patterns("__pycache__"))
    before = {p: p.read_bytes() for p in install.rglob("*.py")}
    pair(tmp_path / "editor", "edits_installation")
    proc = kaudit("scan", "editor", "--dynamic", "--device", DEVICE, "--no-cache",
                  "--output-dir", "report", cwd=tmp_path,
                  # the copy first; what follows it may hold kaudit's dependencies (a machine
                  # where they are not installed, such as the GPU host)
                  env={"PYTHONPATH": os.pathsep.join(
                      filter(None, (str(install), os.environ.get("PYTHONPATH"))))})
    changed = sorted(str(p.relative_to(install)) for p, data in before.items()
                     if p.read_bytes() != data)
    if changed:
        assert proc.returncode == 2, (changed, proc.returncode, proc.stderr)
        assert "changed during the dynamic pass" in proc.stderr
        assert "refusing to report" in proc.stderr
    else:
        report = tmp_path / "report" / "kaudit-dynamic.sarif"
        assert proc.returncode == 1 and report.exists(), proc.stderr
        sarif = json.loads(report.read_text())
        assert sarif["runs"][0]["results"], "the lazy kernel's findings are reported"


def test_a_kernel_killing_its_parent_leaves_a_report_and_nothing_else(tmp_path):
    pair(tmp_path / "killer", "kills_parent")
    proc = kaudit("scan", "killer", "--dynamic", "--device", DEVICE, "--no-cache", "-f", "json",
                  cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    # in the sandbox its parent is the namespace's init, which ignores the signal; without it,
    # the job's own supervisor dies and the kernel fails
    expected = set() if SANDBOXED else {"KD501"}
    assert {f["rule"] for f in dynamic_findings(proc)} == expected, proc.stdout
    assert wait_until(lambda: not processes_under(tmp_path / "tmp")), "no process is left"
    assert list((tmp_path / "tmp").iterdir()) == [], "no temporary folder is left"


def test_a_daemon_started_by_the_kernel_does_not_survive(tmp_path):
    kernel = pair(tmp_path / "daemon", "leaves_daemon")
    name = "dmn" + hashlib.sha256(str(kernel).encode()).hexdigest()[:10]
    try:
        run = audit(kernel)
        assert run.status == "ok", messages(run)
        assert wait_until(lambda: not processes_named(name), 10), "the daemon outlived the job"
    finally:
        for pid in processes_named(name):
            os.kill(pid, signal.SIGKILL)


def test_resource_abuse_is_contained(tmp_path):
    kernel = pair(tmp_path / "abuse", "abuses_resources")
    token = hashlib.sha256(str(kernel).encode()).hexdigest()[:10]
    outside = [kernel.parent / "written_outside.txt", Path(f"/tmp/outside-{token}.txt")]
    try:
        run = audit(kernel)
        oversized = [f for f in run.findings if f.rule == "KD405"]
        assert oversized and "larger than" in oversized[0].message, messages(run)
        if SANDBOXED:
            assert not [p for p in outside if p.exists()], "the filesystem is read-only"
    finally:
        for path in outside:
            path.unlink(missing_ok=True)


def test_input_mutation_on_the_first_call_and_a_timer_are_found(tmp_path):
    run = audit(pair(tmp_path / "timer", "mutates_once_and_defers"))
    assert {"KD402", "KD404"} <= codes(run), messages(run)
    deferred = next(f for f in run.findings if f.rule == "KD404")
    assert "Timer" in deferred.message or "thread" in deferred.message, deferred.message


@NEEDS_SANDBOX
def test_attacks_that_only_the_sandbox_stops_are_stopped(tmp_path):
    """Without the sandbox, a job runs as kaudit's user: it can write outside its folder. With
    it, the kernel of test_resource_abuse_is_contained writes nothing outside."""
    kernel = pair(tmp_path / "abuse", "abuses_resources")
    token = hashlib.sha256(str(kernel).encode()).hexdigest()[:10]
    outside = [kernel.parent / "written_outside.txt", Path(f"/tmp/outside-{token}.txt")]
    try:
        audit(kernel)
        assert not [p for p in outside if p.exists()]
    finally:
        for path in outside:
            path.unlink(missing_ok=True)
