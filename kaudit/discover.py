"""Paths -> the files to scan. Folders are walked recursively in natural order (problem 2 before
problem 10; hidden folders and `__pycache__` skipped) and symlinks are followed; a symlink back to
a folder being walked is a loop, reported instead of followed.

Every path that reaches a file is kept, because benchmark runs share kernels through symlinks
(a re-timed run linking to another run's `generated_kernels/`) and each run must count its own
kernels. Items reaching the same file share an `identity`, so the file is scanned once; the same
path reached twice (overlapping arguments such as `run run/generated_kernels`) is one item."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kaudit.findings import ScanError

if TYPE_CHECKING:
    from kaudit.results import Submission

_SKIPPED_DIRS = {"__pycache__", "node_modules", "site-packages"}
#: kernel modules, and JSONL result files holding kernels as strings
KERNEL_FILE_SUFFIXES = (".py", ".jsonl")
#: files and folders that hold what a benchmark run claimed (read by kaudit.results)
CLAIM_NAMES = ("eval_results.json", "per_problem")


@dataclass(frozen=True)
class WorkItem:
    file: str  # where to read it
    display: str  # how reports name it: relative to the working directory when under it
    explicit: bool  # named on the command line (scanned even without `ModelNew`)
    text: str | None = None  # the kernel itself, when it lives inside another file (JSONL)
    submission: Submission | None = None  # its place in a benchmark results tree
    #: what is scanned: the real path of the file (plus `#L<n>` for a JSONL record); items
    #: reaching the same file through symlinks share it. "" outside `discover` (nothing shared)
    identity: str = ""

    @property
    def key(self) -> str:
        return self.identity or self.display


@dataclass
class Discovery:
    items: list[WorkItem] = field(default_factory=list)
    errors: list[ScanError] = field(default_factory=list)
    #: `eval_results.json` files and `per_problem/` folders met on the way (claims of runs)
    claims: list[str] = field(default_factory=list)
    #: other `.json` files met on the way: other benchmarks' claims and kernels
    #: (`kaudit.adapters` decides which are theirs)
    documents: list[str] = field(default_factory=list)
    #: folders named to scan that hold no kernel file but `.json` files, with those files: an
    #: error unless an adapter finds kernels in them (a CUDA-L1 release's `optimized_cuda_code/`)
    bare_folders: list[tuple[str, list[str]]] = field(default_factory=list)


NO_KERNEL_FILES = "no kernel files (.py, .jsonl) found in this folder"


def display_path(path: str) -> str:
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute, os.getcwd())
    return absolute if relative.startswith("..") else relative


def natural_key(text: str) -> list:
    """Sort key putting "problem_2" before "problem_10"."""
    return [(1, int(part), "") if part.isdigit() else (0, 0, part)
            for part in re.split(r"(\d+)", text)]


def discover(paths: list[str]) -> Discovery:
    """Raises FileNotFoundError for a path that does not exist at all (a usage error)."""
    missing = [p for p in paths if not os.path.lexists(p)]
    if missing:
        raise FileNotFoundError(f"no such file or directory: {', '.join(missing)}")
    found = Discovery()
    index: dict[str, int] = {}

    def add(file: str, explicit: bool) -> None:
        display = display_path(file)
        if display in index:  # the same path again: named twice, or inside two arguments
            position = index[display]
            if explicit:
                found.items[position] = replace(found.items[position], explicit=True)
            return
        index[display] = len(found.items)
        found.items.append(WorkItem(file, display, explicit, identity=os.path.realpath(file)))

    for path in paths:
        if os.path.isdir(path):
            known = len(found.documents)
            if not _walk(path, add, found):
                if found.documents[known:]:
                    found.bare_folders.append((display_path(path), found.documents[known:]))
                else:
                    found.errors.append(ScanError(display_path(path), NO_KERNEL_FILES))
        else:
            add(path, explicit=True)
    return found


def _walk(root: str, add, found: Discovery) -> int:
    """Depth first, a folder's files before its subfolders; returns the kernel files reached."""
    count = 0
    stack = [(root, (os.path.realpath(root),))]
    while stack:
        directory, ancestors = stack.pop()
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda e: natural_key(e.name))
        except OSError as exc:
            found.errors.append(ScanError(display_path(exc.filename or directory),
                                          f"cannot list folder: {exc.strerror or exc}"))
            continue
        subfolders = []
        for entry in entries:
            if _is_dir(entry):
                if entry.name in CLAIM_NAMES:
                    found.claims.append(entry.path)
                if entry.name.startswith(".") or entry.name in _SKIPPED_DIRS:
                    continue
                real = os.path.realpath(entry.path)
                if real in ancestors:
                    found.errors.append(ScanError(
                        display_path(entry.path),
                        f"symlink loop: points back to {display_path(real)}; not followed"))
                    continue
                subfolders.append((entry.path, (*ancestors, real)))
            elif entry.name.endswith(KERNEL_FILE_SUFFIXES):
                add(entry.path, explicit=False)
                count += 1
            elif entry.name in CLAIM_NAMES:
                found.claims.append(entry.path)
            elif entry.name.endswith(".json"):
                found.documents.append(entry.path)
        stack.extend(reversed(subfolders))
    return count


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows symlinks
    except OSError:
        return False


def by_file(items: list[WorkItem]) -> list[tuple[WorkItem, list[WorkItem]]]:
    """Items grouped by the file they reach, in order of first appearance: (the item to scan,
    every item reaching that file). The scanned one names the findings: the path with no
    symlink on it when one reaches the file, else the first; it is explicit when any is."""
    groups: dict[str, list[WorkItem]] = {}
    for item in items:
        groups.setdefault(item.key, []).append(item)
    scanned = []
    for reached in groups.values():
        direct = [i for i in reached if os.path.realpath(i.file) == os.path.abspath(i.file)]
        first = (direct or reached)[0]
        scanned.append((replace(first, explicit=any(i.explicit for i in reached)), reached))
    return scanned
