"""Runs the static rules over one file and turns the result into findings: the heart of a scan.

Everything that can go wrong with one file (unreadable, unparsable, a rule that crashes) ends up as
a finding or a `ScanError` for that file; the scan of the other files goes on.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kaudit.config import Config
from kaudit.entry import MODEL_NEW, EntryPoint
from kaudit.findings import Finding, ScanError, assign_fingerprints
from kaudit.rule import Rule, all_rules, rule_by_code
from kaudit.source import SourceModel, decode_source, prepare_grammar, read_source, split_lines
from kaudit.suppressions import Suppression, apply_suppressions

MARKER = "ModelNew"


@dataclass
class FileResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    errors: list[ScanError] = field(default_factory=list)
    skipped: bool = False
    #: other files the result depends on (extension sources on disk) -> their sha256
    dependencies: dict[str, str] = field(default_factory=dict)


@functools.cache
def _enabled_rules(config: Config) -> tuple[Rule, ...]:
    return tuple(rule() for rule in all_rules()
                 if rule.audit == "static" and config.is_enabled(rule.code))


@contextlib.contextmanager
def scanning(config: Config) -> Iterator[None]:
    """The setting of a scan of many files. The enabled rules (and what they import) and the
    grammar are loaded first, so that worker processes forked inside share them; and the cycle
    collector leaves those long-lived objects alone and runs less often (each file's analyses are
    released when its scan ends, see `scan_text`), which saves about a fifth of a scan."""
    _enabled_rules(config)
    prepare_grammar()
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(_GC_YOUNG_OBJECTS, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


#: allocations between two collections of the youngest generation during a scan (default 700)
_GC_YOUNG_OBJECTS = 20_000


def check_model(model: SourceModel, config: Config) -> FileResult:
    """All enabled rules over one model, then per-file ignores, suppressions and fingerprints."""
    result = FileResult(model.path)
    findings: list[Finding] = []
    for rule in _enabled_rules(config):
        if rule.needs_module and model.module is None:
            continue
        try:
            findings.extend(rule.check(model))
        except Exception as exc:  # a rule bug must not end the scan
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            result.errors.append(ScanError(
                model.path, f"internal error in {rule.code}: {exc.__class__.__name__}: {exc} "
                f"({Path(frame.filename).name}:{frame.lineno})", internal=True))
    findings = [f for f in findings if not config.is_ignored_for(f.path, f.rule)]
    lines_of = {model.path: model.lines}
    lines_of.update({path: split_lines(text) for path, text in model.other_files.items()})
    findings = apply_suppressions(findings, lines_of, config.is_enabled, _unused_suppression)
    findings.sort(key=lambda f: (f.path, f.line, f.location.column, f.rule))
    result.findings = assign_fingerprints(findings, lines_of)
    result.dependencies = {path: digest_file(path) or "" for path in model.other_files}
    return result


def digest_file(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _unused_suppression(suppression: Suppression) -> Finding:
    rule = rule_by_code("KA004")
    assert rule is not None
    if suppression.used:  # only some of its codes matched nothing
        unused = ", ".join(suppression.unused_codes)
        return rule().finding(suppression.location, f"{unused} in this suppression matches no "
                              "finding; remove it from the list",
                              unused_codes=list(suppression.unused_codes))
    named = ", ".join(suppression.codes) if suppression.codes else "any rule"
    return rule().finding(suppression.location,
                            f"this suppression of {named} matches no finding; remove it",
                            unused_codes=list(suppression.unused_codes))


def scan_text(text: str | bytes, display: str, config: Config,
              entry: EntryPoint = MODEL_NEW) -> FileResult:
    if isinstance(text, bytes):
        decoded, problem = decode_source(text)
        return _check_and_release(SourceModel(display, decoded, problem, entry, config.policy),
                                  config)
    return _check_and_release(SourceModel(display, text, entry=entry, policy=config.policy), config)


def _check_and_release(model: SourceModel, config: Config) -> FileResult:
    try:
        return check_model(model, config)
    finally:
        model.release()


def scan_file(file: str, display: str, explicit: bool, config: Config,
              entry: EntryPoint = MODEL_NEW) -> FileResult:
    """One file from disk. Files found by walking a folder are skipped unless they name ModelNew;
    a file an adapter named as a benchmark's candidate (another entry point) is always scanned."""
    try:
        text, problem = read_source(Path(file))
        if text is not None and not explicit and entry == MODEL_NEW and MARKER not in text:
            return FileResult(display, skipped=True)
        return _check_and_release(SourceModel(display, text, problem, entry, config.policy), config)
    except Exception as exc:  # never a traceback for one bad file
        return FileResult(display, errors=[ScanError(
            display, f"internal error: {exc.__class__.__name__}: {exc}", internal=True)])
