"""Applies the rules' fixes to one file's text.

A fix is kept only when, applied alone, the file still parses (Python, and the C++ of its
extensions gains no parse error), its finding is no longer reported, and no rule reports more
findings than before (a ceiling-divided grid that would now run past an unguarded store draws
KA204, so it is dropped). Fixes whose edits overlap are never applied in the same pass; passes
repeat, on the text each pass produced, until no fix is left to apply.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from kaudit.config import Config
from kaudit.engine import check_model
from kaudit.findings import Finding
from kaudit.fix.editor import Editor
from kaudit.fix.edits import Fix, NoFix, apply_edits
from kaudit.rule import Rule, rule_by_code
from kaudit.source import SourceModel

#: enough for fixes that uncover further ones (a 2-D grid's second axis), and a bound on loops
MAX_PASSES = 20


@dataclass
class Refusal:
    """A finding whose fix was not applied, and why."""

    finding: Finding
    reason: str


@dataclass
class FixResult:
    text: str
    #: (the finding as reported in the pass that fixed it, its fix)
    applied: list[tuple[Finding, Fix]] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)


def every_rule(config: Config) -> Config:
    """A fix is judged by all the rules, whatever the user selected."""
    return dataclasses.replace(config, select=(), ignore=())


def fix_text(path: str, text: str, config: Config, wanted: Callable[[Finding], bool]
             ) -> FixResult:
    """`text` (the file `path`) with the fixes of the `wanted` findings applied."""
    config = every_rule(config)
    result = FixResult(text)
    refused: dict[tuple[str, str], Refusal] = {}
    for _ in range(MAX_PASSES):
        model = SourceModel(path, result.text, policy=config.policy)
        if model.problem is not None:
            break
        findings = check_model(model, config).findings
        editor = Editor(model)
        chosen: list[tuple[Finding, Fix]] = []
        for finding in findings:
            rule = fixing_rule(finding)
            if rule is None or finding.path != path or not wanted(finding) \
                    or (finding.rule, finding.message) in refused:
                continue
            try:
                fix = make_fix(rule, editor, finding)
                if fix is None or any(fix.overlaps(other) for _, other in chosen):
                    continue  # none, or the next pass applies it on the changed text
                reason = judge(model, findings, apply_edits(result.text, fix.edits), config,
                               [finding])
                if reason:
                    raise NoFix(reason)
            except NoFix as exc:
                refused[(finding.rule, finding.message)] = Refusal(finding, str(exc))
                continue
            chosen.append((finding, fix))
        if not chosen:
            break
        changed = apply_edits(result.text, [edit for _, fix in chosen for edit in fix.edits])
        if len(chosen) > 1 and judge(model, findings, changed, config, [f for f, _ in chosen]):
            # each was fine alone but not together: one now, the rest in the next pass
            chosen = chosen[:1]
            changed = apply_edits(result.text, chosen[0][1].edits)
        result.text = changed
        result.applied.extend(chosen)
    result.refused = list(refused.values())
    return result


def fixing_rule(finding: Finding) -> Rule | None:
    rule = rule_by_code(finding.rule)
    return rule() if rule is not None and rule.fixable() else None


def make_fix(rule: Rule, editor: Editor, finding: Finding) -> Fix | None:
    """The rule's fix for a finding; a crash in a fix is a refusal, never the end of the run."""
    try:
        fix = rule.fix(editor, finding)
    except NoFix:
        raise
    except Exception as exc:  # a fix bug must not stop the others
        raise NoFix(f"internal error in the fix: {exc.__class__.__name__}: {exc}") from exc
    if fix is not None and any(edit.overlaps(other) for i, edit in enumerate(fix.edits)
                               for other in fix.edits[i + 1:]):
        raise NoFix("internal error in the fix: its edits overlap")
    return fix


def judge(model: SourceModel, findings: list[Finding], changed: str, config: Config,
          fixed: list[Finding]) -> str | None:
    """Why `changed` is not an acceptable fix of `fixed` in `model`'s text, or None."""
    after = SourceModel(model.path, changed, entry=model.entry, policy=model.policy)
    if after.problem is not None:
        return f"the fixed code does not parse ({after.problem.message}, line {after.problem.line})"
    if cpp_errors(after) > cpp_errors(model):
        return "the fixed C++/CUDA code does not parse"
    new_findings = check_model(after, config).findings
    before = Counter((f.rule, f.message) for f in findings)
    now = Counter((f.rule, f.message) for f in new_findings)
    for key, count in Counter((f.rule, f.message) for f in fixed).items():
        if now[key] > before[key] - count:
            return "the finding is still reported after the fix"
    rules_before = Counter(f.rule for f in findings)
    rules_now = Counter(f.rule for f in new_findings)
    for finding in new_findings:
        if rules_now[finding.rule] > rules_before[finding.rule] \
                and now[(finding.rule, finding.message)] > before[(finding.rule, finding.message)]:
            return f"the fixed code draws {finding.rule}: {finding.message}"
    return None


def cpp_errors(model: SourceModel) -> int:
    return sum(1 for unit in model.cuda_units for _ in unit.walk_errors())


# --- fixes carried by reports (JSON, SARIF) ------------------------------------------------


@functools.lru_cache(maxsize=64)  # a second report of the same scan (SARIF after JSON) reuses them
def fixes_of_text(path: str, text: str, config: Config) -> dict[tuple[str, str], Fix]:
    """(rule, fingerprint) -> fix, for the findings of one file, each fix judged on its own."""
    config = every_rule(config)
    model = SourceModel(path, text, policy=config.policy)
    if model.problem is not None:
        return {}
    findings = check_model(model, config).findings
    editor = Editor(model)
    fixes: dict[tuple[str, str], Fix] = {}
    for finding in findings:
        rule = fixing_rule(finding)
        if rule is None or finding.path != path:
            continue
        try:
            fix = make_fix(rule, editor, finding)
            if fix is None or judge(model, findings, apply_edits(text, fix.edits), config,
                                    [finding]):
                continue
        except NoFix:
            continue
        fixes[(finding.rule, finding.fingerprint)] = fix
    return fixes
