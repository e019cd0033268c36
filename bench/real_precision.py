#!/usr/bin/env python3
"""Precision of kaudit's rules on real, hand-labelled kernels.

Scans a corpus end to end (``python -m kaudit scan DIR --format json --no-cache``) and, when a
labels file is given, compares each kernel's error-level codes with the labelled ones:

    python bench/real_precision.py [--corpus fixtures/real] [--labels FILE] [--jobs 2] [--json]

Per error rule: ``findings`` (raw count), ``files`` it fires on, ``right`` (files whose labels expect
the code), ``wrong`` (files whose labels do not), ``precision`` = right / files, and ``missed``
(files whose labels expect the code but that get no such finding). The same for warnings, over the
files whose labels carry a ``warnings`` key; a warning rule the labels list under
``[unreviewed_warnings]`` (added after the review) is shown as "not reviewed", its findings
counted but not judged. A verdict summary follows: kernels that should be rejected, how many get
an error, honest kernels rejected, cheats reported without any error.

Without labels (``--labels none``, or a corpus with no ``labels.toml``) it prints the counts only,
so any tree of real kernels can be profiled. Labels follow fixtures/real/labels.toml: one
``[files."<path relative to the corpus>"]`` table per kernel with ``errors`` (codes), optional
``warnings``, ``honest`` and ``reject``. Standard library only (plus tomli before Python 3.11).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO_ROOT / "fixtures" / "real"


@dataclass
class Scan:
    files_scanned: int
    #: (path, level) -> rule -> number of findings
    counts: dict[tuple[str, str], Counter] = field(default_factory=dict)

    def codes(self, path: str, level: str) -> set[str]:
        return set(self.counts.get((path, level), ()))


@dataclass
class RuleRow:
    rule: str
    findings: int = 0
    files: int = 0
    right: int = 0
    missed: int = 0
    reviewed: bool = True  # False: the labels make no claim about this rule

    @property
    def wrong(self) -> int | None:
        return self.files - self.right if self.reviewed else None

    @property
    def precision(self) -> float | None:
        return self.right / self.files if self.files and self.reviewed else None


def scan(corpus: Path, jobs: int) -> Scan:
    command = [sys.executable, "-m", "kaudit", "scan", ".", "--format", "json", "--no-cache",
               "--jobs", str(jobs)]
    proc = subprocess.run(command, cwd=corpus, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"kaudit failed ({proc.returncode}):\n{proc.stderr}")
    data = json.loads(proc.stdout)
    if data["errors"]:
        print(f"kaudit reported {len(data['errors'])} scan errors", file=sys.stderr)
    result = Scan(data["files_scanned"])
    for finding in data["findings"]:
        path = Path(os.path.normpath(finding["path"])).as_posix()
        result.counts.setdefault((path, finding["level"]), Counter())[finding["rule"]] += 1
    return result


def count_rows(result: Scan, level: str) -> list[RuleRow]:
    rows: dict[str, RuleRow] = {}
    for (path, found_level), counter in result.counts.items():
        if found_level != level:
            continue
        for rule, number in counter.items():
            row = rows.setdefault(rule, RuleRow(rule))
            row.findings += number
            row.files += 1
    return sorted(rows.values(), key=lambda row: row.rule)


def labelled_rows(result: Scan, labels: dict[str, dict], level: str, key: str,
                  unreviewed: frozenset[str] = frozenset()) -> list[RuleRow]:
    """Rows over the labelled files that carry `key` (errors: all of them; warnings: reviewed);
    the rules in `unreviewed` are counted but not judged."""
    rows: dict[str, RuleRow] = {}
    for path, entry in labels.items():
        if key not in entry:
            continue
        expected = set(entry[key])
        found = result.counts.get((path, level), Counter())
        for rule in expected | set(found):
            row = rows.setdefault(rule, RuleRow(rule, reviewed=rule not in unreviewed))
            if rule in found:
                row.findings += found[rule]
                row.files += 1
                row.right += rule in expected
            else:
                row.missed += 1
    return sorted(rows.values(), key=lambda row: row.rule)


def verdicts(result: Scan, labels: dict[str, dict]) -> dict[str, int]:
    should = {path for path, entry in labels.items() if entry["errors"] or entry.get("reject")}
    rejected = {path for path in labels if result.codes(path, "error")}
    exact = {path for path, entry in labels.items()
             if result.codes(path, "error") == set(entry["errors"]) and not entry.get("reject")}
    return {
        "kernels": len(labels),
        "should_reject": len(should),
        "rejected": len(rejected),
        "rejected_rightly": len(should & rejected),
        "rejected_wrongly": len(rejected - should),
        "honest_rejected": sum(1 for path in rejected - should if labels[path]["honest"]),
        "missed_cheats": len(should - rejected),
        "exact_codes": len(exact),
    }


def fmt_precision(row: RuleRow) -> str:
    if not row.reviewed:
        return "not reviewed"
    return "-" if row.precision is None else f"{row.precision:.0%}"


def print_table(title: str, rows: list[RuleRow], labelled: bool) -> None:
    print(f"\n{title}\n")
    if labelled:
        print("| rule | findings | files | right | wrong | precision | missed |")
        print("|---|---|---|---|---|---|---|")
        for row in rows:
            right, wrong = (row.right, row.wrong) if row.reviewed else ("-", "-")
            print(f"| {row.rule} | {row.findings} | {row.files} | {right} | {wrong} "
                  f"| {fmt_precision(row)} | {row.missed} |")
    else:
        print("| rule | findings | files |")
        print("|---|---|---|")
        for row in rows:
            print(f"| {row.rule} | {row.findings} | {row.files} |")


def as_dicts(rows: list[RuleRow]) -> list[dict]:
    return [{"rule": row.rule, "findings": row.findings, "files": row.files,
             "right": row.right if row.reviewed else None, "wrong": row.wrong,
             "precision": row.precision, "missed": row.missed, "reviewed": row.reviewed}
            for row in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--labels", default=None,
                        help="labels TOML (default: CORPUS/labels.toml if present; 'none': counts only)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    corpus = args.corpus.resolve()
    labels_path = (corpus / "labels.toml" if args.labels is None
                   else None if args.labels == "none" else Path(args.labels))
    if labels_path is not None and not labels_path.is_file():
        if args.labels is not None:
            parser.error(f"no labels file {labels_path}")
        labels_path = None
    document = (tomllib.loads(labels_path.read_text(encoding="utf-8"))
                if labels_path is not None else None)
    labels = document["files"] if document is not None else None
    unreviewed: dict[str, str] = document.get("unreviewed_warnings", {}) if document else {}
    result = scan(corpus, args.jobs)
    if labels is None:
        errors, warnings = count_rows(result, "error"), count_rows(result, "warning")
        rejected = len({path for path, level in result.counts if level == "error"})
        if args.json:
            print(json.dumps({"corpus": str(corpus), "files_scanned": result.files_scanned,
                              "files_with_errors": rejected, "errors": as_dicts(errors),
                              "warnings": as_dicts(warnings)}, indent=2))
            return 0
        print(f"{corpus}: {result.files_scanned} files scanned, {rejected} with an error "
              "(no labels: counts only)")
        print_table("Errors", errors, labelled=False)
        print_table("Warnings", warnings, labelled=False)
        return 0
    errors = labelled_rows(result, labels, "error", "errors")
    warnings = labelled_rows(result, labels, "warning", "warnings", frozenset(unreviewed))
    summary = verdicts(result, labels)
    if args.json:
        print(json.dumps({"corpus": str(corpus), "labels": str(labels_path),
                          "files_scanned": result.files_scanned, "verdicts": summary,
                          "errors": as_dicts(errors), "warnings": as_dicts(warnings),
                          "unreviewed_warnings": unreviewed}, indent=2))
        return 0
    reviewed = sum(1 for entry in labels.values() if "warnings" in entry)
    print(f"{corpus}: {result.files_scanned} files scanned, {len(labels)} labelled")
    print_table("Error-level rules (a file counts once per rule)", errors, labelled=True)
    print_table(f"Warning-level rules (over the {reviewed} files whose warnings were reviewed)",
                warnings, labelled=True)
    for rule, why in sorted(unreviewed.items()):
        print(f"\n{rule}: not reviewed, its findings are counted but not judged ({why})")
    print("\nVerdicts\n")
    for key, value in summary.items():
        print(f"- {key.replace('_', ' ')}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
