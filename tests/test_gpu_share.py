"""GPU memory shared by concurrent jobs and kaudit processes (`kaudit.dynamic.gpu_share`) and
kaudit's own memory held by audits (`host_memory`); the temporary disk is test_scratch.py's.
No GPU: the lock protocol runs between real processes, and out-of-memory failures are simulated
by jobs (or a fake launcher) that report one."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kaudit.dynamic import (gpu_share, host_memory, problem_sizing, problems, runner, sandbox,
                            scratch)
from kaudit.dynamic.gpu_share import GPU_MEMORY_SHARE, WIDE_SHARE, GpuClaim, GpuMemory
from kaudit.dynamic.problem_sizing import SIZES_TARGET
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
        self.lane_jobs: list[int] = []  # what the timing lane counts as running then

    def __call__(self, job: Job) -> RunResult:
        self.fractions.append(job.args["gpu_memory_fraction"])
        self.alone.append(not shared_lock_free())
        self.lane_jobs.append(gpu_share.lane("0").jobs)
        status = self.statuses.pop(0)
        return RunResult(status, error="CUDA out of memory" if status == OOM else "",
                         wall_s=2.0)


def test_an_out_of_memory_failure_runs_again_wider_then_alone_on_the_gpu():
    launch = FakeLaunch(OOM, OOM, OK)
    result = gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.1), launch)
    assert result.ok and result.retried_alone
    assert launch.alone == [False, False, True], "only the last run holds the exclusive lock"
    assert launch.fractions == [0.1, WIDE_SHARE, GPU_MEMORY_SHARE], \
        "its share, then half of the process's part, then alone and not capped to a share"
    assert result.gpu_runs == 3, "every run is counted, the failed ones too"
    assert result.gpu_retry_s == 4.0, "the two runs that ran out, thrown away"
    assert launch.lane_jobs[:2] == [1, 1], "a timing job's batch waits for runs beside others"
    assert gpu_share.lane("0").jobs == 0


def test_a_timing_job_runs_once_alone_in_its_lane_outside_the_ledger():
    launch = FakeLaunch(OOM)
    with gpu_share.ledger("0").reserve(GPU_MEMORY_SHARE):  # the process's share all held
        result = gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.1, need=0.01, alone=True),
                                       launch)
    assert launch.alone == [True], "the lane held the exclusive lock while it ran"
    assert launch.fractions == [GPU_MEMORY_SHARE], "capped only by what is free"
    assert not result.ok and result.gpu_runs == 1, "alone already: never run again"
    assert launch.lane_jobs == [0], "a timing job is not another job its lane waits for"
    assert result.held_gpu_alone, "the measurement is marked as timed alone"
    assert gpu_share.lane("0").batches[-1] == 1


def test_without_a_lock_folder_a_timing_job_is_not_marked_as_alone(monkeypatch):
    """Its lane then only runs timing jobs one at a time: other jobs may run beside them, so
    KD701 keeps its check of the fastest trials."""
    monkeypatch.setattr(gpu_share, "lock_folder", lambda: None)
    result = gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.1, alone=True),
                                   lambda job: RunResult(OK))
    assert result.ok and not result.held_gpu_alone


def test_a_job_that_fits_in_the_wider_cap_does_not_empty_the_gpu():
    launch = FakeLaunch(OOM, OK)
    result = gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.1), launch)
    assert result.ok and not result.retried_alone and result.gpu_runs == 2
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


class FakeGatedLaunch(FakeLaunch):
    """A gated job's process: started before its GPU memory is granted, it takes its cap
    through the gate, which holds the GPU's lock until it ends."""

    def __init__(self, *statuses: str) -> None:
        super().__init__(*statuses)
        self.started_unlocked: list[bool] = []

    def __call__(self, job: Job, gate) -> RunResult:
        assert "gpu_memory_fraction" not in job.args, "the cap comes through the gate"
        self.started_unlocked.append(shared_lock_free())
        with gate() as granted:
            return super().__call__(dataclasses.replace(job, args={**job.args, **granted}))


def test_a_gated_job_starts_before_its_memory_is_granted():
    """The problem job starts and makes its CUDA context while it waits for memory; the ladder
    and the lock are as for any job."""
    launch = FakeGatedLaunch(OOM, OK)
    result = gpu_share.run_claimed(Job("x:y", gated=True), GpuClaim("0", 0.1), launch)
    assert result.ok and result.gpu_runs == 2
    assert launch.started_unlocked == [True, True], "each run started before it took the lock"
    assert launch.alone == [False, False] and launch.fractions == [0.1, WIDE_SHARE]


@pytest.mark.parametrize("fork_server", ["1", "0"])
def test_a_gated_job_waits_for_its_gate_and_holds_it_until_it_ends(monkeypatch, fork_server):
    """A real problem job (on the CPU), forked by the fork server or in a fresh interpreter: it
    goes on only once the gate is entered, and the gate is left only after the job ended."""
    pytest.importorskip("torch", reason="the problem job needs torch")
    monkeypatch.setenv("KAUDIT_FORKSERVER", fork_server)
    import contextlib

    entered, left = [], []

    @contextlib.contextmanager
    def gate():
        time.sleep(0.5)  # the job, started, waits meanwhile
        entered.append(time.monotonic())
        yield {}
        left.append(time.monotonic())

    job = Job(problems.JOB_TARGET, {
        "path": str(ROOT / "fixtures" / "problems" / "good_matmul.py"), "device": "cpu",
        "seeds": [0], "init_seed": 42, "scales": []}, timeout=120, gated=True)
    with runner._run_once(job, gate) as result:
        ended = time.monotonic()
        assert result.ok, result.describe()
        timings = result.value["timings"]
        assert "go" in timings, "it went through the wait"
        if fork_server == "1":  # a fresh interpreter may still be importing torch at 0.5 s
            assert timings["go"] >= 0.2, "it waited for the gate"
        assert left[0] <= ended
        assert left[0] - entered[0] >= timings["forward"] + timings["save"], \
            "held while the job ran"
        assert not (result.root / runner.GATE_FOLDER / runner.GO_FILE).exists(), \
            "gone with the gate: a job started again waits for it again"


def test_a_gated_job_whose_fork_server_died_runs_again_through_a_fresh_gate(monkeypatch):
    """The fork server died with the job after the gate was entered: the job runs again in a
    fresh interpreter, and its memory and lock are taken again for it (not entered twice)."""
    pytest.importorskip("torch", reason="the problem job needs torch")
    from kaudit.dynamic import forkserver

    real_wait, waits = forkserver._Pending.wait, []

    def dies_once(self, server, timeout):
        # the job ends first: a child killed before the server forked it could still read
        # (and remove) the spec that the fresh interpreter is given
        ended = real_wait(self, server, timeout)
        waits.append(ended)
        if len(waits) == 1:
            raise forkserver.Unavailable("the fork server died (simulated)")
        return ended

    monkeypatch.setattr(forkserver._Pending, "wait", dies_once)
    job = Job(problems.JOB_TARGET, {
        "path": str(ROOT / "fixtures" / "problems" / "good_matmul.py"), "device": "cpu",
        "seeds": [0], "init_seed": 42, "scales": []}, timeout=120, gated=True)
    result = gpu_share.run_claimed(job, GpuClaim("0", 0.1), runner._run_once)
    assert result.ok, result.describe()
    assert len(waits) == 1, "then a fresh interpreter"
    assert gpu_share.ledger("0").held == 0 and shared_lock_free(), "all given back"


def test_the_go_file_is_never_written_through_what_the_job_left(tmp_path):
    """Without the sandbox a job may have put a link or a FIFO where the go file goes: neither
    is written through nor blocks kaudit, and the file is gone with the gate."""
    import contextlib

    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    folder = tmp_path / "gate"
    folder.mkdir()
    (folder / runner.GO_FILE).symlink_to(victim)
    os.mkfifo(folder / f".{runner.GO_FILE}")

    @contextlib.contextmanager
    def gate():
        yield {"gpu_memory_fraction": 0.25}

    with runner._go(gate, folder):
        go = folder / runner.GO_FILE
        assert not go.is_symlink() and go.read_text() == '{"gpu_memory_fraction": 0.25}'
    assert victim.read_text() == "untouched" and not os.path.lexists(folder / runner.GO_FILE)


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
    with runner.job_seconds() as seconds, run_job(Job(f"{jobs}:needs_the_whole_gpu", timeout=60,
                                                      gpu=GpuClaim("3", 0.45))) as result:
        assert result.ok, result.describe()
        assert result.retried_alone
        assert result.value == {"fraction": GPU_MEMORY_SHARE, "gpu": "3"}
    assert 0 < seconds["gpu_retry"] == result.gpu_retry_s < seconds["needs_the_whole_gpu"], \
        "the run that ran out is counted apart: where the audit's time went"
    with run_job(Job(f"{jobs}:wrong", timeout=60, gpu=GpuClaim("3", 0.45))) as result:
        assert result.status == ERROR and not result.retried_alone


def test_a_timing_jobs_wait_for_its_turn_alone_is_counted_apart(jobs):
    with runner.job_seconds() as seconds, run_job(Job(
            f"{jobs}:needs_the_whole_gpu", timeout=60, gpu=GpuClaim("3", 0.1, alone=True))) \
            as result:
        assert result.ok and result.value["fraction"] == GPU_MEMORY_SHARE, "what is free"
    assert "timing_wait" in seconds and "gpu_wait" not in seconds, seconds


@pytest.fixture
def problems_on_a_fake_gpu(monkeypatch):
    """`kaudit problems` believing it runs on CUDA device 0; each job actually runs on the CPU.
    `launches` records whether each job held the GPU alone; `fail` how many launches report
    running out of memory before the real job runs."""
    monkeypatch.setattr(problems, "resolve_device", lambda requested: "cuda")
    monkeypatch.setattr(gpu_share, "visible_gpus", lambda: ["0"])
    real = runner._run_once
    state = {"fail": 0, "launches": []}

    def launch(job: Job, gate=None) -> RunResult:
        assert job.gated and gate is not None, "a problem's job waits for its memory, started"
        with gate() as granted:
            state["launches"].append(not shared_lock_free())
            if len(state["launches"]) <= state["fail"]:
                return RunResult(OOM, phase="forward", error_type="OutOfMemoryError",
                                 error="CUDA out of memory. Tried to allocate 2.00 MiB")
            result = real(dataclasses.replace(job, args={**job.args, **granted, "device": "cpu"}))
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
    assert problem.gpu_runs == 2 and stream_line(problem)["gpu_runs"] == 2


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


def test_a_problem_is_judged_while_the_next_one_runs_on_the_gpu(problems_on_a_fake_gpu,
                                                                monkeypatch):
    """With one job at a time, the second problem's job starts while the first is judged (on
    the CPU): the GPU does not wait for judging."""
    from kaudit.dynamic.tolerance import resolve

    launches, real_analyse, overlapped = problems_on_a_fake_gpu["launches"], problems.analyse, []

    def analyse(*args, **kwargs):
        if not overlapped:  # the first problem judged waits for the next one's job to start
            deadline = time.monotonic() + 60
            while len(launches) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            overlapped.append(len(launches) >= 2)
        return real_analyse(*args, **kwargs)

    monkeypatch.setattr(problems, "analyse", analyse)
    other = ROOT / "fixtures" / "problems" / "bad_tiny_output.py"
    report = problems.audit_problems([str(PROBLEM), str(other)], problems.Options(
        resolve(None, None, None), jobs=1, seeds=2, timeout=120))
    assert overlapped == [True]
    assert [p.status for p in report.problems] == ["ok", "ok"]


def test_a_problems_job_starts_before_its_turn_and_takes_it_in_its_gate(problems_on_a_fake_gpu,
                                                                       monkeypatch):
    """With one job at a time, the next problem's job is started (its process and CUDA context
    made: 1.7 s a job on the H200) while another holds the turn, and runs once it has it."""
    import contextlib

    from kaudit.dynamic.tolerance import resolve

    fake, lock = runner._run_once, threading.Lock()
    now, most = {"started": 0, "turns": 0}, {"started": 0, "turns": 0}

    def count(key: str, step: int) -> None:
        with lock:
            now[key] += step
            most[key] = max(most[key], now[key])

    def launch(job: Job, gate=None) -> RunResult:
        @contextlib.contextmanager
        def counted():
            with gate() as granted:
                count("turns", 1)
                try:
                    yield granted
                finally:
                    count("turns", -1)

        count("started", 1)
        try:
            return fake(job, counted)
        finally:
            count("started", -1)

    monkeypatch.setattr(runner, "_run_once", launch)
    files = [str(ROOT / "fixtures" / "problems" / name) for name in
             ("good_matmul.py", "bad_tiny_output.py", "bad_naive_softmax.py")]
    report = problems.audit_problems(files, problems.Options(resolve(None, None, None), jobs=1,
                                                             seeds=2, timeout=120))
    assert [p.status for p in report.problems] == ["ok"] * 3
    assert most == {"started": 2, "turns": 1}


def test_each_gpu_has_its_own_turns(problems_on_a_fake_gpu, monkeypatch):
    """A job started ahead on one GPU waits for that GPU's turn, not for any turn: with two GPUs
    and two jobs, each GPU runs one job at a time and both are used."""
    import collections
    import contextlib

    from kaudit.dynamic.tolerance import resolve

    monkeypatch.setattr(gpu_share, "visible_gpus", lambda: ["0", "1"])
    fake, lock = runner._run_once, threading.Lock()
    now, most = collections.Counter(), collections.Counter()

    def launch(job: Job, gate=None) -> RunResult:
        device = job.env["CUDA_VISIBLE_DEVICES"]

        @contextlib.contextmanager
        def counted():
            with gate() as granted:
                with lock:
                    now[device] += 1
                    most[device] = max(most[device], now[device])
                try:
                    yield granted
                finally:
                    with lock:
                        now[device] -= 1

        return fake(job, counted)

    monkeypatch.setattr(runner, "_run_once", launch)
    files = [str(ROOT / "fixtures" / "problems" / name) for name in
             ("good_matmul.py", "bad_tiny_output.py", "bad_naive_softmax.py", "bad_nan_output.py")]
    report = problems.audit_problems(files, problems.Options(resolve(None, None, None), jobs=2,
                                                             seeds=2, timeout=120))
    assert all(p.status == "ok" for p in report.problems), [p.error for p in report.problems]
    assert most == {"0": 1, "1": 1}


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
    assert result.ok and launch.fractions == [0.3] and result.gpu_runs == 1
    larger = FakeLaunch(OOM, OK)
    assert gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.1, need=2.0), larger).ok
    assert larger.fractions == [WIDE_SHARE, GPU_MEMORY_SHARE] and larger.alone == [False, True]
    small = FakeLaunch(OOM, OOM, OK)
    assert gpu_share.run_claimed(Job("x:y"), GpuClaim("0", 0.1, need=0.01), small).ok
    assert small.fractions == [0.01, 0.02, WIDE_SHARE], \
        "a small need asks what it needs, not its share; twice that when it ran out"
    assert not small.alone[-1]


def test_a_kernels_jobs_ask_first_for_what_its_problem_is_sized_to_need(monkeypatch):
    """`scan --dynamic`: each job held 0.9 / -j of the GPU in the ledger, so a job of a large
    problem ran out at it, ran wide, waited for half of its neighbours to end, and all after
    it waited behind it."""
    pytest.importorskip("torch", reason="the sizing job needs torch")
    from kaudit.dynamic import kernels

    total = 141 << 30  # an H200
    monkeypatch.setattr(kernels, "gpu_memory", lambda device: GpuMemory("GPU-a", total, total))
    folder = ROOT / "fixtures" / "problems"
    claim = GpuClaim("0", GPU_MEMORY_SHARE / 14)
    size = problem_sizing.sizes.size(str(folder / "good_matmul.py"), 42)
    kernels.size_claim(claim, size, 2)
    assert size is not None
    assert claim.need == pytest.approx(problem_sizing.audit_gpu_need(size, 2, total))
    assert claim.need > problem_sizing.gpu_need(size, total), \
        "the candidate holds more than the problem's job: two models, every input set, guards"
    assert claim.need < claim.share / 2, "a small problem leaves its neighbours the rest"
    unsized = GpuClaim("0", GPU_MEMORY_SHARE / 14)
    kernels.size_claim(unsized, problem_sizing.sizes.size(str(folder / "bad_raises_in_init.py"),
                                                          42), 2)
    assert unsized.need is None, "a problem that cannot be sized keeps the even share"


def test_the_candidates_peak_holds_both_models_and_every_input_set():
    """Four of 14 warm audits on the H200 ran out at their problem job's need: the candidate
    job holds a poisoned model beside the plain one, with what its forward allocates kept alive
    as guarded blocks, and every input set on the device."""
    from kaudit.dynamic.harness.poison import GUARD_BUDGET_BYTES
    from kaudit.dynamic.problem_sizing import ProblemSize, candidate_peak, job_peak

    gib = 1 << 30
    large = ProblemSize(params=4 * gib, inputs=gib, outputs=gib, forward=2 * gib)
    assert candidate_peak(large, 2) >= 2 * 4 * gib + 6 * gib + 2 * gib, \
        "two models, six input sets, forward's allocations"
    assert candidate_peak(large, 2) - candidate_peak(large, 0) == 2 * gib, "a set per scale"
    small = ProblemSize(params=0, inputs=1 << 20, outputs=1 << 20, forward=1 << 20)
    assert candidate_peak(small, 2) > GUARD_BUDGET_BYTES > job_peak(small), \
        "a small problem's poisoned run may keep the guard budget's worth of blocks"


def test_an_audit_reports_what_its_jobs_asked_and_its_candidate_held(monkeypatch):
    from types import SimpleNamespace

    from kaudit.dynamic import kernels
    from kaudit.dynamic.problem_sizing import ProblemSize

    total = 141 << 30
    monkeypatch.setattr(kernels, "gpu_memory", lambda device: GpuMemory("GPU-a", total, total))
    claim = GpuClaim("0", GPU_MEMORY_SHARE / 14)
    need = kernels.size_claim(claim, ProblemSize(0, 1 << 20, 1 << 20), 2)
    assert need == int(claim.need * total)
    metrics: dict = {}
    kernels.gpu_memory_metrics(metrics, need, SimpleNamespace(value={"gpu_peak_bytes": 5 << 20}))
    assert metrics["gpu_memory"] == {"need_bytes": need, "candidate_peak_bytes": 5 << 20}
    # the kernel's process reports its peak: anything but a number is left out
    kernels.gpu_memory_metrics(metrics, None, SimpleNamespace(value={"gpu_peak_bytes": "9e99"}))
    assert metrics["gpu_memory"] == {"need_bytes": None, "candidate_peak_bytes": None}


def test_a_gpu_whose_memory_is_unknown_keeps_the_even_share(monkeypatch):
    from kaudit.dynamic import kernels
    from kaudit.dynamic.problem_sizing import ProblemSize

    monkeypatch.setattr(kernels, "gpu_memory", lambda device: None)  # no nvidia-smi, a MIG entry
    claim = GpuClaim("0", GPU_MEMORY_SHARE / 14)
    kernels.size_claim(claim, ProblemSize(0, 1 << 20, 1 << 20), 2)
    assert claim.need is None and claim.share == GPU_MEMORY_SHARE / 14


def test_problems_are_sized_on_the_meta_device_before_they_run(monkeypatch):
    pytest.importorskip("torch", reason="the sizing job needs torch")
    total = 100 << 30
    monkeypatch.setattr(problems, "visible_gpus", lambda: ["0"])
    monkeypatch.setattr(problems, "gpu_memory", lambda device: GpuMemory("GPU-a", total, total))
    folder = ROOT / "fixtures" / "problems"
    files = [str(folder / "good_matmul.py"), str(folder / "bad_raises_in_init.py")]
    from kaudit.dynamic.tolerance import PRESETS

    sized = []
    real_size = problems.size_problems
    monkeypatch.setattr(problems, "size_problems",
                        lambda paths, *args: sized.append(paths) or real_size(paths, *args))
    sizes = problems.gpu_sizes(files, problems.Options(PRESETS["kernelbench"], device="cuda"))
    assert sized == [files], "one sizing job for all: most of its time is its start"
    # a (64, 128) and a (128, 64) float32 input, a (64, 64) output, no parameters: at most, the
    # float64 run's inputs beside a native input being cast to float64 (larger than its output)
    inputs = 2 * 64 * 128 * 4
    expected = (problem_sizing.PEAK_MARGIN * (2 * inputs + inputs)
                + problem_sizing.FIXED_BYTES) / total
    assert list(sizes) == [files[0]], "a problem that cannot be sized is left out"
    assert sizes[files[0]].need == pytest.approx(expected)
    assert sizes[files[0]].flops == 2 * 64 * 128 * 64, "one matmul's multiply-adds, twice"


def test_a_problems_peak_is_what_its_job_holds_at_once():
    """From KernelBench level 1 on the H200, where the job's caching allocator held exactly
    these: ReLU (a 6 GiB input and output) 24 GiB, Swish (a sigmoid beside its product) 36,
    2D average pooling (a 16 GiB input, a small output) 48, each in its float64 run."""
    from kaudit.dynamic.problem_sizing import ProblemSize

    gib = 1 << 30

    def elementwise(made: int) -> ProblemSize:
        return ProblemSize(0, 6 * gib, 6 * gib, forward=made * gib, params64=0,
                           inputs64=12 * gib, forward64=2 * made * gib)

    assert problem_sizing.job_peak(elementwise(6)) == 24 * gib
    assert problem_sizing.job_peak(elementwise(12)) == 36 * gib
    pooling = ProblemSize(0, 16 * gib, gib // 8, forward=gib // 8, params64=0,
                          inputs64=32 * gib, forward64=gib // 4)
    assert problem_sizing.job_peak(pooling) == 48 * gib, "a native input beside its float64 cast"
    # no float64 run sized: the native runs' inputs, a scaled copy, or what forward makes
    assert problem_sizing.job_peak(ProblemSize(gib, 6 * gib, 6 * gib, forward=9 * gib)) == 16 * gib
    assert problem_sizing.job_peak(ProblemSize(0, 6 * gib, None)) == 12 * gib


def test_problems_start_with_the_most_memory_and_work():
    """Ordered by memory alone, KernelBench level 1's slowest problem (little memory, much
    work) started late and ran alone at the end."""
    sizes = {"/p/big.py": problems.GpuSize(0.4, 10), "/p/slow.py": problems.GpuSize(0.05, 10**12),
             "/p/small.py": problems.GpuSize(0.05, 10), "/p/both.py": problems.GpuSize(0.3, 10**11)}
    files = ["/p/small.py", "/p/unsized.py", "/p/slow.py", "/p/both.py", "/p/big.py"]
    assert [files[i] for i in problems.start_order(files, sizes)] == [
        "/p/slow.py", "/p/big.py", "/p/both.py", "/p/small.py", "/p/unsized.py"]
    assert problems.start_order(files, {}) == [0, 1, 2, 3, 4], "unsized: in the files' order"


def test_the_sizing_job_starts_while_kaudit_prepares_and_sizes_once_let_go(monkeypatch):
    """`kaudit problems` starts its sizing job before its own preload (`audit_problems`'s
    `before_jobs`): the job makes the meta device ready meanwhile (3.5 s on the H200's host),
    waits, and sizes once let go; refused (kaudit stopping), it is stopped and sizes nothing."""
    pytest.importorskip("torch", reason="the sizing job needs torch")
    import contextlib

    total = 100 << 30
    monkeypatch.setattr(problems, "visible_gpus", lambda: ["0"])
    monkeypatch.setattr(problems, "gpu_memory", lambda device: GpuMemory("GPU-a", total, total))
    files = [str(ROOT / "fixtures" / "problems" / "good_matmul.py")]
    from kaudit.dynamic.tolerance import PRESETS

    options = problems.Options(PRESETS["kernelbench"], device="cuda")
    answers = []
    real_size = problems.size_problems

    def size(*args):
        try:
            answers.append(real_size(*args))
        except Exception as exc:
            answers.append(exc)
            raise
        return answers[-1]

    monkeypatch.setattr(problems, "size_problems", size)
    early = problems.EarlySizing(files, options)
    time.sleep(0.5)  # kaudit's preload
    assert early.allow() == problems.gpu_sizes(files, options)
    assert early.seconds >= 0.5
    problems.EarlySizing(files, options).refuse()
    assert isinstance(answers[-1], problems.JobsRefused), "stopped, nothing sized"

    @contextlib.contextmanager
    def gate():
        time.sleep(0.5)
        yield {}

    def broken(*args, **kwargs):
        raise RuntimeError("the fork server could not start")

    monkeypatch.setattr(problems, "gpu_sizes", broken)
    with pytest.raises(RuntimeError, match="could not start"):
        problems.EarlySizing(files, options).allow()  # in the audit's thread, not the sizing's
    problems.EarlySizing(files, options).refuse()  # kaudit stopping: nothing more said

    job = Job(SIZES_TARGET, {"paths": files, "init_seed": 42}, timeout=120, gated=True)
    with runner.run_job(job, gate) as result:
        assert result.ok and list(result.value["sizes"]) == files, result.describe()
        assert {"warm-up", "go", "size"} <= set(result.phases)
