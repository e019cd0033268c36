"""Extension builds shared between the jobs of one kernel text, checked before each reuse, and
kept between scans.

A results tree repeats kernels, and a kernel's candidate job and its plain run import the same
file: each compiles its `load_inline` extensions (and Triton its kernels) into a build folder, and
ninja only rebuilds when the folder's path and sources change. So each kernel text gets one
folder, `ROOT/<sha256 of the text, 16 hex>`, handed to one job at a time. ROOT is persistent by
default (`default_root()`, the user cache folder; `--build-cache DIR`), so a kernel compiled once
is not compiled again by a later scan; None is a neutral temporary folder for the scan alone.

After a job, kaudit records the SHA-256 of every file in the folder (in memory, and for a
persistent cache in `<key>.manifest`, signed with the installation key); before the next job, a
folder whose files differ from the record (another job, or anything else, changed a compiled
library) is emptied and built again. In the sandbox a job sees only its own kernel's folder.

Several kaudit processes may share a persistent cache: a folder is used under an exclusive file
lock (`fcntl.flock` on `<key>.lock`, held by kaudit, never by the job), and its signed manifest
on disk is the record. The cache is bounded: when a scan closes it, the folders used least
recently (by their manifest's time) are removed until it holds at most `max_bytes`; a folder
locked by another process is skipped. Jobs compile with every core (`MAX_JOBS`, see `kernels`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from kaudit.cache import sign
from kaudit.dynamic import scratch

#: a persistent cache's bound (bytes), unless the caller gives another
DEFAULT_MAX_BYTES = 20 << 30
_KEY_LENGTH = 16


#: the persistent cache's folder in the user cache folder. Jobs see its path (the extension and
#: Triton cache variables name it), so it names no auditor: a kernel that looks for one there
#: must find a folder any benchmark run could have
DEFAULT_FOLDER = "kernel-builds"


def default_root() -> str:
    """`$XDG_CACHE_HOME/kernel-builds` (~/.cache/kernel-builds)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, DEFAULT_FOLDER)


class BuildCache:
    def __init__(self, root: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.persistent = root is not None
        self.max_bytes = max_bytes
        # absolute: jobs run in folders of their own, where a relative path names a new,
        # empty folder (every job compiled the kernel again, into its own temporary folder)
        self.root = Path(os.path.abspath(root)) if root is not None else None
        self._records: dict[str, dict[str, str]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        #: keys whose folder was found changed and emptied (for tests and messages)
        self.discarded: list[str] = []

    def close(self) -> None:
        """Remove a scan's own build folders; a persistent cache is kept, within its bound."""
        if not self.persistent and self.root is not None:
            scratch.remove(self.root)
            self.root = None
        elif self.root is not None and self.root.is_dir():
            self.evict()

    def evict(self) -> list[str]:
        """Remove the least recently used folders until the cache holds at most `max_bytes`;
        returns their keys. A folder in use (locked by any process) stays."""
        assert self.root is not None
        entries = []
        for folder in self.root.iterdir():
            if folder.is_dir() and len(folder.name) == _KEY_LENGTH:
                manifest = self.root / f"{folder.name}.manifest"
                try:
                    used = (manifest if manifest.exists() else folder).stat().st_mtime
                except OSError:
                    continue
                entries.append((used, folder.name, _size(folder)))
        total = sum(size for _, _, size in entries)
        removed = []
        for _, key, size in sorted(entries):
            if total <= self.max_bytes:
                break
            with self._file_lock(key, wait=False) as locked:
                if not locked:
                    continue
                shutil.rmtree(self.root / key, ignore_errors=True)
                with contextlib.suppress(OSError):
                    (self.root / f"{key}.manifest").unlink()
                self._records.pop(key, None)
                total -= size
                removed.append(key)
        return removed

    @contextlib.contextmanager
    def _file_lock(self, key: str, wait: bool = True) -> Iterator[bool]:
        """An exclusive lock on `key`'s folder between processes (a persistent cache only);
        yields whether it is held (always, when `wait`)."""
        if not self.persistent:
            yield True
            return
        assert self.root is not None
        descriptor = os.open(self.root / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(descriptor)  # releases the lock

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_KEY_LENGTH]

    @contextlib.contextmanager
    def use(self, text: str) -> Iterator[str]:
        """The build folder of kernel `text`, checked, for one job at a time; recorded after."""
        key = self.key(text)
        with self._lock:
            if self.root is None:
                self.root = scratch.folder()
            self.root.mkdir(parents=True, exist_ok=True)
            lock = self._locks.setdefault(key, threading.Lock())
        folder = self.root / key
        with lock, self._file_lock(key):
            if not self._intact(key, folder):
                self.discarded.append(key)
                shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)
            try:
                yield str(folder)
            finally:
                self._record(key, folder)

    def _intact(self, key: str, folder: Path) -> bool:
        if not folder.exists():
            return True
        # a persistent cache's signed manifest is the record: another process may have built
        # the folder again since this one last used it
        record = self._load(key) if self.persistent else self._records.get(key)
        return record is not None and record == _hashes(folder)

    def _record(self, key: str, folder: Path) -> None:
        hashes = _hashes(folder)
        self._records[key] = hashes
        if self.persistent:
            assert self.root is not None
            text = json.dumps(hashes, sort_keys=True)
            manifest = self.root / f"{key}.manifest"
            partial = manifest.with_suffix(".partial")
            with contextlib.suppress(OSError):  # written whole, then renamed: never read half
                partial.write_text(json.dumps({"files": text, "mac": sign(key, text)}),
                                   encoding="utf-8")
                os.replace(partial, manifest)

    def _load(self, key: str) -> dict[str, str] | None:
        assert self.root is not None
        try:
            data = json.loads((self.root / f"{key}.manifest").read_text(encoding="utf-8"))
            if hmac.compare_digest(str(data["mac"]), sign(key, str(data["files"]))):
                return json.loads(data["files"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None


def _hashes(folder: Path) -> dict[str, str]:
    """SHA-256 of every file below `folder` (symlinks by their target text)."""
    found = {}
    for base, folders, files in os.walk(folder):
        folders.sort()
        for name in sorted(files):
            path = Path(base) / name
            relative = str(path.relative_to(folder))
            if path.is_symlink():
                found[relative] = "link:" + os.readlink(path)
                continue
            digest = hashlib.sha256()
            try:
                with open(path, "rb") as handle:
                    for block in iter(lambda h=handle: h.read(1 << 20), b""):
                        digest.update(block)
            except OSError:
                continue
            found[relative] = digest.hexdigest()
    return found


def _size(folder: Path) -> int:
    total = 0
    for base, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(base, name)).st_size
    return total
