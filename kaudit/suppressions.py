"""Inline suppressions: `# kaudit: ignore[KA101]` in Python, `// kaudit: ignore[KA2xx]` inside
C++/CUDA sources, on the line a finding starts. A bare `kaudit: ignore` silences every rule on its
line. Suppressions that silence nothing, and codes in a suppression's list that silence nothing,
become KA004 notes."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from kaudit.config import ConfigError, code_matches, normalise_pattern
from kaudit.findings import Finding, Location

_IGNORE = re.compile(r"kaudit:\s*ignore\b(?:\[([^\]]*)\])?")


@dataclass
class Suppression:
    location: Location
    codes: tuple[str, ...]  # empty: every rule
    used: bool = False
    #: the codes of `codes` that matched a finding
    used_codes: set[str] = field(default_factory=set)
    #: after `apply_suppressions`: enabled codes of `codes` that matched nothing (all of them, or
    #: empty for a bare suppression, when the whole suppression is unused)
    unused_codes: tuple[str, ...] = ()

    def covers(self, code: str) -> bool:
        return not self.codes or any(code_matches(pattern, code) for pattern in self.codes)

    def mark_used(self, code: str) -> None:
        self.used = True
        self.used_codes.update(p for p in self.codes if code_matches(p, code))


def parse_suppressions(path: str, lines: list[str]) -> list[Suppression]:
    found = []
    for number, line in enumerate(lines, start=1):
        if "kaudit" not in line:
            continue
        for match in _IGNORE.finditer(line):
            codes = tuple(c.strip() for c in (match.group(1) or "").split(",") if c.strip())
            try:
                for code in codes:
                    normalise_pattern(code)
            except ConfigError:
                continue  # not a suppression we understand; leave the line alone
            found.append(Suppression(
                Location(path, number, match.start() + 1, number, match.end() + 1), codes))
    return found


def apply_suppressions(
    findings: list[Finding],
    lines_of: dict[str, list[str]],
    is_enabled: Callable[[str], bool],
    unused_finding: Callable[[Suppression], Finding],
) -> list[Finding]:
    """Drop suppressed findings; add a finding for each suppression that matched nothing enabled."""
    table: dict[tuple[str, int], list[Suppression]] = {}
    for path, lines in lines_of.items():
        for suppression in parse_suppressions(path, lines):
            table.setdefault((path, suppression.location.line), []).append(suppression)
    kept = []
    for finding in findings:
        covering = [s for s in table.get((finding.path, finding.line), []) if s.covers(finding.rule)]
        for suppression in covering:
            suppression.mark_used(finding.rule)
        if not covering:
            kept.append(finding)
    for suppressions in table.values():
        for suppression in suppressions:
            enabled = [code for code in suppression.codes
                       if is_enabled(normalise_pattern(code).ljust(5, "0"))]
            unused = [code for code in enabled if code not in suppression.used_codes]
            if not suppression.used and (enabled or not suppression.codes) or unused:
                suppression.unused_codes = tuple(unused)
                kept.append(unused_finding(suppression))
    return kept
