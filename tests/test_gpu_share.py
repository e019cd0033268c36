"""GPU memory shared by concurrent jobs and kaudit processes (`kaudit.dynamic.gpu_share`), the
scan's bounded temporary disk (`scratch.start_budget`) and a problem's inputs written once and
shared read-only (`runner.share_inputs`). No GPU: the lock protocol runs between real processes,
and out-of-memory failures are simulated by jobs (or a fake launcher) that report one."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kaudit.dynamic import gpu_share, host_memory, problems, runner, sandbox, scratch
from kaudit.dynamic.gpu_share import GPU_MEMORY_SHARE, WIDE_SHARE, GpuClaim, GpuMemory
from kaudit.dynamic.runner import ERROR, OK, OOM, Job, RunResult, run_job
from kaudit.dynamic.ledger import Ledger

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "fixtures" / "problems" / "good_matmul.py"

HOLDER = '''
import sys, time
from pathlib import Path
from kaudit.dynamic import gpu_share
release = Path(sys.argv[2])
with gpu_share.holding("0", exclusive=sys.argv[1] == "exclusive"):
    Path(sys.argv[3]).write_text("held")
    while not release.exists():
        time.sleep(0.02)
'''

JOBS = '''
import os

def needs_the_whole_gpu(args, out_dir):
    # a job that runs out of memory beside others and fits alone: it is told its cap
    if args["gpu_memory_fraction"] < 0.9:
        raise MemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
    return {"fraction": args["gpu_memory_fraction"], "gpu": os.environ["CUDA_VISIBLE_DEVICES"]}

def never_fits(args, out_dir):
    raise MemoryError("CUDA out of memory. Tried to allocate 200.00 GiB")

def wrong(args, out_dir):
    raise ValueError("not a memory problem")

def write(args, out_dir):
    for index in range(args["files"]):
        with open(os.path.join(out_dir, f"blob{index}"), "wb") as handle:
            handle.write(os.urandom(args["bytes"]))
    return {}

def read_inputs(args, out_dir):
    names = sorted(os.listdir(args["in_dir"]))
    with open(os.path.join(args["in_dir"], "inputs_a.pt"), "rb") as handle:
        return {"names": names, "data": handle.read().decode()}
'''


@pytest.fixture(autouse=True)
def private_locks(tmp_path, monkeypatch):
    """Locks in the test's own folder, GPUs named by index (no NVML), no sandbox (jobs are
    files of the test's folder)."""
    monkeypatch.setenv(gpu_share.LOCKS_ENV, str(tmp_path / "locks"))
    monkeypatch.setattr(gpu_share, "_nvidia_smi", lambda: {})
    gpu_share.forget_measurements()
    sandbox.set_mode("off")
    yield
    sandbox.set_mode("auto")
    scratch.start_budget(0)


@pytest.fixture
def jobs(tmp_path) -> Path:
    path = tmp_path / "jobs.py"
    path.write_text(JOBS)
    return path


def hold_in_other_process(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    """A kaudit-like process holding GPU 0's lock until the returned file is created."""
    release, held = tmp_path / f"release-{mode}", tmp_path / f"held-{mode}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-c", HOLDER, mode, str(release), str(held)],
                               env=env)
    while not held.exists():
        assert process.poll() is None, "the holder died"
        time.sleep(0.02)
    return process, release


def acquire_in_thread(exclusive: bool) -> tuple[threading.Thread, threading.Event,
                                                threading.Event]:
    """A thread that takes GPU 0's lock, sets `got`, and keeps it until `done` is set."""
    got, done = threading.Event(), threading.Event()

    def take() -> None:
        with gpu_share.holding("0", exclusive=exclusive):
            got.set()
            done.wait(30)

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread, got, done


def test_an_exclusive_lock_in_another_process_blocks_a_shared_one(tmp_path):
    process, release = hold_in_other_process(tmp_path, "exclusive")
    thread, got, done = acquire_in_thread(exclusive=False)
    try:
        assert not got.wait(0.5), "a shared lock was granted beside another process's exclusive"
        release.touch()
        assert got.wait(30), "the shared lock follows once the exclusive one is released"
    finally:
        release.touch()
        done.set()
        thread.join(30)
        process.wait(30)


def test_shared_locks_coexist_and_block_an_exclusive_one(tmp_path):
    process, release = hold_in_other_process(tmp_path, "shared")
    shared, got_shared, done_shared = acquire_in_thread(exclusive=False)
    exclusive = None
    try:
        # asked only once the shared lock is held: an exclusive request first at the gate would
        # (rightly) keep the shared one waiting behind it
        assert got_shared.wait(30), "two shared locks (two processes) hold the GPU together"
        exclusive, got_exclusive, done_exclusive = acquire_in_thread(exclusive=True)
        assert not got_exclusive.wait(0.5)
        done_shared.set()
        shared.join(30)
        assert not got_exclusive.wait(0.3), "the other process still holds its shared lock"
        release.touch()
        assert got_exclusive.wait(30)
    finally:
        release.touch()
        done_shared.set()
        if exclusive is not None:
            done_exclusive.set()
            exclusive.join(30)
        process.wait(30)


def test_a_waiting_exclusive_lock_goes_before_later_shared_ones(tmp_path):
    first, got_first, done_first = acquire_in_thread(exclusive=False)
    assert got_first.wait(30)
    exclusive, got_exclusive, done_exclusive = acquire_in_thread(exclusive=True)
    time.sleep(0.3)  # the exclusive request waits at the gate, holding it
    later, got_later, done_later = acquire_in_thread(exclusive=False)
    try:
        assert not got_later.wait(0.5), "a later shared lock overtook a waiting exclusive one"
        done_first.set()
        assert got_exclusive.wait(30) and not got_later.is_set()
        done_exclusive.set()
        assert got_later.wait(30)
    finally:
        for event in (done_first, done_exclusive, done_later):
            event.set()
        for thread in (first, exclusive, later):
            thread.join(30)


def test_a_lock_folder_others_may_write_is_not_used(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    monkeypatch.setenv(gpu_share.LOCKS_ENV, str(folder))
    monkeypatch.setattr(gpu_share, "_warned", False)
    assert gpu_share.lock_folder() is None
    with gpu_share.holding("0", exclusive=True):  # runs, uncoordinated, and says so
        pass
    assert list(folder.iterdir()) == []
    assert "without coordinating" in capsys.readouterr().err


def shared_lock_free(device: str = "0") -> bool:
    """Whether a shared lock on the GPU could be taken now (no exclusive holder)."""
    path = gpu_share.lock_folder() / f"{gpu_share.lock_name(device)}.lock"
    handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(handle)


class FakeLaunch:
    """Stands in for a job's process: returns the given statuses in turn, recording each job's
    cap and whether the GPU was held exclusively while it ran."""

    def __init__(self, *statuses: str) -> None:
        self.statuses = list(statuses)
        self.fractions: list[float] = []
        self.alone: list[bool] = []

    def __call__(self, job: Job) -> RunResult:
        self.fractions.append(job.args["gpu_memory_fraction"])
        self.alone.append(not shared_lock_free())
        status = self.statuses.pop(0)
        return RunResult(status, error="CUDA out of memory" if status == OOM else "")


def test_an_out_of_memory_failure_runs_again_wider_then_alone_on_the_gpu():
    launch = FakeLaunch(OOM, OOM, OK)
    result = gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.1), launch)
    assert result.ok and result.retried_alone
    assert launch.alone == [False, False, True], "only the last run holds the exclusive lock"
    assert launch.fractions == [0.1, WIDE_SHARE, GPU_MEMORY_SHARE], \
        "its share, then half of the process's part, then alone and not capped to a share"


def test_a_job_that_fits_in_the_wider_cap_does_not_empty_the_gpu():
    launch = FakeLaunch(OOM, OK)
    result = gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.1), launch)
    assert result.ok and not result.retried_alone
    assert launch.alone == [False, False] and launch.fractions == [0.1, WIDE_SHARE]


def test_a_job_whose_share_is_already_wide_goes_straight_to_running_alone():
    launch = FakeLaunch(OOM, OK)
    result = gpu_share.run_claimed(Job("x:y"), GpuClaim("0", GPU_MEMORY_SHARE), launch)
    assert result.ok and result.retried_alone and launch.alone == [False, True]


def test_the_next_job_of_a_kernel_starts_where_the_last_one_fit():
    claim = GpuClaim("0", 0.1)
    first = FakeLaunch(OOM, OK)
    assert gpu_share.run_claimed(Job("x:y"), claim, first).ok
    second = FakeLaunch(OK)
    assert gpu_share.run_claimed(Job("x:y"), claim, second).ok
    assert second.fractions == [WIDE_SHARE], "no second failure at the share it did not fit"
    third = FakeLaunch(OOM, OK)
    assert gpu_share.run_claimed(Job("x:y"), claim, third).ok
    fourth = FakeLaunch(OK)
    result = gpu_share.run_claimed(Job("x:y"), claim, fourth)
    assert result.ok and result.retried_alone and fourth.alone == [True]
    other = FakeLaunch(OK)
    assert gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.1), other).ok
    assert other.fractions == [0.1], "another kernel's claim starts at its share"


def test_a_last_out_of_memory_failure_is_reported_with_what_was_free(monkeypatch):
    monkeypatch.setattr(gpu_share, "_nvidia_smi", lambda: {
        "0": GpuMemory("GPU-aaaa", 100 << 30, 140 << 30)})
    launch = FakeLaunch(OOM, OOM, OOM)
    result = gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.3), launch)
    assert result.status == OOM and len(launch.fractions) == 3
    assert "alone on GPU 0" in result.describe() and "100.0 GiB free of 140.0 GiB" in \
        result.describe()


def reserve_in_thread(book, fraction: float, wide: bool):
    """Reserve `fraction` of `book` in a thread; (granted, release) events."""
    granted, release = threading.Event(), threading.Event()

    def hold() -> None:
        with book.reserve(fraction, wide):
            granted.set()
            release.wait(30)

    threading.Thread(target=hold, daemon=True).start()
    return granted, release


def test_a_wide_run_waits_for_room_and_later_jobs_wait_behind_it():
    book = Ledger(GPU_MEMORY_SHARE)
    share = GPU_MEMORY_SHARE / 4
    held = [reserve_in_thread(book, share, wide=False) for _ in range(4)]
    assert all(granted.wait(10) for granted, _ in held), "jobs at their share do not wait"
    wide, release_wide = reserve_in_thread(book, WIDE_SHARE, wide=True)
    time.sleep(0.2)
    later, release_later = reserve_in_thread(book, share, wide=False)
    try:
        assert not wide.wait(0.3), "the wide run waits while the GPU's part is full"
        held[0][1].set()
        assert not wide.wait(0.3), "one quarter free is not half"
        held[1][1].set()
        assert wide.wait(10), "half free: the wide run starts beside the other two"
        assert not later.wait(0.3), "the GPU's part is full again: the later job waits"
        held[2][1].set()
        assert later.wait(10)
    finally:
        for event in (release_wide, release_later, *(release for _, release in held)):
            event.set()


def test_other_outcomes_run_once_and_the_cap_follows_free_memory(monkeypatch):
    monkeypatch.setattr(gpu_share, "_nvidia_smi", lambda: {
        "0": GpuMemory("GPU-aaaa", 14 << 30, 140 << 30)})
    for status in (OK, ERROR):
        launch = FakeLaunch(status)
        result = gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.45), launch)
        assert result.status == status and launch.alone == [False]
        assert launch.fractions == [pytest.approx(0.09)], \
            "a neighbour holds 90% of the GPU: the cap is 90% of the free 10%, not 45%"


def test_what_looks_like_out_of_memory():
    assert gpu_share.looks_oom(RunResult(OOM))
    assert gpu_share.looks_oom(RunResult(
        "crashed", stderr_tail="RuntimeError: CUDA error: out of memory\n"))
    assert gpu_share.looks_oom(RunResult(OK, value={"fp64_error": "out of memory: Outof..."}))
    assert not gpu_share.looks_oom(RunResult(ERROR, error_type="ValueError", error="shape"))
    assert not gpu_share.looks_oom(RunResult(OK, value={"fp64_error": None}))


def test_run_job_retries_a_real_job_alone_with_the_gpu_named(jobs):
    with run_job(Job(f"{jobs}:needs_the_whole_gpu", timeout=60,
                     gpu=GpuClaim("3", 0.45))) as result:
        assert result.ok, result.describe()
        assert result.retried_alone
        assert result.value == {"fraction": GPU_MEMORY_SHARE, "gpu": "3"}
    with run_job(Job(f"{jobs}:wrong", timeout=60, gpu=GpuClaim("3", 0.45))) as result:
        assert result.status == ERROR and not result.retried_alone


@pytest.fixture
def problems_on_a_fake_gpu(monkeypatch):
    """`kaudit problems` believing it runs on CUDA device 0; each job actually runs on the CPU.
    `launches` records whether each job held the GPU alone; `fail` how many launches report
    running out of memory before the real job runs."""
    monkeypatch.setattr(problems, "resolve_device", lambda requested: "cuda")
    monkeypatch.setattr(gpu_share, "visible_gpus", lambda: ["0"])
    real = runner._run_once
    state = {"fail": 0, "launches": []}

    def launch(job: Job, disk: object | None = None) -> RunResult:
        state["launches"].append(not shared_lock_free())
        if len(state["launches"]) <= state["fail"]:
            return RunResult(OOM, phase="forward", error_type="OutOfMemoryError",
                             error="CUDA out of memory. Tried to allocate 2.00 MiB")
        result = real(dataclasses.replace(job, args={**job.args, "device": "cpu"}), disk)
        state.setdefault("statuses", []).append(result.status)
        return result

    monkeypatch.setattr(runner, "_run_once", launch)
    return state


def test_a_problem_that_fits_alone_gets_no_out_of_memory_finding(problems_on_a_fake_gpu):
    from kaudit.dynamic.tolerance import resolve

    problems_on_a_fake_gpu["fail"] = 1
    report = problems.audit_problems([str(PROBLEM)], problems.Options(resolve(None, None, None),
                                                                      seeds=2, timeout=120))
    assert problems_on_a_fake_gpu["launches"] == [False, True]
    (problem,) = report.problems
    assert problem.status == "ok" and "KP501" not in problem.codes(), problem.error
    from kaudit.dynamic.problems_cli import stream_line

    assert stream_line(problem)["retried_alone_on_gpu"] is True, "--stream says it ran alone"


def test_the_finding_appears_when_the_retry_alone_also_runs_out(problems_on_a_fake_gpu):
    from kaudit.dynamic.tolerance import resolve

    problems_on_a_fake_gpu["fail"] = 2
    report = problems.audit_problems([str(PROBLEM)], problems.Options(resolve(None, None, None),
                                                                      seeds=2, timeout=120))
    assert problems_on_a_fake_gpu["launches"] == [False, True]
    (problem,) = report.problems
    (finding,) = [f for f in problem.findings if f.rule == "KP501"]
    assert "out of memory" in finding.message and "alone on GPU 0" in finding.message
    assert finding.metrics["retried_alone_on_gpu"] is True


SHORT_OF_MEMORY_IN_FLOAT64 = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        if x.dtype == torch.float64:
            raise RuntimeError("CUDA out of memory. Tried to allocate 12.00 GiB")
        return x * 2

def get_inputs():
    return [torch.randn(64)]

def get_init_inputs():
    return []
"""


def test_a_problem_short_of_memory_stops_at_once_when_it_will_run_again(problems_on_a_fake_gpu,
                                                                      tmp_path):
    from kaudit.dynamic.tolerance import resolve

    problem_file = tmp_path / "short.py"
    problem_file.write_text(SHORT_OF_MEMORY_IN_FLOAT64)
    report = problems.audit_problems([str(problem_file)], problems.Options(
        resolve(None, None, None), seeds=2, timeout=120))
    assert problems_on_a_fake_gpu["launches"] == [False, True]
    assert problems_on_a_fake_gpu["statuses"] == [OOM, OK], \
        "the first run ends at its float64 shortage; the run alone records it and goes on"
    (problem,) = report.problems
    assert problem.retried_alone_on_gpu and "KP502" in problem.codes(), problem.codes()


# -- temporary disk --------------------------------------------------------------------------


def test_a_job_over_the_temp_limit_fails_clearly_and_the_peak_is_reported(jobs):
    scratch.start_budget(8 << 20)
    with run_job(Job(f"{jobs}:write", {"files": 1, "bytes": 1 << 20}, timeout=60)) as small:
        assert small.ok, small.describe()
    peak = scratch.usage()["peak_bytes"]
    assert (1 << 20) <= peak < (8 << 20)
    with run_job(Job(f"{jobs}:write", {"files": 12, "bytes": 1 << 20}, timeout=60)) as many:
        assert many.status == ERROR and many.errno == errno.EDQUOT
        assert "temporary files reached its limit of 8.0 MiB" in many.describe()
    assert scratch.usage()["limit_bytes"] == 8 << 20 and scratch.usage()["peak_bytes"] > 8 << 20
    with run_job(Job(f"{jobs}:write", {"files": 1, "bytes": 12 << 20}, timeout=60)) as large:
        assert large.errno == errno.EDQUOT, "one file is capped at what is left of the limit"
    with run_job(Job(f"{jobs}:write", {"files": 1, "bytes": 1 << 20}, timeout=60)) as after:
        assert after.ok, "removed folders give their room back: the scan goes on"


def test_no_temp_limit():
    assert scratch.start_budget(0).limit is None
    assert scratch.left() is None
    assert scratch.start_budget(None).limit == scratch.default_temp_limit()


# -- shared inputs ---------------------------------------------------------------------------


def test_inputs_are_moved_once_and_shared_read_only(jobs, tmp_path):
    with run_job(Job(f"{jobs}:write", {"files": 1, "bytes": 8}, timeout=60)) as reference:
        reference.path("blob0").write_text("inputs")
        os.rename(reference.path("blob0"), reference.out_dir / "inputs_a.pt")
        (reference.out_dir / "ref_a.pt").write_text("the reference output")
        shared = runner.share_inputs(reference, ["inputs_a.pt"])
        assert reference.files() == ["ref_a.pt"], "moved, not copied"
    try:
        assert oct((shared.path("inputs_a.pt")).stat().st_mode & 0o777) == "0o444"
        for _ in range(2):
            with run_job(Job(f"{jobs}:read_inputs", timeout=60, inputs=shared)) as result:
                assert result.value == {"names": ["inputs_a.pt"], "data": "inputs"}
        os.chmod(shared.path("inputs_a.pt"), 0o644)  # what a job without the sandbox could do
        with pytest.raises(runner.InputsChanged):
            run_job(Job(f"{jobs}:read_inputs", timeout=60, inputs=shared))
    finally:
        scratch.remove(shared.folder)
    assert not shared.folder.exists()


# -- what the audits hold in kaudit's own memory ---------------------------------------------------


class RecordingLedger(Ledger):
    def __init__(self, capacity: float) -> None:
        super().__init__(capacity)
        self.asked: list[float] = []

    def reserve(self, amount: float, wide: bool = True):
        self.asked.append(amount)
        return super().reserve(amount, wide)


def test_audits_wait_for_room_in_kaudits_memory_and_one_larger_than_all_runs_alone(monkeypatch):
    book = RecordingLedger(100.0)
    monkeypatch.setattr(host_memory, "_ledger", book)
    with host_memory.holding(30) as waited:  # 60 of 100 held
        assert waited < 1
        second, release_second = reserve_in_thread(book, 60, wide=True)
        assert not second.wait(0.3), "no room for a second audit of that size"
    assert second.wait(10), "room once the first audit ended"
    huge, release_huge = reserve_in_thread(book, 500, wide=True)
    try:
        assert not huge.wait(0.3), "larger than the whole: it waits to be alone"
        release_second.set()
        assert huge.wait(10)
    finally:
        release_second.set()
        release_huge.set()


def test_an_audit_reserves_twice_its_reference_outputs_and_gives_them_back(monkeypatch, tmp_path):
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic import kernels
    from kaudit.dynamic.options import DynamicOptions

    book = RecordingLedger(float(1 << 40))
    monkeypatch.setattr(host_memory, "_ledger", book)
    kernel = ROOT / "fixtures" / "dynamic" / "good_pytorch_linear" / "kernel.py"
    run = kernels.audit_kernel(str(kernel), "kernel.py", kernel.read_text(),
                               DynamicOptions(device="cpu", timeout=240,
                                              extensions_dir=str(tmp_path)), "cpu")
    assert run.status == "ok"
    # the outputs of both input sets and of each scale, float64 copies included: kilobytes
    assert len(book.asked) == 1 and 4 * 1024 < book.asked[0] < 1 << 20
    assert book.held == 0 and "memory_wait" in run.metrics["job_seconds"]


# -- problems sized before they run ------------------------------------------------------------


def test_a_job_sized_to_need_more_than_its_share_asks_for_that_first():
    launch = FakeLaunch(OK)
    result = gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.1, need=0.3), launch)
    assert result.ok and launch.fractions == [0.3]
    larger = FakeLaunch(OOM, OK)
    assert gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.1, need=2.0), larger).ok
    assert larger.fractions == [WIDE_SHARE, GPU_MEMORY_SHARE] and larger.alone == [False, True]
    small = FakeLaunch(OOM, OK)
    assert gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.1, need=0.01), small).ok
    assert small.fractions == [0.1, WIDE_SHARE], "a small need is no reason to ask less"


def test_problems_are_sized_on_the_meta_device_before_they_run(monkeypatch):
    pytest.importorskip("torch", reason="the sizing job needs torch")
    total = 100 << 30
    monkeypatch.setattr(problems, "visible_gpus", lambda: ["0"])
    monkeypatch.setattr(problems, "gpu_memory", lambda device: GpuMemory("GPU-a", total, total))
    folder = ROOT / "fixtures" / "problems"
    files = [str(folder / "good_matmul.py"), str(folder / "bad_raises_in_init.py")]
    from kaudit.dynamic.tolerance import PRESETS

    needs = problems.gpu_needs(files, problems.Options(PRESETS["kernelbench"], device="cuda"))
    # a (64, 128) and a (128, 64) float32 input, a (64, 64) output, no parameters
    inputs, outputs = 2 * 64 * 128 * 4, 64 * 64 * 4
    expected = problems.PEAK_MARGIN * (problems.PEAK_INPUTS * inputs
                                       + problems.PEAK_OUTPUTS * outputs) / total
    assert needs == {files[0]: pytest.approx(expected)}, "a problem that cannot be sized is left out"


def test_jobs_that_say_what_they_write_wait_for_room_instead_of_failing(jobs):
    """Folders are measured when their jobs end: two jobs that each write 5 MiB at once under an
    8 MiB limit both finished over it. Reserving first, the second waits for the first."""
    from concurrent.futures import ThreadPoolExecutor

    from kaudit.dynamic.runner import job_seconds

    scratch.start_budget(8 << 20)

    def write(_: int) -> tuple[bool, str, dict]:
        with job_seconds() as seconds:
            with run_job(Job(f"{jobs}:write", {"files": 5, "bytes": 1 << 20}, timeout=60,
                             disk_estimate=5 << 20)) as result:
                time.sleep(0.5)  # its result stays open a while, as a judged kernel's does
                return result.ok, result.describe(), seconds

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(write, range(2)))
    assert all(ok for ok, _, _ in outcomes), [why for _, why, _ in outcomes]
    waits = sorted(seconds["disk_wait"] for _, _, seconds in outcomes)
    assert waits[0] < 0.1 and waits[1] >= 0.4, "the second waited for the first's result"
    assert scratch.left() == 8 << 20, "every reservation and folder given back"
    scratch.start_budget(0)


def test_disk_reservations_are_granted_in_order_of_arrival():
    """A large job waiting for room is not overtaken by small ones that would fit beside the
    jobs running: it would wait for as long as they keep coming."""
    scratch.start_budget(10 << 20)
    running, _ = scratch.reserve(4 << 20)
    order: list[str] = []

    def ask(name: str, nbytes: int) -> None:
        token, _ = scratch.reserve(nbytes)
        order.append(name)
        time.sleep(0.2)
        scratch.release(token)

    large = threading.Thread(target=ask, args=("large", 9 << 20))
    large.start()
    time.sleep(0.2)
    small = threading.Thread(target=ask, args=("small", 4 << 20))
    small.start()
    time.sleep(0.2)
    try:
        assert order == [], "the small job fits beside the running one, but waits its turn"
    finally:
        scratch.release(running)
        large.join(10)
        small.join(10)
        scratch.start_budget(0)
    assert order == ["large", "small"]


def test_a_reservation_is_not_counted_as_written(jobs):
    """Reservations decide only when a job that reserves may start: a job that reserved nothing
    (a reference job) is not failed, nor its files capped, for room others only reserved."""
    scratch.start_budget(10 << 20)
    try:
        held, _ = scratch.reserve(12 << 20)  # more than the limit: granted, no one else reserved
        with run_job(Job(f"{jobs}:write", {"files": 3, "bytes": 1 << 20}, timeout=60)) as result:
            assert result.ok, result.describe()
        assert scratch.usage()["peak_bytes"] < 5 << 20, "the peak is what was on disk"
        scratch.release(held)
    finally:
        scratch.start_budget(0)


def test_a_job_waiting_for_disk_moves_to_a_new_scans_budget():
    scratch.start_budget(10 << 20)
    held, _ = scratch.reserve(8 << 20)
    granted: list[object] = []
    waiter = threading.Thread(target=lambda: granted.append(scratch.reserve(8 << 20)[0]))
    waiter.start()
    time.sleep(0.2)
    assert not granted, "no room beside the first reservation"
    scratch.start_budget(0)  # the next scan has no limit: nothing to reserve
    waiter.join(10)
    assert granted == [None]
    scratch.release(held)


def test_a_kernels_reference_job_reserves_the_disk_its_problem_is_sized_to_write(monkeypatch):
    """Reference jobs reserved nothing: on the H200 fourteen of them at once, up to 17.5 GiB
    each, filled the 64 GiB disk (KD504). The problem is now sized on the meta device (once per
    text), its job reserves what it writes, and gives that back once its files are measured."""
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic import kernels, problem_sizing
    from kaudit.dynamic.options import DynamicOptions
    from tests.conftest import DYNAMIC_FIXTURES

    problem = str(ROOT / "fixtures" / "problems" / "good_matmul.py")
    size = problem_sizing.size_problems([problem], 42)[problem]
    # (64, 128) and (128, 64) float32 inputs, one (64, 64) float32 output, no parameters
    assert size == problem_sizing.ProblemSize(0, 2 * 64 * 128 * 4, 64 * 64 * 4, 64 * 64 * 8)
    # inputs A and B, the state, outputs A and B, and per other scale an output and a float64 one
    assert problem_sizing.reference_writes(size, 2) == 2 * size.inputs + 4 * size.outputs + \
        2 * 8 * 64 * 64 + 9 * problem_sizing.SAVE_OVERHEAD
    assert problem_sizing.reference_writes(dataclasses.replace(size, outputs=None), 2) == 0

    sized, reserved = [], []
    real_size, real_reserve = problem_sizing.size_problems, scratch.reserve
    monkeypatch.setattr(problem_sizing, "size_problems",
                        lambda paths, seed, *a: sized.append(paths) or real_size(paths, seed))
    monkeypatch.setattr(scratch, "reserve",
                        lambda nbytes: reserved.append(nbytes) or real_reserve(nbytes))
    monkeypatch.setattr(kernels, "SIZED_DEVICES", ("cpu",))
    monkeypatch.setattr(problem_sizing, "sizes", problem_sizing.SizeMemo())
    limit = 1 << 40
    scratch.start_budget(limit)
    kernel = DYNAMIC_FIXTURES / "good_pytorch_linear" / "kernel.py"
    options = DynamicOptions(device="cpu", timeout=240)
    linear = kernel.parent / "problem.py"
    for _ in range(2):
        run = kernels.audit_kernel(str(kernel), "kernel.py", kernel.read_text(), options, "cpu")
        assert run.status == "ok", run.findings
    linear_size = real_size([str(linear)], 42)[str(linear)]
    expected = problem_sizing.reference_writes(linear_size, len(options.scales) - 1)
    assert expected > 0 and reserved.count(expected) == 2, reserved
    assert sized == [[str(linear)]], "one sizing job for the problem's text"
    assert scratch.left() == limit, "every reservation given back"
    scratch.start_budget(0)




def test_audits_waiting_for_memory_and_disk_do_not_wait_for_each_other(monkeypatch, tmp_path):
    """Lock order: an audit waits for kaudit's memory holding no disk reservation. With its
    reference job's reservation held through that wait, one audit held memory and waited for
    disk while the other held disk and waited for memory: on the H200 fourteen audits finished
    nothing in three minutes. Here memory fits one audit at a time and the disk limit fits one
    reference job's reservation beside a kernel job's."""
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic import kernels, problem_sizing
    from kaudit.dynamic.options import DynamicOptions
    from tests.conftest import DYNAMIC_FIXTURES

    monkeypatch.setattr(kernels, "SIZED_DEVICES", ("cpu",))
    monkeypatch.setattr(problem_sizing, "sizes", problem_sizing.SizeMemo())
    monkeypatch.setattr(host_memory, "_ledger", Ledger(1.0))  # each audit alone in memory
    linear = DYNAMIC_FIXTURES / "good_pytorch_linear"
    kernel_text = (linear / "kernel.py").read_text()
    # the same problem with a 1024 x 1024 output (4 MiB): what jobs write is mostly outputs
    heavy = (linear / "problem.py").read_text().replace("randn(32, 64)", "randn(1024, 64)")
    heavy = heavy.replace("return [64, 48]", "return [64, 1024]")
    assert "1024, 64" in heavy and "[64, 1024]" in heavy
    files = []
    for index in range(2):
        folder = tmp_path / f"k{index}"
        folder.mkdir()
        (folder / "problem.py").write_text(heavy)
        (folder / "kernel.py").write_text(kernel_text + f"\n# copy {index}\n")
        files.append(folder / "kernel.py")
    problem = str(tmp_path / "k0" / "problem.py")
    writes = problem_sizing.reference_writes(problem_sizing.size_problems([problem], 42)[problem],
                                             2)
    output = 1024 * 1024 * 4
    # one reference folder on disk, its reservation and a kernel job's reservation are over
    # the limit; the folder and the kernel job's reservation are not
    scratch.start_budget(writes + kernels.JOB_WRITES * output + 4 * output)
    runs = {}

    def audit(file: Path) -> None:
        runs[file] = kernels.audit_kernel(str(file), file.parent.name, file.read_text(),
                                          DynamicOptions(device="cpu", timeout=120), "cpu")

    threads = [threading.Thread(target=audit, args=(f,), daemon=True) for f in files]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    try:
        assert all(not t.is_alive() for t in threads), "the audits waited for each other"
        assert [runs[f].status for f in files] == ["ok", "ok"], [runs[f].findings for f in files]
    finally:
        scratch.start_budget(0)


def test_a_reference_job_sized_over_the_whole_limit_is_not_run(monkeypatch):
    """It would wait until every other job had ended, then fail on the limit: KD504 at once,
    with the size and the limit."""
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic import kernels, problem_sizing
    from kaudit.dynamic.options import DynamicOptions
    from tests.conftest import DYNAMIC_FIXTURES

    monkeypatch.setattr(kernels, "SIZED_DEVICES", ("cpu",))
    sized = problem_sizing.ProblemSize(0, 20 << 30, 4 << 30, 8 << 30)  # a level-1 problem's
    monkeypatch.setattr(problem_sizing.sizes, "size", lambda path, seed: sized)
    ran = []
    monkeypatch.setattr(kernels, "run_job", lambda job: ran.append(job) or None)
    scratch.start_budget(30 << 30)
    try:
        kernel = DYNAMIC_FIXTURES / "good_pytorch_linear" / "kernel.py"
        run = kernels.audit_kernel(str(kernel), "kernel.py", kernel.read_text(),
                                   DynamicOptions(device="cpu", timeout=240), "cpu")
    finally:
        scratch.start_budget(0)
    assert ran == [] and run.status == "incomplete"
    [finding] = run.findings
    assert finding.rule == "KD504" and "--temp-limit" in finding.message
    assert finding.metrics["estimate_bytes"] == problem_sizing.reference_writes(sized, 2)
    assert finding.metrics["limit_bytes"] == 30 << 30


SIZED_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, table):
        super().__init__()
        self.register_buffer("table", table.clone())

    def forward(self, x):
        x.mul_(2)  # changes its input, as an `out=` buffer would
        return torch.fft.fft(x)  # a complex output: its float64 twin is complex128


def get_inputs():
    return [torch.randn(256, 512)]


def get_init_inputs():
    return [torch.randn(128, 128)]
"""


def test_the_sized_estimate_covers_what_the_reference_job_writes(tmp_path):
    """Ground truth: the files of a real reference job. A problem whose forward changes its
    input (saved again after forward), with a complex output (a complex128 twin) and a tensor
    among its init inputs (saved in init.pt) was under-reserved by a sixth."""
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic import problem_sizing
    from kaudit.dynamic.kernels import REFERENCE_TARGET

    problem = tmp_path / "problem.py"
    problem.write_text(SIZED_PROBLEM)
    size = problem_sizing.size_problems([str(problem)], 42)[str(problem)]
    assert size is not None and size.inputs_changed and size.twins == 256 * 512 * 16
    assert size.init == 128 * 128 * 4
    estimate = problem_sizing.reference_writes(size, 2)
    job = Job(REFERENCE_TARGET, {"problem": str(problem), "device": "cpu", "init_seed": 42,
                                 "seeds": [0, 1], "scales": [1e-3, 1e3]},
              timeout=120, visible=(str(tmp_path),))
    with run_job(job) as result:
        assert result.ok, result.describe()
        written = sum(result.path(name).stat().st_size for name in result.files())
    assert written <= estimate <= 1.05 * written


def test_a_problem_that_cannot_be_sized_is_none_and_a_failed_sizing_is_tried_again(
        monkeypatch, tmp_path):
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic import problem_sizing

    unsized = tmp_path / "problem.py"
    unsized.write_text("raise ImportError('no such module')\n")
    assert problem_sizing.size_problems([str(unsized)], 42) == {str(unsized): None}
    calls = []
    real = problem_sizing.size_problems
    monkeypatch.setattr(problem_sizing, "size_problems",
                        lambda paths, seed: calls.append(paths) or (
                            {} if len(calls) == 1 else real(paths, seed)))
    memo = problem_sizing.SizeMemo()
    assert memo.size(str(unsized), 42) is None  # the job failed: not remembered
    assert memo.size(str(unsized), 42) is None and memo.size(str(unsized), 42) is None
    assert len(calls) == 2, "unsizable is remembered; a failed job is not"


def test_a_forged_sizing_answer_sizes_nothing_it_was_not_asked(monkeypatch):
    """The sizing job runs problem code, and a record-based tree (CUDA-L1, JSONL) supplies that
    code: its answer may be forged. Only the paths asked are read, and only non-negative
    integers; anything else leaves the problem unsized (no reservation, as before sizing)."""
    from kaudit.dynamic import problem_sizing

    asked = "/problems/a.py"
    forged = {"sizes": {
        asked: {"params": True, "inputs": -5, "outputs": "1e12", "twins": 1.5},
        "/elsewhere/b.py": {"params": 0, "inputs": 1, "outputs": 1, "twins": 1},
        "/problems/c.py": "not a record"}}
    monkeypatch.setattr(problem_sizing, "run_job",
                        lambda job: RunResult(OK, value=forged))
    assert problem_sizing.size_problems([asked, "/problems/c.py"], 42) == {
        asked: None, "/problems/c.py": None}
    forged["sizes"][asked] = {"params": 0, "inputs": 8, "outputs": -1, "twins": 4,
                              "inputs_changed": "yes"}
    size = problem_sizing.size_problems([asked], 42)[asked]
    assert size == problem_sizing.ProblemSize(0, 8, None, None, 0, False)
    assert problem_sizing.reference_writes(size, 2) == 0
