"""Extension builds shared between the jobs of one kernel text, checked before each reuse.

A results tree repeats kernels, and a kernel's candidate job and its plain run import the same
file: each compiles its `load_inline` extensions (and Triton its kernels) into a build folder, and
ninja only rebuilds when the folder's path and sources change. So each kernel text gets one
folder, `ROOT/<sha256 of the text, 16 hex>` (ROOT: `--extensions-dir`-style cache the caller
names, or a neutral temporary folder for the scan), handed to one job at a time. After a job, kaudit
records the SHA-256 of every file in it (in memory, and for a named cache in
`<key>.manifest`, signed with the installation key); before the next job, a folder whose files
differ from the record (another job, or anything else, changed a compiled library) is emptied and
built again. In the sandbox a job sees only its own kernel's folder.
"""

from __future__ import annotations

import contextlib
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


class BuildCache:
    def __init__(self, root: str | None = None) -> None:
        self.persistent = root is not None
        self.root = Path(root) if root is not None else None
        self._records: dict[str, dict[str, str]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        #: keys whose folder was found changed and emptied (for tests and messages)
        self.discarded: list[str] = []

    def close(self) -> None:
        """Remove a scan's own build folders (a cache the caller named is kept)."""
        if not self.persistent and self.root is not None:
            scratch.remove(self.root)
            self.root = None

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]

    @contextlib.contextmanager
    def use(self, text: str) -> Iterator[str]:
        """The build folder of kernel `text`, checked, for one job at a time; recorded after."""
        key = self.key(text)
        with self._lock:
            if self.root is None:
                self.root = scratch.folder()
            lock = self._locks.setdefault(key, threading.Lock())
        folder = self.root / key
        with lock:
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
        record = self._records.get(key)
        if record is None and self.persistent:
            record = self._load(key)
        return record is not None and record == _hashes(folder)

    def _record(self, key: str, folder: Path) -> None:
        hashes = _hashes(folder)
        self._records[key] = hashes
        if self.persistent:
            assert self.root is not None
            text = json.dumps(hashes, sort_keys=True)
            with contextlib.suppress(OSError):
                (self.root / f"{key}.manifest").write_text(
                    json.dumps({"files": text, "mac": sign(key, text)}), encoding="utf-8")

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
