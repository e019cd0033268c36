"""A first-come, first-served ledger of one resource that the threads of a kaudit process share:
a GPU's memory (`gpu_share`, in fractions of it) or the memory the audits hold in kaudit's own
process (`host_memory`, in bytes)."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator


class Ledger:
    """Requests are granted in order of arrival, so a large request is not starved by the small
    ones that keep coming. A *narrow* request (a job at its usual share, whose total the caller
    has already bounded) never waits unless a *wide* one holds or waits; a wide request waits
    until what is held leaves it room within `capacity`, or until nothing is held (a request
    larger than the capacity then runs alone)."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.held = 0.0
        self.wide_held = 0
        self.waiting: deque[object] = deque()
        self.changed = threading.Condition()

    def _fits(self, amount: float, wide: bool) -> bool:
        if not wide and not self.wide_held:
            return True
        return self.held == 0 or self.held + amount <= self.capacity * (1 + 1e-9)

    @contextlib.contextmanager
    def reserve(self, amount: float, wide: bool = True) -> Iterator[None]:
        ticket = object()
        with self.changed:
            self.waiting.append(ticket)
            try:
                self.changed.wait_for(lambda: self.waiting[0] is ticket
                                      and self._fits(amount, wide))
            finally:  # granted, or interrupted (SIGTERM unwinds): the queue moves on either way
                self.waiting.remove(ticket)
                self.changed.notify_all()
            self.held += amount
            self.wide_held += wide
        try:
            yield
        finally:
            with self.changed:
                self.held -= amount
                self.wide_held -= wide
                self.changed.notify_all()
