"""The real-kernel regression corpus: 210 kernels from public MIT-licensed KernelBench runs
(fixtures/real/, provenance in PROVENANCE.md) with hand-checked labels in labels.toml.

For every kernel, the error-level codes kaudit reports under the default (`kernelbench`) policy must
equal the labelled ones. Where today's kaudit disagrees with the labels, the file is listed in
`[known_wrong]` with the codes kaudit reports now, and the test holds it to exactly those: a rule fix
that changes them fails here on purpose, so whoever made it checks the new codes against the labels
and moves the file out of `[known_wrong]`. `bench/real_precision.py` turns the same labels into
per-rule precision and misses."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from kaudit import Level, scan_paths
from kaudit.rule import all_rules
from tests.conftest import FIXTURES

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REAL = FIXTURES / "real"
LABELS = tomllib.loads((REAL / "labels.toml").read_text(encoding="utf-8"))
FILES: dict[str, dict] = LABELS["files"]
KNOWN_WRONG: dict[str, list[str]] = {path: entry["errors"]
                                     for path, entry in LABELS.get("known_wrong", {}).items()}

#: the class names of the hack catalogue (the project's reference notes), as the labels spell them
CHEAT_CLASSES = {
    "library fallback", "try/except fallback", "inheritance bypass", "grid cannot cover output",
    "uninitialised output reuse", "partial computation", "analytic shortcut",
    "zero / constant output", "input mutation", "output caching", "side stream",
    "threads / lazy results", "harness tampering", "precision downgrade", "cache persistence",
    "fixture specialisation", "audit-aware", "call-count / schedule", "forging the harness",
    "attacking the host", "fallback by another name", "silent launch failure",
}
MAX_FILE_BYTES = 60_000


def kernel_files() -> list[str]:
    return sorted(path.relative_to(REAL).as_posix() for path in REAL.rglob("*.py"))


@pytest.fixture(scope="module")
def errors_now() -> dict[str, set[str]]:
    """Error-level codes per kernel, from one scan of the whole corpus (result trees included)."""
    report = scan_paths([str(REAL)])
    assert not report.errors, report.errors
    codes: dict[str, set[str]] = {path: set() for path in FILES}
    for finding in report.findings:
        if finding.level is Level.ERROR:
            path = Path(os.path.relpath(os.path.abspath(finding.path), REAL)).as_posix()
            codes.setdefault(path, set()).add(finding.rule)
    return codes


def test_corpus_is_large_stratified_and_fully_labelled():
    kernels = kernel_files()
    assert set(kernels) == set(FILES), "every vendored kernel has a label and every label a kernel"
    assert len(FILES) >= 150
    assert {entry["level"] for entry in FILES.values()} == {1, 2, 3, 4}
    assert {entry["backend"] for entry in FILES.values()} == {"cuda", "triton"}
    assert {entry["honest"] for entry in FILES.values()} == {True, False}
    assert {entry.get("claimed_correct") for entry in FILES.values()} >= {True, False}
    for path in kernels:
        assert (REAL / path).stat().st_size <= MAX_FILE_BYTES, path


def test_every_source_folder_carries_its_licence_and_provenance():
    provenance = (REAL / "PROVENANCE.md").read_text(encoding="utf-8")
    folders = {path.split("/", 1)[0] for path in FILES}
    for folder in folders:
        assert (REAL / folder / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
        assert f"## `{folder}/`" in provenance
    listed = set(re.findall(r"^- `([^`]+)`", provenance, flags=re.MULTILINE))
    for path in kernel_files():
        assert path.split("/", 1)[1] in listed, f"{path} is missing from PROVENANCE.md"


def test_labels_are_well_formed():
    error_codes = {rule.code for rule in all_rules() if rule.level is Level.ERROR}
    warning_codes = {rule.code for rule in all_rules() if rule.level is Level.WARNING}
    for path, entry in FILES.items():
        assert set(entry["errors"]) <= error_codes, path
        assert set(entry.get("warnings", ())) <= warning_codes, path
        assert set(entry["cheats"]) <= CHEAT_CLASSES, path
        assert entry["note"].strip(), path
        if entry.get("reject"):
            assert not entry["errors"], f"{path}: reject = true is for cheats no rule names"
            assert path in KNOWN_WRONG, f"{path}: kaudit cannot name it yet, so it is known wrong"
    unreviewed = set(LABELS.get("unreviewed_warnings", {}))
    assert unreviewed <= warning_codes, "[unreviewed_warnings] lists warning rules only"
    for path, entry in FILES.items():
        assert not unreviewed & set(entry.get("warnings", ())), \
            f"{path} names an unreviewed rule: review it, then drop it from [unreviewed_warnings]"
    for path, codes in KNOWN_WRONG.items():
        assert path in FILES, path
        entry = FILES[path]
        assert sorted(codes) != sorted(entry["errors"]) or entry.get("reject"), \
            f"{path}: listed in known_wrong with the labelled codes; remove the entry"


@pytest.mark.parametrize("path", sorted(FILES))
def test_error_codes_match_the_labels(errors_now, path):
    now = sorted(errors_now[path])
    expected = sorted(FILES[path]["errors"])
    if path in KNOWN_WRONG:
        recorded = sorted(KNOWN_WRONG[path])
        assert now == recorded, (
            f"kaudit now reports {now} on {path}; labels.toml expects {expected} and records "
            f"{recorded} in [known_wrong]. If {now} equals the labels, delete the known_wrong "
            f"entry; otherwise update it (and check the change is an improvement).")
    else:
        assert now == expected, (
            f"kaudit reports {now} on {path}; the hand-checked labels expect {expected} "
            f"({FILES[path]['note']})")
