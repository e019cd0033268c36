"""Paths -> the files to scan. Folders are walked recursively (hidden folders and `__pycache__`
skipped), symlinks are followed once, loops are reported instead of followed, and a file reached
twice is scanned once."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kaudit.findings import ScanError

if TYPE_CHECKING:
    from kaudit.results import Submission

_SKIPPED_DIRS = {"__pycache__", "node_modules", "site-packages"}
#: kernel modules, and JSONL result files holding kernels as strings
KERNEL_FILE_SUFFIXES = (".py", ".jsonl")


@dataclass(frozen=True)
class WorkItem:
    file: str  # where to read it
    display: str  # how reports name it: relative to the working directory when under it
    explicit: bool  # named on the command line (scanned even without `ModelNew`)
    text: str | None = None  # the kernel itself, when it lives inside another file (JSONL)
    submission: Submission | None = None  # its place in a benchmark results tree


def display_path(path: str) -> str:
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute, os.getcwd())
    return absolute if relative.startswith("..") else relative


def discover(paths: list[str]) -> tuple[list[WorkItem], list[ScanError]]:
    """Raises FileNotFoundError for a path that does not exist at all (a usage error)."""
    missing = [p for p in paths if not os.path.lexists(p)]
    if missing:
        raise FileNotFoundError(f"no such file or directory: {', '.join(missing)}")
    items: list[WorkItem] = []
    errors: list[ScanError] = []
    seen: set[str] = set()

    def add(file: str, explicit: bool) -> None:
        key = os.path.realpath(file)
        if key not in seen:
            seen.add(key)
            items.append(WorkItem(file, display_path(file), explicit))

    for path in paths:
        if os.path.isdir(path):
            before = len(items)
            _walk(path, add, errors)
            if len(items) == before:
                errors.append(ScanError(display_path(path), "no kernel files (.py, .jsonl) found in this folder"))
        else:
            add(path, explicit=True)
    return items, errors


def _walk(root: str, add, errors: list[ScanError]) -> None:
    visited = {os.path.realpath(root)}

    def on_error(exc: OSError) -> None:
        errors.append(ScanError(display_path(exc.filename or root),
                                f"cannot list folder: {exc.strerror or exc}"))

    for directory, subdirs, files in os.walk(root, followlinks=True, onerror=on_error):
        kept = []
        for name in sorted(subdirs):
            if name.startswith(".") or name in _SKIPPED_DIRS:
                continue
            full = os.path.join(directory, name)
            real = os.path.realpath(full)
            if real in visited:
                errors.append(ScanError(display_path(full),
                                        f"symlink loop: points back to {display_path(real)}; "
                                        "not followed"))
                continue
            visited.add(real)
            kept.append(name)
        subdirs[:] = kept
        for name in sorted(files):
            if name.endswith(KERNEL_FILE_SUFFIXES):
                add(os.path.join(directory, name), explicit=False)
