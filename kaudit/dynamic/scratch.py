"""kaudit's temporary folders for the dynamic pass and `kaudit problems`.

Folders a job can see (its own folder, the fork server's, a JSONL record's kernel) get neutral
names, `tmp` and random letters, as any program's would; kaudit's own (the build cache) live in
one folder per kaudit process, `TMPDIR/kaudit-<random>/`, which also lists the neutral folders in
its `folders` file. Everything is removed when it is no longer needed, at exit, and on SIGTERM and SIGINT
(`exit_on_sigterm`, after the running jobs are killed). What a killed
kaudit (SIGKILL) leaves behind is removed by the next one: `remove_stale()` deletes `kaudit-*`
folders whose owner (its `owner` file: process id, start time and PID namespace) is gone, or,
where the owner cannot be told, older than STALE_AFTER seconds, and the neutral folders they
list; a live owner's folders stay. A scan killed on the H200
left 40 GiB that shrank the next scan's default limit to a third.

The temporary disk of a scan is bounded (`--temp-limit`, `start_budget`): each job's folder is
measured when the job ends (`charge`: blocks in use, the inputs folders shared by a problem's jobs
too), the peak of all live folders together is reported (`usage`), and the runner caps each file
a job writes at what is left (`left`) and fails a job whose folder takes the total over the limit.
An audit that knows what its jobs will write first reserves it (`reserve`, `Job.disk`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

PREFIX = "kaudit-"
LIST = "folders"
OWNER = "owner"
#: seconds after which a kaudit temporary folder is taken to be left over by a killed run
STALE_AFTER = 24 * 3600
_NEUTRAL = re.compile(r"^tmp[a-z0-9_]{8}$")
_lock = threading.Lock()
_own: Path | None = None
_live: set[Path] = set()
_on_terminate: list[Callable[[], None]] = []
#: the default `--temp-limit`: this share of the free space of the temporary folder's disk
DEFAULT_TEMP_SHARE = 0.8
#: an audit that reserves at most this share of the limit is small: it need not wait behind a
#: larger one waiting for room, while the small audits hold at most SMALL_SHARE of the limit.
#: On the H200, fourteen audits queued behind level-1 problems of 20 to 50 GiB, which wrote and
#: read their outputs one at a time while the CPU sat idle and no kernel compiled
SMALL_AUDIT = 1 / 64
SMALL_SHARE = 1 / 8
#: small audits that may go before the one first in line, while it waits: it is not starved
MAX_OVERTAKES = 32


class Reservation:
    """Bytes of the scan's temporary disk held for one audit (`reserve`), and the folders its
    jobs wrote (`charge`): what they hold counts against the limit once, as the larger of the
    two, so an audit's own files never shrink the room it reserved."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.folders: set[Path] = set()


class TempBudget:
    """The temporary-disk limit of one scan (bytes; None: none) and what its folders hold."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.live: dict[Path, int] = {}
        #: the audits holding room, from before their first job starts until they end
        self.reserved: list[Reservation] = []
        self.waiting: deque[object] = deque()
        #: audits that went before the one first in line while it waited
        self.overtakes = 0
        self.peak = 0

    def held(self) -> int:
        """What the live folders hold on disk."""
        return sum(self.live.values())

    def held_by(self, reservation: Reservation) -> int:
        return sum(self.live.get(path, 0) for path in reservation.folders)

    def committed(self, leave_out: Reservation | None = None) -> int:
        """What the live folders hold and the audits reserved, each audit counted once; without
        `leave_out`'s audit."""
        owned = {path for held in self.reserved for path in held.folders}
        total = sum(size for path, size in self.live.items() if path not in owned)
        return total + sum(max(held.nbytes, self.held_by(held)) for held in self.reserved
                           if held is not leave_out)

    def admits(self, nbytes: int, first: bool) -> bool:
        """Whether an audit asking `nbytes` may start: it fits beside what is committed (or
        nothing is reserved), and it is `first` in line or small, within the small audits'
        share."""
        assert self.limit is not None
        if self.reserved and self.committed() + nbytes > self.limit:
            return False
        if first:
            return True
        bound = self.limit * SMALL_AUDIT
        small = sum(held.nbytes for held in self.reserved if held.nbytes <= bound)
        return self.overtakes < MAX_OVERTAKES and nbytes <= bound \
            and small + nbytes <= self.limit * SMALL_SHARE

    def usage(self) -> dict[str, int | None]:
        return {"limit_bytes": self.limit, "peak_bytes": self.peak}


_budget = TempBudget(None)
_room = threading.Condition(_lock)


def default_temp_limit() -> int | None:
    """DEFAULT_TEMP_SHARE of what is free where the temporary folders go; None if unknown."""
    try:
        found = os.statvfs(tempfile.gettempdir())
    except OSError:
        return None
    return int(found.f_bavail * found.f_frsize * DEFAULT_TEMP_SHARE)


def start_budget(limit: int | None) -> TempBudget:
    """A new scan's budget: `limit` bytes of temporary disk (0: none; None: the default)."""
    global _budget
    chosen = None if limit == 0 else (limit if limit is not None else default_temp_limit())
    with _room:
        _budget = TempBudget(chosen)
        _room.notify_all()
        return _budget


def left(reservation: Reservation | None = None) -> int | None:
    """Bytes a job may still write (None without a limit). For a job of `reservation`'s audit,
    the rest of its reservation, or more where the limit less what the other audits committed
    leaves more: folders of audits that reserved nothing (a problem not sized) fill the limit
    without asking, and on the H200 a reserved audit's job then started with no room and failed
    on the limit. For a job of none, the limit less what is on disk: it is not failed for room
    others only reserved."""
    with _lock:
        if _budget.limit is None:
            return None
        if reservation is None or reservation not in _budget.reserved:  # none, or a past scan's
            return max(0, _budget.limit - _budget.held())
        own = _budget.held_by(reservation)
        return max(0, reservation.nbytes - own,
                   _budget.limit - _budget.committed(leave_out=reservation) - own)


def charge(path: Path, reservation: Reservation | None = None) -> int:
    """Measure `path` (blocks in use, links not followed) as one of the scan's live folders, of
    `reservation`'s audit if given; returns its size."""
    size = disk_usage(path)
    with _room:
        before = _budget.live.get(path)
        _budget.live[path] = size
        if reservation is not None:
            reservation.folders.add(path)
        _budget.peak = max(_budget.peak, _budget.held())
        if before is not None and size < before:  # files removed: room for audits waiting
            _room.notify_all()
    return size


def reserve(nbytes: int) -> tuple[Reservation | None, float]:
    """Hold `nbytes` of the limit for an audit about to write about that much (all its jobs),
    until `release`; returns the reservation (None without a limit) and the seconds waited.
    Folders are measured only when their jobs end, so fourteen audits at once could each write
    what was left (on the H200 the disk filled, then jobs started with no room at all and
    failed): an audit waits, in order of arrival, until the live folders and the other
    reservations leave it room; a small one (SMALL_AUDIT) may go before larger ones waiting.
    With no reservation held it starts, whatever is held: an audit larger than the limit is
    refused before it asks (`kernels`)."""
    if nbytes <= 0:
        return None, 0.0
    started = time.monotonic()
    with _room:
        while _budget.limit is not None:
            budget, token = _budget, object()
            budget.waiting.append(token)  # in order of arrival: a large audit is not starved
            try:
                _room.wait_for(lambda: budget is not _budget or budget.admits(
                    nbytes, budget.waiting[0] is token))
                first = budget.waiting[0] is token
            finally:
                budget.waiting.remove(token)
                _room.notify_all()
            if budget is _budget:  # else a new scan's budget: ask it instead
                # the first in line resets the count; any other went before it
                budget.overtakes = 0 if first else budget.overtakes + 1
                reservation = Reservation(nbytes)
                budget.reserved.append(reservation)
                return reservation, time.monotonic() - started
    return None, 0.0


@contextlib.contextmanager
def reserving(nbytes: int) -> Iterator[tuple[Reservation | None, float]]:
    """`reserve`, released when the block ends, however it ends."""
    reservation, waited = reserve(nbytes)
    try:
        yield reservation, waited
    finally:
        release(reservation)


def release(reservation: Reservation | None) -> None:
    """The audit ended; its folders still live count as anyone's."""
    with _room:
        if reservation is not None and reservation in _budget.reserved:
            _budget.reserved.remove(reservation)
            _room.notify_all()


def over_limit() -> int | None:
    """By how many bytes the live folders exceed the limit, or None."""
    with _lock:
        excess = None if _budget.limit is None else _budget.held() - _budget.limit
        return excess if excess is not None and excess > 0 else None


def within(reservation: Reservation | None) -> bool:
    """Whether `reservation`'s folders hold no more than it reserved (False without one)."""
    with _lock:
        return reservation is not None and reservation in _budget.reserved \
            and _budget.held_by(reservation) <= reservation.nbytes


def usage() -> dict[str, int | None]:
    """The scan's limit and the peak its temporary folders reached, for the summary."""
    with _lock:
        return _budget.usage()


def disk_usage(path: Path) -> int:
    total = 0
    for directory, folders, names in os.walk(path):
        for name in [*names, *folders]:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                continue
    return total


def own_folder() -> Path:
    """This process's private folder (created on first use, removed at exit)."""
    global _own
    with _lock:
        if _own is None or not _own.is_dir():
            _own = Path(tempfile.mkdtemp(prefix=PREFIX))
            (_own / LIST).touch()
            (_own / OWNER).write_text(_process_identity(os.getpid()) or "", encoding="utf-8")
            atexit.register(remove_all)
        return _own


def folder() -> Path:
    """A new neutral folder (`TMPDIR/tmpXXXXXXXX`), listed for clean-up."""
    own = own_folder()
    path = Path(tempfile.mkdtemp(prefix="tmp"))
    with _lock:
        _live.add(path)
        with open(own / LIST, "a", encoding="utf-8") as handle:
            handle.write(path.name + "\n")
    return path


def remove(path: Path | None) -> None:
    if path is None:
        return
    shutil.rmtree(path, ignore_errors=True)
    with _room:
        _live.discard(path)
        if _budget.live.pop(path, None) is not None:
            for reservation in _budget.reserved:
                reservation.folders.discard(path)
            _room.notify_all()


def remove_all() -> None:
    """Every folder this process made (at exit)."""
    global _own
    with _lock:
        live, own, _own = list(_live), _own, None
        _live.clear()
    for path in live:
        shutil.rmtree(path, ignore_errors=True)
    if own is not None:
        shutil.rmtree(own, ignore_errors=True)


def remove_stale(now: float | None = None) -> list[str]:
    """Remove `kaudit-*` folders in TMPDIR not modified for STALE_AFTER seconds, and the neutral
    folders they list; returns the names removed."""
    root = Path(tempfile.gettempdir())
    now = time.time() if now is None else now
    removed = []
    for entry in root.glob(PREFIX + "*"):
        try:
            if entry.is_symlink() or not entry.is_dir() or entry == _own:
                continue
            owner_gone = _owner_gone(entry)
            # a live owner's folders stay, however old: the folder's time is its creation's
            if owner_gone is False or (
                    owner_gone is None and now - entry.stat().st_mtime < STALE_AFTER):
                continue
            listed = (entry / LIST).read_text(encoding="utf-8").split() \
                if (entry / LIST).is_file() else []
        except OSError:
            continue
        for name in listed:
            path = root / name
            if _NEUTRAL.match(name) and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(name)
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry.name)
    return removed


def _process_identity(pid: int) -> str | None:
    """`PID START NAMESPACE`: the process's start time (clock ticks since boot) tells a reused
    PID from its first owner; None where /proc does not say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
        start = stat.rpartition(")")[2].split()[19]
        return f"{pid} {start} {os.readlink('/proc/self/ns/pid')}"
    except (OSError, IndexError):
        return None


def _owner_gone(entry: Path) -> bool | None:
    """Whether the kaudit that made folder `entry` has ended; None when unknown (no owner
    recorded, or one of another PID namespace: another container's processes are not visible
    from here)."""
    try:
        pid, start, namespace = (entry / OWNER).read_text(encoding="utf-8").split()
        ours = os.readlink("/proc/self/ns/pid")
    except (OSError, ValueError):
        return None
    if namespace != ours or not pid.isdigit():
        return None
    now = _process_identity(int(pid))
    return now is None or now.split()[1] != start


def on_terminate(callback: Callable[[], None]) -> None:
    """Run `callback` (kill the running jobs) when SIGTERM arrives, before unwinding."""
    _on_terminate.append(callback)


def exit_on_sigterm() -> None:
    """SIGTERM and SIGINT kill the running jobs, then unwind (SystemExit, KeyboardInterrupt):
    `finally` blocks and atexit run."""
    if threading.current_thread() is not threading.main_thread():
        return

    def terminate(number: int, _frame: object) -> None:
        for callback in _on_terminate:
            callback()
        if number == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + number)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
