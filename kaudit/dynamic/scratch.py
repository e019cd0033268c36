"""kaudit's temporary folders for the dynamic pass and `kaudit problems`.

Folders a job can see (its own folder, the fork server's, a JSONL record's kernel) get neutral
names, `tmp` and random letters, as any program's would; kaudit's own (the build cache) live in
one folder per kaudit process, `TMPDIR/kaudit-<random>/`, which also lists the neutral folders in
its `folders` file. Everything is removed when it is no longer needed, at exit, and on SIGTERM and SIGINT
(`exit_on_sigterm`, after the running jobs are killed). What a killed
kaudit (SIGKILL) leaves behind is removed by the next one: `remove_stale()` deletes `kaudit-*`
folders older than STALE_AFTER seconds and the neutral folders they list.

The temporary disk of a scan is bounded (`--temp-limit`, `start_budget`): each job's folder is
measured when the job ends (`charge`: blocks in use, the inputs folders shared by a problem's jobs
too), the peak of all live folders together is reported (`usage`), and the runner caps each file
a job writes at what is left (`left`) and fails a job whose folder takes the total over the limit.
A job that says what it will write (`Job.disk_estimate`) first reserves it (`reserve`).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

PREFIX = "kaudit-"
LIST = "folders"
#: seconds after which a kaudit temporary folder is taken to be left over by a killed run
STALE_AFTER = 24 * 3600
_NEUTRAL = re.compile(r"^tmp[a-z0-9_]{8}$")
_lock = threading.Lock()
_own: Path | None = None
_live: set[Path] = set()
_on_terminate: list[Callable[[], None]] = []
#: the default `--temp-limit`: this share of the free space of the temporary folder's disk
DEFAULT_TEMP_SHARE = 0.8


class TempBudget:
    """The temporary-disk limit of one scan (bytes; None: none) and what its folders hold."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.live: dict[Path, int] = {}
        #: what jobs are expected to write (`reserve`), from before they start until their
        #: results are closed: it decides only whether a job may start and its file cap
        self.reserved: dict[object, int] = {}
        self.waiting: deque[object] = deque()
        self.peak = 0

    def held(self) -> int:
        """What the live folders hold on disk."""
        return sum(self.live.values())

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


def left(reservation: object | None = None) -> int | None:
    """Bytes of the limit not held by live folders (None without a limit); for a job holding
    `reservation`, less what the other jobs reserved."""
    with _lock:
        if _budget.limit is None:
            return None
        others = sum(n for token, n in _budget.reserved.items() if token is not reservation) \
            if reservation is not None else 0
        return max(0, _budget.limit - _budget.held() - others)


def charge(path: Path) -> int:
    """Measure `path` (blocks in use, links not followed) as one of the scan's live folders;
    returns its size."""
    size = disk_usage(path)
    with _lock:
        _budget.live[path] = size
        _budget.peak = max(_budget.peak, _budget.held())
    return size


def reserve(nbytes: int) -> tuple[object | None, float]:
    """Hold `nbytes` of the limit for a job about to write about that much, until `release`;
    returns the token (None without a limit) and the seconds waited. Folders are measured only
    when their jobs end, so fourteen jobs at once could each write what was left (on the H200 the
    disk filled): a job waits, in order of arrival, until the live folders and the other
    reservations leave it room. It never waits for folders alone (a waiting audit's own inputs
    are among them), so with no reservation held it starts, whatever is held."""
    if nbytes <= 0:
        return None, 0.0
    started = time.monotonic()
    with _room:
        while _budget.limit is not None:
            budget, token = _budget, object()
            budget.waiting.append(token)  # in order of arrival: a large job is not starved
            try:
                _room.wait_for(lambda: budget is not _budget or budget.waiting[0] is token and (
                    not budget.reserved or budget.held() + sum(budget.reserved.values())
                    + nbytes <= (budget.limit or 0)))
            finally:
                budget.waiting.remove(token)
                _room.notify_all()
            if budget is _budget:  # else a new scan's budget: ask it instead
                budget.reserved[token] = nbytes
                return token, time.monotonic() - started
    return None, 0.0


def release(token: object | None) -> None:
    """The job's result is closed."""
    with _room:
        if _budget.reserved.pop(token, None) is not None:
            _room.notify_all()


def over_limit() -> int | None:
    """By how many bytes the live folders exceed the limit, or None."""
    with _lock:
        excess = None if _budget.limit is None else _budget.held() - _budget.limit
        return excess if excess is not None and excess > 0 else None


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
            if entry.is_symlink() or not entry.is_dir() or \
                    now - entry.stat().st_mtime < STALE_AFTER or entry == _own:
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
