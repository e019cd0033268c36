"""Per-file results cached by content: the file's bytes, its display path, kaudit's own code and
the options that change findings. A re-scan of an unchanged tree reads results instead of
parsing. Extension sources read from disk (`sources=[...]`) are re-checked on every hit."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
from pathlib import Path

from kaudit import __version__
from kaudit.config import Config
from kaudit.discover import WorkItem
from kaudit.engine import FileResult, digest_file
from kaudit.findings import Finding, ScanError

_SCHEMA = "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


@functools.cache
def code_fingerprint() -> str:
    """Hash of kaudit's own sources (engine and rules), so a changed rule invalidates the cache."""
    from kaudit import rules

    digest = hashlib.sha256(__version__.encode())
    for folder in (Path(__file__).parent, Path(rules.__file__).parent):
        for file in sorted(folder.rglob("*.py")):
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


class ResultCache:
    def __init__(self, directory: str, config: Config) -> None:
        os.makedirs(directory, exist_ok=True)
        self.db = sqlite3.connect(os.path.join(directory, "results.sqlite"))
        self.db.execute(_SCHEMA)
        self.salt = f"{code_fingerprint()}\0{config.cache_key()}".encode()

    def key(self, item: WorkItem) -> str | None:
        """None when the file cannot be read (then it is scanned, and reported, as usual)."""
        if item.text is not None:
            data = item.text.encode("utf-8", "surrogatepass")
        else:
            try:
                data = Path(item.file).read_bytes()
            except OSError:
                return None
        digest = hashlib.sha256(self.salt)
        entry = item.submission.entry if item.submission else None
        digest.update(f"\0{item.display}\0{item.explicit}\0{entry}\0".encode())
        digest.update(data)
        return digest.hexdigest()

    def get(self, key: str) -> FileResult | None:
        row = self.db.execute("SELECT value FROM results WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        data = json.loads(row[0])
        if any(digest_file(path) != digest for path, digest in data["dependencies"].items()):
            return None
        return FileResult(
            data["path"], [Finding.from_dict(f) for f in data["findings"]],
            [ScanError(**e) for e in data["errors"]], data["skipped"], data["dependencies"])

    def put(self, key: str, result: FileResult) -> None:
        if any(error.internal for error in result.errors):
            return  # a crash is worth retrying, not remembering
        value = json.dumps({
            "path": result.path, "skipped": result.skipped, "dependencies": result.dependencies,
            "findings": [f.to_dict() for f in result.findings],
            "errors": [e.to_dict() for e in result.errors],
        })
        self.db.execute("INSERT OR REPLACE INTO results VALUES (?, ?)", (key, value))

    def close(self) -> None:
        self.db.commit()
        self.db.close()

    def abandon(self) -> None:
        """Close after a database error, keeping nothing more (the results already written
        stay valid: each is keyed by content)."""
        try:
            self.db.close()
        except sqlite3.Error:
            pass
