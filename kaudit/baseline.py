"""Baselines, bandit-style: findings accepted earlier, matched on rule, path and fingerprint (never
the line number), so a baseline survives edits elsewhere in a file. Findings not in the baseline
are "new"; only new findings count for `--fail-on`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from kaudit import __version__
from kaudit.findings import Finding

FORMAT = "kaudit-baseline/1"


def _key(finding: Finding) -> tuple[str, str, str]:
    return finding.rule, finding.path, finding.fingerprint


def write_baseline(findings: list[Finding], path: str) -> int:
    entries = sorted({_key(f) for f in findings})
    Path(path).write_text(json.dumps({
        "format": FORMAT, "tool": {"name": "kaudit", "version": __version__},
        "findings": [{"rule": r, "path": p, "fingerprint": fp} for r, p, fp in entries],
    }, indent=2) + "\n", encoding="utf-8")
    return len(entries)


def load_baseline(path: str) -> set[tuple[str, str, str]]:
    """Raises ValueError when the file is not a kaudit baseline."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read baseline {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a kaudit baseline (written by `kaudit baseline write`)")
    return {(e["rule"], e["path"], e["fingerprint"]) for e in data.get("findings", [])
            if isinstance(e, dict) and {"rule", "path", "fingerprint"} <= e.keys()}


def mark_findings(findings: list[Finding], known: set[tuple[str, str, str]]) -> list[Finding]:
    return [dataclasses.replace(f, baseline_state="unchanged" if _key(f) in known else "new")
            for f in findings]
