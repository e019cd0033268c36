"""Timing jobs run alone on their GPU, in batches (`kaudit.dynamic.timing_lane`): threads stand
in for a scan's audits, a recording context manager for the GPU's exclusive lock."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from kaudit.dynamic.timing_lane import TimingLane


class Lock:
    """Records when the exclusive lock is taken and given back, and what ran meanwhile."""

    def __init__(self, fails: int = 0) -> None:
        self.held, self.taken, self.fails = False, 0, fails
        self.events: list[str] = []

    @contextlib.contextmanager
    def __call__(self):
        if self.fails:
            self.fails -= 1
            raise OSError("the lock folder went away")
        self.held, self.taken = True, self.taken + 1
        self.events.append("take")
        try:
            yield
        finally:
            self.held = False
            self.events.append("give")


def timed(lane: TimingLane, lock: Lock, name: str, seconds: float = 0.05) -> None:
    with lane.turn():
        assert lock.held, "a timing job runs only while its batch holds the GPU alone"
        lock.events.append(f"start {name}")
        time.sleep(seconds)
        lock.events.append(f"end {name}")


def test_a_timing_job_with_no_other_job_on_the_gpu_is_timed_at_once():
    """The other audits may be compiling, or be done: nothing of theirs runs on the GPU."""
    lock = Lock()
    lane = TimingLane(lock, wait_s=30)
    started = time.monotonic()
    timed(lane, lock, "a")
    assert time.monotonic() - started < 5, "no other job to wait for"
    assert lock.events == ["take", "start a", "end a", "give"] and lane.batches == [1]


def test_audits_waiting_together_are_timed_one_after_another_under_one_lock():
    """The batch starts when the last of the other jobs on the GPU ends, not before."""
    lock = Lock()
    lane = TimingLane(lock, wait_s=30)
    running = threading.Barrier(3)

    def audit(name: str, busy: float) -> None:
        with lane.running():  # its other jobs on the GPU
            running.wait()
            time.sleep(busy)
        with lane.turn():
            lock.events.append(f"start {name}")
            time.sleep(0.05)
            lock.events.append(f"end {name}")

    threads = [threading.Thread(target=audit, args=(name, busy))
               for name, busy in (("a", 0.0), ("b", 0.3), ("c", 0.6))]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert time.monotonic() - started < 10, "the batch began when the last job ended"
    assert lock.taken == 1 and lane.batches == [3], lock.events
    assert lock.events[0] == "take" and lock.events[-1] == "give"
    runs = lock.events[1:-1]
    assert runs == [e for n in ("a", "b", "c") for e in (f"start {n}", f"end {n}")], \
        "one at a time, first come first timed"


def test_the_first_waits_at_most_its_wait_for_a_busy_neighbour():
    lock = Lock()
    lane = TimingLane(lock, wait_s=0.3)
    busy, done = threading.Event(), threading.Event()

    def neighbour() -> None:  # a job that runs long on the GPU
        with lane.running():
            busy.set()
            done.wait(20)

    thread = threading.Thread(target=neighbour)
    thread.start()
    busy.wait(5)
    started = time.monotonic()
    timed(lane, lock, "a")
    waited = time.monotonic() - started
    done.set()
    thread.join(5)
    assert 0.3 <= waited < 5, waited
    assert lane.batches == [1]


def test_a_lock_that_cannot_be_taken_fails_its_job_and_the_next_one_leads():
    lock = Lock(fails=1)
    lane = TimingLane(lock, wait_s=30)
    with pytest.raises(OSError, match="went away"):
        timed(lane, lock, "a")
    timed(lane, lock, "b")
    assert lock.events == ["take", "start b", "end b", "give"]
    assert not lane.queue and lane.held is None
