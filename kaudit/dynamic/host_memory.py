"""What the audits of one kaudit process hold in its own memory, bounded.

An audit keeps its reference outputs (both input sets, float64 copies, each scale's) in kaudit's
process from the end of its reference job to its own end, minutes on a GPU, and loads the
candidate's outputs beside them while it judges. Fourteen audits at once over CUDA-L1 level 1 on
the H200 host took more than its 128 GiB, and the host's out-of-memory killer ended the scan. So
an audit reserves HOLD_FACTOR times the size of its reference's output files before it loads them,
in a `Ledger` of HOST_SHARE of the memory that was available when the first audit asked: one that
does not fit waits for others to end, and one larger than the whole waits to run alone."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from kaudit.dynamic.ledger import Ledger
from kaudit.dynamic.limits import physical_memory

#: the part of the available memory the audits of one process may hold; the rest is the jobs'
HOST_SHARE = 0.5
#: the candidate's outputs, loaded while it is judged, about as many as the reference's
HOLD_FACTOR = 2

_ledger: Ledger | None = None
_ledger_lock = threading.Lock()


def available_memory() -> int | None:
    """MemAvailable (bytes), else the physical memory."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return physical_memory()


def ledger() -> Ledger:
    global _ledger
    with _ledger_lock:
        if _ledger is None:
            _ledger = Ledger(HOST_SHARE * (available_memory() or 1 << 62))
        return _ledger


@contextlib.contextmanager
def holding(output_bytes: int) -> Iterator[float]:
    """Reserve what an audit whose reference outputs take `output_bytes` on disk will hold;
    yields the seconds it waited."""
    started = time.monotonic()
    with ledger().reserve(float(HOLD_FACTOR * max(0, output_bytes))):
        yield time.monotonic() - started
