"""Per-file results cached by content: the file's bytes, its display path, kaudit's own code and
the options that change findings. A re-scan of an unchanged tree reads results instead of
parsing. Extension sources read from disk (`sources=[...]`) are re-checked on every hit.

Only kaudit's own process writes the cache, and every entry carries an HMAC of its key and value
under this installation's key (`installation_key`, a file readable by its user only, hidden from
jobs by the sandbox): an entry written or changed by anything else (a kernel run by the dynamic
pass) does not verify and is scanned again."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
import sqlite3
from pathlib import Path

from kaudit import __version__
from kaudit.config import Config
from kaudit.discover import WorkItem
from kaudit.engine import FileResult, digest_file
from kaudit.findings import Finding, ScanError

_SCHEMA = ("CREATE TABLE IF NOT EXISTS signed_results (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
           "mac TEXT NOT NULL)")
KEY_FILE = "key"


def key_folder() -> Path:
    """Where this installation's key lives: `$XDG_CONFIG_HOME/kaudit` (~/.config/kaudit)."""
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "kaudit"


@functools.cache
def installation_key() -> bytes:
    """The secret that signs cache entries (created on first use, mode 0600). Where it cannot be
    stored, a key for this process only: nothing earlier verifies, so nothing is trusted."""
    folder = key_folder()
    path = folder / KEY_FILE
    try:
        data = path.read_text(encoding="ascii").strip()
        if len(data) == 64:
            return bytes.fromhex(data)
    except (OSError, ValueError):
        pass
    key = secrets.token_bytes(32)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(key.hex())
    except OSError:
        pass
    return key


def sign(*parts: str) -> str:
    """HMAC-SHA256 of `parts` under the installation key."""
    digest = hmac.new(installation_key(), digestmod=hashlib.sha256)
    for part in parts:
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


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
        row = self.db.execute("SELECT value, mac FROM signed_results WHERE key = ?",
                              (key,)).fetchone()
        if row is None:
            return None
        if not hmac.compare_digest(row[1], sign(key, row[0])):
            return None  # not written by this installation: scanned again, and replaced
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
        self.db.execute("INSERT OR REPLACE INTO signed_results VALUES (?, ?, ?)",
                        (key, value, sign(key, value)))

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
