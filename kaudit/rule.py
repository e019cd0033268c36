"""The rule framework: what a rule declares, how its docs are read, and how rules are found.

A rule is one module in `rules/` (installed as `kaudit.rules`) holding one `Rule` subclass. Its
docstring is its documentation, in ruff's shape: a one-line summary, then `## What it does`,
`## Why is this bad?` and `## Example` sections. `kaudit explain`, `kaudit rules` and SARIF help
all render that single text. Its fixtures live in `fixtures/rules/<CODE>/`. A rule that can fix
its findings also defines `fix` (Fixit-style): the edits, computed from the finding and the parse,
that `kaudit fix` applies and JSON/SARIF reports carry; its fixtures then include `bad_x.fixed.py`.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kaudit.findings import Finding, Level, Location, Precision
from kaudit.source import SourceModel

if TYPE_CHECKING:  # the fix machinery (libcst) loads only when something is fixed
    from kaudit.fix.editor import Editor
    from kaudit.fix.edits import Fix

CODE_PATTERN = re.compile(r"^K[ADP]\d{3}$")
NAME_PATTERN = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
REQUIRED_SECTIONS = ("What it does", "Why is this bad?", "Example")
FAMILIES = {
    "KA0": "input problems",
    "KA1": "fallback and bypass",
    "KA2": "launch geometry",
    "KA3": "integrity",
    "KA4": "numerics",
    "KD": "dynamic",
    "KP": "benchmark problem",
}


@dataclass(frozen=True)
class RuleDocs:
    summary: str
    sections: dict[str, str]
    markdown: str

    @property
    def what(self) -> str:
        return self.sections["What it does"]

    @property
    def example(self) -> str:
        """The code inside the Example section's first fenced block."""
        match = re.search(r"```(?:python)?\n(.*?)```", self.sections["Example"], re.S)
        return match.group(1) if match else ""


class Rule:
    """Base class. Subclasses set the class attributes and implement `check`."""

    code: ClassVar[str]
    name: ClassVar[str]
    level: ClassVar[Level]
    precision: ClassVar[Precision]
    tags: ClassVar[tuple[str, ...]] = ()
    #: False for rules that report files the engine could not parse or read
    needs_module: ClassVar[bool] = True
    #: which audit reports the rule: "static" (`kaudit scan`) or "problems" (`kaudit problems`)
    audit: ClassVar[str] = "static"

    def check(self, model: SourceModel) -> Iterable[Finding]:
        """The rule's findings for one file. Rules the engine emits itself (KA004) keep this."""
        return ()

    def fix(self, editor: Editor, finding: Finding) -> Fix | None:
        """The edits that make one of this rule's findings go away, computed from the finding and
        the parse (Fixit-style: a rule that can fix declares this). None, or `NoFix` with the
        reason, when there is no safe fix. `kaudit fix` and the JSON/SARIF reports call it."""
        return None

    @classmethod
    def fixable(cls) -> bool:
        return cls.fix is not Rule.fix

    def report(self, model: SourceModel, where: ast.AST | Location, message: str,
               level: Level | None = None, **metrics: object) -> Finding:
        """A finding at `where`; `level`: this one's, when it differs from the rule's."""
        location = where if isinstance(where, Location) else model.location(where)
        return self.finding(location, message, level, **metrics)

    def finding(self, location: Location, message: str, level: Level | None = None,
                **metrics: object) -> Finding:
        return Finding(self.code, self.name, level or self.level, location, message,
                       metrics=dict(metrics))

    @classmethod
    def docs(cls) -> RuleDocs:
        return parse_docs(cls)

    @classmethod
    def family(cls) -> str:
        return FAMILIES.get(cls.code[:3], FAMILIES.get(cls.code[:2], "other"))


@functools.cache
def parse_docs(rule: type[Rule]) -> RuleDocs:
    text = inspect.cleandoc(rule.__doc__ or "")
    summary, _, rest = text.partition("\n")
    sections: dict[str, str] = {}
    for match in re.finditer(r"^## (.+?)\n(.*?)(?=^## |\Z)", rest, re.S | re.M):
        sections[match.group(1).strip()] = match.group(2).strip()
    missing = [s for s in REQUIRED_SECTIONS if s not in sections]
    if missing:
        raise ValueError(f"{rule.code}: docstring lacks section(s) {', '.join(missing)}")
    return RuleDocs(summary.strip(), sections, text)


@functools.cache
def all_rules() -> tuple[type[Rule], ...]:
    """Every rule shipped in `kaudit.rules`, sorted by code; checks that codes and names are unique."""
    from kaudit import rules as package

    found: list[type[Rule]] = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        found.extend(_rules_defined_in(module))
    found.sort(key=lambda r: r.code)
    codes = [r.code for r in found]
    names = [r.name for r in found]
    for rule in found:
        if not CODE_PATTERN.match(rule.code) or not NAME_PATTERN.match(rule.name):
            raise ValueError(f"bad rule code or name: {rule.code} {rule.name}")
    if len(set(codes)) != len(codes) or len(set(names)) != len(names):
        raise ValueError("duplicate rule codes or names")
    return tuple(found)


def _rules_defined_in(module: object) -> Iterator[type[Rule]]:
    for value in vars(module).values():
        if inspect.isclass(value) and issubclass(value, Rule) and value is not Rule \
                and value.__module__ == getattr(module, "__name__", None):
            yield value


def rule_by_code(code: str) -> type[Rule] | None:
    code = code.upper()
    return next((r for r in all_rules() if r.code == code), None)


class InputProblemRule(Rule):
    """Base for the KA0xx rules that report a file kaudit could not read or parse.

    The engine records the problem while loading the file; the rule whose code it names reports it.
    """

    needs_module = False

    def check(self, model: SourceModel) -> Iterable[Finding]:
        problem = model.problem
        if problem is not None and problem.code == self.code:
            yield self.report(model, Location(model.path, problem.line, problem.column),
                              problem.message)
