"""The scan's bounded temporary disk (`kaudit.dynamic.scratch`): jobs charged when they end,
audits that reserve what they will write before their first job (`scratch.reserve`), problems
sized on the meta device to know it (`problem_sizing`), and a problem's inputs written once and
shared read-only (`runner.share_inputs`)."""

from __future__ import annotations

import dataclasses
import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kaudit.dynamic import host_memory, runner, sandbox, scratch
from kaudit.dynamic.ledger import Ledger
from kaudit.dynamic.runner import ERROR, OK, Job, RunResult, run_job

ROOT = Path(__file__).resolve().parents[1]

JOBS = '''
import os

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
def no_limit_after():
    """No limit, nor a waiting reservation, left for the next test."""
    yield
    scratch.start_budget(0)


@pytest.fixture
def jobs(tmp_path) -> Iterator[Path]:
    """The job functions above, a file of the test's folder: run without the sandbox."""
    (tmp_path / "jobs.py").write_text(JOBS)
    sandbox.set_mode("off")
    yield tmp_path / "jobs.py"
    sandbox.set_mode("auto")


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



def test_audits_that_say_what_they_write_wait_for_room_instead_of_failing(jobs):
    """Folders are measured when their jobs end: two jobs that each write 5 MiB at once under an
    8 MiB limit both finished over it. Reserving first, the second audit waits for the first."""
    from concurrent.futures import ThreadPoolExecutor

    scratch.start_budget(8 << 20)

    def audit(_: int) -> tuple[bool, str, float]:
        disk, waited = scratch.reserve(5 << 20)
        try:
            with run_job(Job(f"{jobs}:write", {"files": 5, "bytes": 1 << 20}, timeout=60,
                             disk=disk)) as result:
                time.sleep(0.5)  # its result stays open a while, as a judged kernel's does
                return result.ok, result.describe(), waited
        finally:
            scratch.release(disk)

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(audit, range(2)))
    assert all(ok for ok, _, _ in outcomes), [why for _, why, _ in outcomes]
    waits = sorted(waited for _, _, waited in outcomes)
    assert waits[0] < 0.1 and waits[1] >= 0.4, "the second waited for the first's result"
    assert scratch.left() == 8 << 20, "every reservation and folder given back"


def test_an_audits_own_folders_fill_its_reservation_and_are_not_counted_twice(jobs):
    """On the H200 an audit's shared inputs counted as held and its reservation as reserved: its
    later jobs started with no room left (a 1 MiB cap) and failed on the limit (KD504)."""
    scratch.start_budget(10 << 20)
    disk, _ = scratch.reserve(8 << 20)
    try:
        with run_job(Job(f"{jobs}:write", {"files": 3, "bytes": 1 << 20}, timeout=60,
                         disk=disk)) as inputs:  # as a reference job's kept inputs
            assert inputs.ok
            room = scratch.left(disk)
            assert (6 << 20) < room <= 7 << 20, "all but its own 3 MiB (and the job's files)"
            with run_job(Job(f"{jobs}:write", {"files": 4, "bytes": 1 << 20}, timeout=60,
                             disk=disk)) as candidate:
                assert candidate.ok, candidate.describe()
                # its 7 MiB on disk are within its 8 reserved: 2 MiB are left beside it
                beside: list = []
                asking = threading.Thread(
                    target=lambda: beside.append(scratch.reserve(2 << 20)[0]), daemon=True)
                asking.start()
                asking.join(5)
                assert beside, "the audit's folders were counted beside its reservation"
                scratch.release(beside[0])
    finally:
        scratch.release(disk)
    assert scratch.left() == 10 << 20


def test_a_reserved_audits_job_gets_the_rest_of_its_reservation_whatever_others_wrote(jobs):
    """An audit whose problem could not be sized reserves nothing: its folders fill the limit
    without asking. The reserved audit's next job still gets what it reserved (on the H200 it
    got a 1 MiB cap and failed on the limit)."""
    scratch.start_budget(8 << 20)
    disk, _ = scratch.reserve(4 << 20)
    try:
        with run_job(Job(f"{jobs}:write", {"files": 6, "bytes": 1 << 20}, timeout=60)) as unsized:
            assert unsized.ok, "6 MiB of the 8: within the limit"
            assert scratch.left(disk) == 4 << 20, "its whole reservation"
            with run_job(Job(f"{jobs}:write", {"files": 1, "bytes": 3 << 20}, timeout=60,
                             disk=disk)) as reserved:
                assert reserved.ok, reserved.describe()
    finally:
        scratch.release(disk)


def test_a_job_within_its_audits_reservation_is_not_failed_for_anothers_excess(jobs):
    """An audit whose problem was sized too small writes past its reservation and takes the
    total over the limit: its job fails on the limit, the other audit's job within its own
    reservation does not."""
    scratch.start_budget(8 << 20)
    small, _ = scratch.reserve(1 << 20)
    honest, _ = scratch.reserve(4 << 20)
    try:
        with run_job(Job(f"{jobs}:write", {"files": 2, "bytes": 1 << 20}, timeout=60,
                         disk=honest)) as inputs:
            assert inputs.ok, inputs.describe()
            with run_job(Job(f"{jobs}:write", {"files": 7, "bytes": 1 << 20}, timeout=60,
                             disk=small)) as over:
                assert over.errno == errno.EDQUOT, over.describe()
                assert scratch.over_limit(), "its 7 MiB beside the 2 are over the 8 MiB limit"
                with run_job(Job(f"{jobs}:write", {"files": 1, "bytes": 1 << 19}, timeout=60,
                                 disk=honest)) as later:
                    assert later.ok, later.describe()
    finally:
        scratch.release(small)
        scratch.release(honest)
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
    """A job of an audit that reserved nothing (its problem could not be sized) is not failed,
    nor its files capped, for room others only reserved."""
    scratch.start_budget(10 << 20)
    try:
        held, _ = scratch.reserve(12 << 20)  # more than the limit: granted, no one else reserved
        with run_job(Job(f"{jobs}:write", {"files": 3, "bytes": 1 << 20}, timeout=60)) as result:
            assert result.ok, result.describe()
        assert scratch.usage()["peak_bytes"] < 5 << 20, "the peak is what was on disk"
        scratch.release(held)
    finally:
        scratch.start_budget(0)


def reserve_later(nbytes: int) -> tuple[threading.Thread, list]:
    """An audit asking `nbytes` on a thread of its own; the list gets its reservation (the
    thread waits on, if need be, until the test's budget is replaced)."""
    granted: list = []
    asking = threading.Thread(target=lambda: granted.append(scratch.reserve(nbytes)[0]),
                              daemon=True)
    asking.start()
    return asking, granted


def reserve_soon(nbytes: int, seconds: float = 0.5) -> scratch.Reservation | None:
    """The reservation, if granted within `seconds`."""
    asking, granted = reserve_later(nbytes)
    asking.join(seconds)
    return granted[0] if granted else None


def test_small_audits_go_before_a_large_one_waiting_within_their_share():
    """On the H200 every audit queued behind level-1 problems of 20 to 50 GiB, each writing and
    reading its outputs alone while the CPU sat idle. Small audits (a 64th of the limit) now
    start beside a large one waiting, while the small ones hold at most an eighth."""
    scratch.start_budget(64 << 20)
    running = reserve_soon(40 << 20)
    large, waiting = reserve_later(40 << 20)
    time.sleep(0.2)
    assert not waiting, "no room for a second large audit"
    small = [reserve_soon(512 << 10) for _ in range(16)]
    assert all(small), "small audits start beside the large one waiting"
    assert reserve_soon(512 << 10) is None, "beyond their share of 8 MiB they wait in line"
    assert reserve_soon(2 << 20) is None, "an audit over a 64th of the limit is not small"
    scratch.release(running)
    large.join(5)
    assert waiting and waiting[0].nbytes == 40 << 20, "the large one goes next"
    for held in [*small, *waiting]:
        scratch.release(held)


def test_small_audits_go_before_a_waiting_one_a_bounded_number_of_times(monkeypatch):
    """A stream of small audits could otherwise keep the first in line waiting as long as it
    lasts."""
    monkeypatch.setattr(scratch, "MAX_OVERTAKES", 3)
    scratch.start_budget(64 << 20)
    running = reserve_soon(60 << 20)
    large, waiting = reserve_later(8 << 20)
    time.sleep(0.2)
    small = [reserve_soon(256 << 10) for _ in range(3)]
    assert all(small) and reserve_soon(256 << 10) is None, "the fourth waits its turn"
    scratch.release(running)
    large.join(5)
    assert waiting, "the large one goes first once there is room"


def test_an_audit_waiting_for_room_starts_when_a_folder_shrinks(jobs):
    """A folder measured again after files were removed (an audit's reference outputs, once
    loaded) makes room; an audit waiting for it was not told until something else changed."""
    scratch.start_budget(8 << 20)
    held = reserve_soon(1 << 20)
    with run_job(Job(f"{jobs}:write", {"files": 6, "bytes": 1 << 20}, timeout=60)) as unsized:
        asking, granted = reserve_later(3 << 20)
        asking.join(0.3)
        assert not granted, "6 MiB held and 1 reserved leave no room for 3 more"
        for index in range(5):
            unsized.path(f"blob{index}").unlink()
        scratch.charge(unsized.root)
        asking.join(2)
        assert granted, "the shrink made room at once"
    scratch.release(held)
    scratch.release(granted[0])


def test_shared_inputs_are_not_counted_twice_in_the_peak(jobs):
    """Moved out of the reference job's folder, the inputs were measured in their new folder
    before the old one was measured again: the peak counted them twice."""
    scratch.start_budget(64 << 20)
    with run_job(Job(f"{jobs}:write", {"files": 2, "bytes": 1 << 20}, timeout=60)) as reference:
        written = scratch.usage()["peak_bytes"]
        os.rename(reference.path("blob0"), reference.out_dir / "inputs_a.pt")
        shared = runner.share_inputs(reference, ["inputs_a.pt"])
        try:
            assert scratch.usage()["peak_bytes"] == written
        finally:
            scratch.remove(shared.folder)


def test_a_past_scans_reservation_is_none_in_the_next_scans_budget():
    """Two scans in one process: the first's audits are not given room the second reserved."""
    scratch.start_budget(100 << 20)
    past, _ = scratch.reserve(90 << 20)
    scratch.start_budget(100 << 20)
    current, _ = scratch.reserve(60 << 20)
    assert scratch.left(current) == 100 << 20, "alone in its scan's budget"
    assert scratch.left(past) == 100 << 20 and not scratch.within(past), \
        "treated as a job of no reservation: the limit less what is on disk"
    scratch.release(current)
    scratch.release(past)


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


def test_a_kernels_audit_reserves_the_disk_its_problem_is_sized_to_write(monkeypatch):
    """Reference jobs reserved nothing: on the H200 fourteen of them at once, up to 17.5 GiB
    each, filled the 64 GiB disk (KD504). The problem is now sized on the meta device (once per
    text), its audit reserves what its jobs hold at most, and gives that back when it ends."""
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic import kernels, problem_sizing
    from kaudit.dynamic.options import DynamicOptions
    from tests.conftest import DYNAMIC_FIXTURES

    problem = str(ROOT / "fixtures" / "problems" / "good_matmul.py")
    size = problem_sizing.size_problems([problem], 42)[problem]
    # (64, 128) and (128, 64) float32 inputs, one (64, 64) float32 output (one matmul), no
    # parameters; in the float64 run, each twice as large
    inputs, output = 2 * 64 * 128 * 4, 64 * 64 * 4
    assert size == problem_sizing.ProblemSize(0, inputs, output, output, flops=2 * 64 * 128 * 64,
                                              forward=output, params64=0, inputs64=2 * inputs,
                                              forward64=2 * output)
    # inputs A and B, the state, outputs A and B, and per other scale the float64 output, kept
    # in float32 for a float32 output
    assert problem_sizing.reference_writes(size, 2) == 2 * size.inputs + 2 * size.outputs + \
        2 * 4 * 64 * 64 + 7 * problem_sizing.SAVE_OVERHEAD
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
    expected = problem_sizing.audit_writes(linear_size, len(options.scales) - 1)
    assert expected > 0 and reserved == [expected, expected], reserved
    shared = 2 * linear_size.inputs + linear_size.params + linear_size.init
    assert expected == max(problem_sizing.reference_writes(linear_size, 2),
                           shared + problem_sizing.JOB_WRITES * linear_size.outputs)
    assert sized == [[str(linear)]], "one sizing job for the problem's text"
    assert scratch.left() == limit, "every reservation given back"
    scratch.start_budget(0)




def test_audits_start_with_the_least_disk_first(monkeypatch, tmp_path):
    """An audit waits for its disk holding one of the `--jobs` threads, first come first served:
    in the scan's order, on 80 real kernels on the H200, one audit of 48 GiB at the head of the
    queue kept 11-13 of 14 threads waiting for most of 9 minutes (13 audits ended). The problems
    are sized at once, by jobs side by side, and the audits start by the disk they will hold;
    a record (its problem in the results file) and an unpaired kernel count as none."""
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.discover import WorkItem
    from kaudit.dynamic import kernels, problem_sizing
    from kaudit.dynamic.kernels import KernelTask, least_disk_first
    from kaudit.dynamic.options import DynamicOptions
    from tests.conftest import DYNAMIC_FIXTURES

    monkeypatch.setattr(problem_sizing, "sizes", problem_sizing.SizeMemo())
    linear = DYNAMIC_FIXTURES / "good_pytorch_linear"
    tasks = []
    for index, rows in enumerate((4096, 32, 512)):
        folder = tmp_path / f"k{index}"
        folder.mkdir()
        (folder / "problem.py").write_text(
            (linear / "problem.py").read_text().replace("randn(32, 64)", f"randn({rows}, 64)"))
        (folder / "kernel.py").write_text((linear / "kernel.py").read_text())
        tasks.append(KernelTask(index, WorkItem(str(folder / "kernel.py"), f"k{index}", True),
                                "", None))
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "kernel.py").write_text("")
    tasks.append(KernelTask(3, WorkItem(str(alone / "kernel.py"), "alone", True), "", None))
    tasks.append(KernelTask(4, WorkItem(str(tmp_path / "r.jsonl"), "r.jsonl#L1", True,
                                        text="class ModelNew: pass"), "", None))
    asked = []
    real_size = problem_sizing.size_problems
    monkeypatch.setattr(problem_sizing, "size_problems", lambda paths, seed, **kw:
                        asked.append(sorted(paths)) or real_size(paths, seed, **kw))
    options = DynamicOptions(device="cuda")
    scratch.start_budget(1 << 40)
    try:
        assert [task.index for task in least_disk_first(tasks, options, "cuda")] == [3, 4, 1, 2, 0]
        assert asked == [sorted(str(tmp_path / f"k{i}" / "problem.py") for i in range(3))]
        assert least_disk_first(tasks, options, "cuda")[2].index == 1 and len(asked) == 1, \
            "sized once"
        assert least_disk_first(tasks, options, "cpu") == tasks, "no disk reserved: as found"
        scratch.start_budget(0)
        assert least_disk_first(tasks, options, "cuda") == tasks, "no limit: as found"
    finally:
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
    writes = problem_sizing.audit_writes(problem_sizing.size_problems([problem], 42)[problem], 2)
    scratch.start_budget(writes + (writes >> 1))  # one audit's reservation at a time
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


def test_an_audit_sized_over_the_whole_limit_is_not_run(monkeypatch):
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
    assert finding.metrics["estimate_bytes"] == problem_sizing.audit_writes(sized, 2)
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
        return torch.fft.fft(x)  # a complex64 output: its float64 twin is kept as complex64


def get_inputs():
    return [torch.randn(256, 512)]


def get_init_inputs():
    return [torch.randn(128, 128)]
"""


def test_the_sized_estimate_covers_what_the_reference_job_writes(tmp_path):
    """Ground truth: the files of a real reference job. A problem whose forward changes its
    input (saved again after forward), with a complex output (its twin complex64) and a tensor
    among its init inputs (saved in init.pt) was under-reserved by a sixth."""
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic import problem_sizing
    from kaudit.dynamic.kernels import REFERENCE_TARGET

    problem = tmp_path / "problem.py"
    problem.write_text(SIZED_PROBLEM)
    size = problem_sizing.size_problems([str(problem)], 42)[str(problem)]
    assert size is not None and size.inputs_changed and size.twins == 256 * 512 * 8
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


def test_a_problem_that_hangs_the_sizing_job_keeps_the_sizes_before_it(tmp_path):
    """Level 1 is sized in one job: a problem that hangs it (or crashes it) leaves the problems
    sized before it sized, and those after it unsized (they ask their part of the GPU)."""
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic import problem_sizing

    good = str(ROOT / "fixtures" / "problems" / "good_matmul.py")
    hangs = tmp_path / "hangs.py"
    hangs.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    after = tmp_path / "after.py"
    after.write_text(Path(good).read_text())
    sizes = problem_sizing.size_problems([good, str(hangs), str(after)], 42, timeout=8)
    assert list(sizes) == [good] and sizes[good].inputs == 2 * 64 * 128 * 4


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
                        lambda job, gate=None: RunResult(OK, value=forged))
    assert problem_sizing.size_problems([asked, "/problems/c.py"], 42) == {
        asked: None, "/problems/c.py": None}
    forged["sizes"][asked] = {"params": 0, "inputs": 8, "outputs": -1, "twins": 4,
                              "inputs_changed": "yes"}
    size = problem_sizing.size_problems([asked], 42)[asked]
    assert size == problem_sizing.ProblemSize(0, 8, None, None, 0, False, None)
    assert problem_sizing.reference_writes(size, 2) == 0
    # forward's FLOPs only order the problems' start: a forged count is a number or nothing
    for forged_flops, read in ((-1, None), ("1e30", None), (True, None), (10**30, 10**30)):
        forged["sizes"][asked] = {"params": 0, "inputs": 8, "outputs": 4, "twins": 4,
                                  "flops": forged_flops}
        assert problem_sizing.size_problems([asked], 42)[asked].flops == read
    # the float64 run's sizes are read whole or not at all
    forged["sizes"][asked] = {"params": 0, "inputs": 8, "outputs": 4, "twins": 4, "forward": 4,
                              "params64": 0, "inputs64": 16, "forward64": -8}
    size = problem_sizing.size_problems([asked], 42)[asked]
    assert (size.forward, size.params64, size.inputs64, size.forward64) == (4, None, None, None)
