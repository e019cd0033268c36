"""kaudit's temporary folders for the dynamic pass and `kaudit problems`.

Folders a job can see (its own folder, the fork server's, a JSONL record's kernel) get neutral
names, `tmp` and random letters, as any program's would; kaudit's own (the build cache) live in
one folder per kaudit process, `TMPDIR/kaudit-<random>/`, which also lists the neutral folders in
its `folders` file. Everything is removed when it is no longer needed, at exit, and on SIGTERM and SIGINT
(`exit_on_sigterm`, after the running jobs are killed). What a killed
kaudit (SIGKILL) leaves behind is removed by the next one: `remove_stale()` deletes `kaudit-*`
folders older than STALE_AFTER seconds and the neutral folders they list.
"""

from __future__ import annotations

import atexit
import re
import shutil
import signal
import tempfile
import threading
import time
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
    with _lock:
        _live.discard(path)


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
