"""What every adapter needs: reading JSON claims without letting a bad file stop the scan,
finding a benchmark's files above a submission, and making work items for kernels held as
strings inside records."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from kaudit.adapters.jsonpos import Located
from kaudit.discover import WorkItem, display_path
from kaudit.findings import ScanError
from kaudit.results import MAX_CLAIM_FILE_BYTES, Submission


class Problems:
    """The problems met while adapting: each names the file and what was expected."""

    def __init__(self) -> None:
        self.errors: list[ScanError] = []

    def add(self, path: str | Path, message: str) -> None:
        self.errors.append(ScanError(display_path(str(path)), message))

    def read_json(self, path: str | Path, located: bool = False) -> Any:
        """The parsed file (a `Located` when asked), or None with the reason recorded."""
        try:
            if os.path.getsize(path) > MAX_CLAIM_FILE_BYTES:
                raise ValueError("over 256 MB")
            text = Path(path).read_text(encoding="utf-8")
            return Located(text) if located else json.loads(text)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self.add(path, f"cannot read: {exc}")
            return None


def first_record(path: str) -> dict[str, Any] | None:
    """The first JSON object of a JSONL file, to tell its kind; None when it has none."""
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle):
                if line.strip():
                    record = json.loads(line)
                    return record if isinstance(record, dict) else None
                if number > 100:
                    return None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return None


def jsonl_records(path: str, problems: Problems) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) for every object line; unreadable lines are reported."""
    records = []
    display = display_path(path)
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    problems.add(f"{display}#L{number}",
                                 f"not JSON: {exc.msg} (column {exc.colno})")
                    continue
                if isinstance(record, dict):
                    records.append((number, record))
                else:
                    problems.add(f"{display}#L{number}", "expected a JSON object")
    except (OSError, UnicodeDecodeError) as exc:
        problems.add(path, f"cannot read JSONL file: {exc}")
    return records


def record_item(file: str, identity: str, line: int, field: str, text: str,
                submission: Submission) -> WorkItem:
    """A kernel held in a string field of a record on `line` of `file`."""
    display = display_path(file)
    return WorkItem(file, f"{display}#L{line}/{field}", explicit=False, text=text,
                    submission=submission, identity=f"{identity or os.path.realpath(file)}#L{line}"
                    f"/{field}")


def find_upwards(start: str | Path, relative: str, levels: int = 6) -> Path | None:
    """`relative` in `start`'s folder or one of its ancestors (a benchmark checkout's files
    seen from a submission inside it)."""
    folder = Path(os.path.abspath(start))
    if not folder.is_dir():
        folder = folder.parent
    for candidate in (folder, *folder.parents[:levels]):
        if (candidate / relative).exists():
            return candidate / relative
    return None


def sha256_matches(path: Path, expected: str) -> bool | None:
    """Whether the file's sha256 is `expected`, also accepting the same text with other line
    endings (a checkout with autocrlf); None when the file cannot be read."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    expected = expected.lower()
    variants = {data, data.replace(b"\r\n", b"\n"), data.replace(b"\n", b"\r\n")}
    return any(hashlib.sha256(v).hexdigest() == expected for v in variants)


def number(value: Any) -> float | None:
    """A finite number (not a bool), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None
