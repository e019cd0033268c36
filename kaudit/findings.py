"""The finding model: what every rule produces and every reporter renders.

Positions follow SARIF: lines and columns are 1-based and the end column is exclusive.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any


class Level(str, enum.Enum):
    """How serious a finding is; the values are SARIF's result levels."""

    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"

    @property
    def rank(self) -> int:
        return {"note": 1, "warning": 2, "error": 3}[self.value]


class Precision(str, enum.Enum):
    """How often a finding of the rule is a true positive; SARIF's `precision` property."""

    VERY_HIGH = "very-high"
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


@dataclass(frozen=True)
class Location:
    path: str
    line: int = 1
    column: int = 1
    end_line: int | None = None
    end_column: int | None = None

    def __post_init__(self) -> None:
        if self.end_line is None:
            object.__setattr__(self, "end_line", self.line)
        if self.end_column is None:
            object.__setattr__(self, "end_column", self.column)


@dataclass(frozen=True)
class Finding:
    """One problem found in one place. Plain data: `to_dict()` is its JSON form."""

    rule: str
    name: str
    level: Level
    location: Location
    message: str
    pass_: str = "static"
    fingerprint: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    #: against a baseline of accepted findings: "new" or "unchanged"; "" without a baseline
    baseline_state: str = ""
    #: the edits that would make it go away (`kaudit.fix`: JSON and SARIF reports attach them)
    fix: dict[str, Any] | None = None

    @property
    def path(self) -> str:
        return self.location.path

    @property
    def line(self) -> int:
        return self.location.line

    def to_dict(self) -> dict[str, Any]:
        loc = self.location
        data: dict[str, Any] = {
            "rule": self.rule,
            "name": self.name,
            "level": self.level.value,
            "path": loc.path,
            "line": loc.line,
            "column": loc.column,
            "end_line": loc.end_line,
            "end_column": loc.end_column,
            "message": self.message,
            "pass": self.pass_,
            "fingerprint": self.fingerprint,
        }
        if self.metrics:
            data["metrics"] = self.metrics
        if self.baseline_state:
            data["baseline_state"] = self.baseline_state
        if self.fix:
            data["fix"] = self.fix
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(
            rule=data["rule"],
            name=data["name"],
            level=Level(data["level"]),
            location=Location(
                data["path"], data["line"], data["column"], data["end_line"], data["end_column"]
            ),
            message=data["message"],
            pass_=data.get("pass", "static"),
            fingerprint=data.get("fingerprint", ""),
            metrics=data.get("metrics", {}),
            baseline_state=data.get("baseline_state", ""),
            fix=data.get("fix"),
        )

    def with_path(self, path: str) -> Finding:
        return dataclasses.replace(self, location=dataclasses.replace(self.location, path=path))


@dataclass
class ScanError:
    """Something that stopped part of a scan and has no place in a file (or broke kaudit itself)."""

    path: str
    message: str
    internal: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "message": self.message, "internal": self.internal}


def assign_fingerprints(findings: list[Finding], lines_of: dict[str, list[str]]) -> list[Finding]:
    """Give each finding a fingerprint that survives unrelated edits elsewhere in the file.

    The hash covers the rule, the path and the whitespace-normalised text of the finding's line, not
    its number; identical lines are told apart by their order (GitHub's `hash:occurrence` form).
    """
    seen: dict[str, int] = {}
    result = []
    for finding in findings:
        lines = lines_of.get(finding.path, [])
        text = lines[finding.line - 1] if 0 < finding.line <= len(lines) else ""
        key = "\0".join((finding.rule, finding.path, " ".join(text.split())))
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        seen[digest] = seen.get(digest, 0) + 1
        result.append(dataclasses.replace(finding, fingerprint=f"{digest}:{seen[digest]}"))
    return result
