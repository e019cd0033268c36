"""`kaudit fix PATH...`: applies the fixes (or, with `add_suppressions`, waives the findings in
place) file by file. A file is written only if its bytes are still those that were scanned: the
content hash is compared right before the write, so an editor's save in between is never lost."""

from __future__ import annotations

import difflib
import hashlib
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from kaudit.config import Config, code_matches
from kaudit.discover import NO_KERNEL_FILES, by_file, discover
from kaudit.findings import Finding
from kaudit.fix.engine import Refusal, fix_text
from kaudit.fix.report import fixed_by_default
from kaudit.fix.suppress import add_suppressions
from kaudit.source import MAX_FILE_BYTES, decode_source

_BOM = b"\xef\xbb\xbf"
EXIT_CLEAN, EXIT_CHANGES = 0, 1


def run_fix(paths: list[str], config: Config, select: list[str], *, diff: bool,
            suppress: bool, out: TextIO, err: TextIO) -> int:
    """Fix (or suppress) the findings under `paths`. Returns the exit status: 0 done (or nothing
    to do); 1 with `diff` when something would change, or when a file could not be written.
    Raises FileNotFoundError for a path that does not exist."""
    found = discover(paths)
    for error in found.errors:
        err.write(f"kaudit: {error.path}: {error.message}\n")
    for folder, _documents in found.bare_folders:  # kernels inside .json files are not fixed
        err.write(f"kaudit: {folder}: {NO_KERNEL_FILES}\n")
    wanted = _wanted(config, select, suppress)
    counts: Counter[str] = Counter()
    files = unwritten = 0
    for item, _reached in by_file(found.items):  # a file reached through symlinks is fixed once
        if item.file.endswith(".jsonl"):
            err.write(f"kaudit: {item.display}: kernels inside JSONL records are not fixed\n")
            continue
        try:
            data = Path(item.file).read_bytes() if os.path.getsize(item.file) <= MAX_FILE_BYTES \
                else None
        except OSError as exc:
            err.write(f"kaudit: {item.display}: cannot read: {exc.strerror or exc}\n")
            continue
        text, problem = decode_source(data) if data is not None else (None, None)
        if text is None or problem is not None or not item.explicit and "ModelNew" not in text:
            continue  # the scan reports unreadable files; there is nothing to fix in them
        if suppress:
            outcome = add_suppressions(item.display, text, config, wanted)
            done = [f.rule for f in outcome.suppressed]
        else:
            outcome = fix_text(item.display, text, config, wanted)
            done = [finding.rule for finding, _ in outcome.applied]
        _report_refusals(outcome.refused, err)
        if outcome.text == text:
            continue
        if not diff:
            reason = write_if_unchanged(item.file, hashlib.sha256(data).digest(), outcome.text,
                                        bom=data.startswith(_BOM))  # type: ignore[union-attr]
            if reason:
                unwritten += 1
                err.write(f"kaudit: {item.display}: {reason}\n")
                continue
            out.write(f"{item.display}: {'suppressed' if suppress else 'fixed'} "
                      f"{_count_text(Counter(done))}\n")
        else:
            out.writelines(_unified_diff(item.display, text, outcome.text))
        files += 1
        counts.update(done)
    _summary(counts, files, unwritten, diff=diff, suppress=suppress, stream=err if diff else out)
    if unwritten:
        return EXIT_CHANGES
    return EXIT_CHANGES if diff and files else EXIT_CLEAN


def _wanted(config: Config, select: list[str], suppress: bool) -> Callable[[Finding], bool]:
    """Which findings to act on: with `--select`, those of the codes named; without, the fixes
    of errors, warnings and KA004, and suppressions for every finding of an enabled rule."""
    def wanted(finding: Finding) -> bool:
        if not config.is_enabled(finding.rule):
            return False
        if select:
            return any(code_matches(pattern, finding.rule) for pattern in select)
        return suppress or fixed_by_default(finding)
    return wanted


def write_if_unchanged(file: str, digest: bytes, text: str, *, bom: bool = False) -> str | None:
    """Write `text` over `file` (through a symlink, keeping its mode) if its content still
    hashes to `digest`; else, or on failure, say why."""
    target = os.path.realpath(file)
    try:
        if hashlib.sha256(Path(target).read_bytes()).digest() != digest:
            return "changed since it was scanned; not written"
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(target),
                                             prefix=f".{os.path.basename(target)}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write((_BOM if bom else b"") + text.encode("utf-8", "surrogatepass"))
            shutil.copymode(target, temporary)
            os.replace(temporary, target)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        return f"cannot write: {exc.strerror or exc}"
    return None


def _unified_diff(display: str, old: str, new: str) -> list[str]:
    lines = []
    for line in difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                     f"a/{display}", f"b/{display}"):
        lines.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return lines


def _report_refusals(refused: list[Refusal], err: TextIO) -> None:
    for refusal in refused:
        finding = refusal.finding
        err.write(f"{finding.path}:{finding.line}: {finding.rule} not fixed: {refusal.reason}\n")


def _count_text(counts: Counter[str]) -> str:
    total = sum(counts.values())
    detail = ", ".join(f"{code} ×{n}" if n > 1 else code for code, n in sorted(counts.items()))
    return f"{total} finding{'s' if total != 1 else ''} ({detail})"


def _summary(counts: Counter[str], files: int, unwritten: int, *, diff: bool, suppress: bool,
             stream: TextIO) -> None:
    verb = "suppressed" if suppress else "fixed"
    if not files:
        stream.write(f"kaudit: nothing {'to suppress' if suppress else 'to fix'}\n")
    else:
        plural = "s" if files != 1 else ""
        stream.write(f"kaudit: {'would have ' if diff else ''}{verb} {_count_text(counts)} in "
                     f"{files} file{plural}\n")
    if unwritten:
        stream.write(f"kaudit: {unwritten} file{'s' if unwritten != 1 else ''} not written\n")
