"""The base of the KP rules: documented like every rule, reported by `kaudit problems` only.

A KP rule keeps the base class's empty `check`, so the static scan never emits it. Its findings
come from `kaudit.dynamic.problems`, which runs the problem in a child process. Its Example is a
problem file run by the problems audit, and its fixtures live in `fixtures/problems/`.
"""

from __future__ import annotations

from typing import ClassVar

from kaudit.rule import Rule


class ProblemRule(Rule):
    audit: ClassVar[str] = "problems"
