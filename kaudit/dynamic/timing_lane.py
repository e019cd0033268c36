"""Timing jobs run alone on their GPU, in batches.

The GPU runs one process's kernels at a time: another job's work on it adds its time to the
trials of both the reference and the kernel, which pulls their ratio towards 1 (at `-j 14` on
the H200, cuBLAS's 2048x8192x4096 float32 matmul measured 12.2 ms beside the scan's other jobs,
the reference's IQR up to 69 % of its median; alone, 2.78 ms and 2-4 %). So a timing job waits in
its GPU's `TimingLane` until a batch starts, and the batch holds the GPU's exclusive lock (no
other kaudit job of the user runs on it, here or in another process) while the timing jobs
waiting run one after another. A timing job is gated (`runner.Job.gated`): its process and CUDA
context are made while it waits, and no code of its problem or kernel runs before its turn.
Compiles do not hold up a batch: a kernel's extensions are built before its first job on the
GPU (`kaudit.dynamic.prebuild`).

A batch starts when no other job of this process runs on the GPU (`running`: the audits left
are compiling, or wait to be timed, or have ended), so that taking the lock costs nothing here,
or when the first has waited `LANE_WAIT_S`: then the lock waits for the jobs running to end, and
jobs that come after wait at the gate. Jobs that reach the lane while a batch runs join it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

#: seconds the first timing job waits for the other jobs of its process to end before its batch
#: takes the lock, which then waits for them
LANE_WAIT_S = 20.0


class TimingLane:
    """One GPU's lane in this process. `hold()`: the GPU's exclusive lock."""

    def __init__(self, hold: Callable[[], contextlib.AbstractContextManager],
                 wait_s: float = LANE_WAIT_S) -> None:
        self.hold, self.wait_s = hold, wait_s
        self.cond = threading.Condition()
        self.jobs = 0  # other jobs of this process running on the GPU (`running`)
        self.queue: list[object] = []  # timing jobs waiting or running, oldest first
        self.held: contextlib.ExitStack | None = None  # the batch's lock
        self.taking = False  # the oldest is taking the lock
        #: batches started, and how many timing jobs each ran (for tests and figures)
        self.batches: list[int] = []

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around one job on this GPU that is not a timing job, once it holds its lock."""
        with self.cond:
            self.jobs += 1
        try:
            yield
        finally:
            with self.cond:
                self.jobs -= 1
                self.cond.notify_all()

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Around one timing job: entered when the GPU is this job's alone."""
        ticket, leader = object(), False
        with self.cond:
            self.queue.append(ticket)
            since = time.monotonic()
            self.cond.notify_all()
        try:
            with self.cond:
                while not (self.held is not None and self.queue[0] is ticket):
                    if self._may_start(ticket, since):
                        self.taking = leader = True
                        break
                    self.cond.wait(timeout=max(0.05, since + self.wait_s - time.monotonic()))
            if leader:
                self._start()
            yield
        finally:
            self._leave(ticket)

    def _may_start(self, ticket: object, since: float) -> bool:
        return (self.held is None and not self.taking and self.queue[0] is ticket
                and (self.jobs == 0 or time.monotonic() - since >= self.wait_s))

    def _start(self) -> None:
        held = contextlib.ExitStack()
        try:
            held.enter_context(self.hold())
        except BaseException:
            with self.cond:
                self.taking = False
                self.cond.notify_all()
            raise
        with self.cond:
            self.held, self.taking = held, False
            self.batches.append(0)

    def _leave(self, ticket: object) -> None:
        with self.cond:
            if self.queue and self.queue[0] is ticket and self.held is not None:
                self.batches[-1] += 1
            self.queue.remove(ticket)
            if not self.queue and self.held is not None:
                held, self.held = self.held, None
                held.close()
            self.cond.notify_all()
