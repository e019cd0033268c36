"""Rule metadata and docs: one source for `explain`, the rules table and SARIF help. Each rule's
own Example must trigger it (Fixit-style), so docs cannot drift from behaviour."""

from __future__ import annotations

import pytest

from kaudit import scan_source
from kaudit.rule import CODE_PATTERN, NAME_PATTERN, REQUIRED_SECTIONS, all_rules, rule_by_code

NOT_TEXT_EXAMPLES = {"KA003": "the example of an unreadable file cannot itself be text"}


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_metadata(rule):
    assert CODE_PATTERN.match(rule.code) and NAME_PATTERN.match(rule.name)
    assert rule.__module__.split(".")[-1].startswith(rule.code.lower() + "_"), \
        "a rule lives in rules/<code>_<name>.py"
    docs = rule.docs()
    assert docs.summary and docs.summary.endswith(".")
    for section in REQUIRED_SECTIONS:
        assert docs.sections[section]
    assert rule.tags and rule.family() != "other"


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_example_fires(rule):
    if rule.code in NOT_TEXT_EXAMPLES:
        pytest.skip(NOT_TEXT_EXAMPLES[rule.code])
    example = rule.docs().example
    assert example, "the Example section holds a ```python block"
    codes = {f.rule for f in scan_source(example, path="example.py")}
    if rule.audit in ("problems", "dynamic"):
        # KP rules are reported by `kaudit problems`, which runs the Example as a problem file
        # (tests/test_problems.py checks that it fires there); KD rules by `kaudit scan --dynamic`,
        # which runs kernels against their problems (tests/test_dynamic.py runs their fixtures);
        # the static scan never emits them
        assert rule.code not in codes
        return
    assert rule.code in codes


def test_rule_lookup_is_case_insensitive():
    assert rule_by_code("ka101") is rule_by_code("KA101") is not None
    assert rule_by_code("KA999") is None


def test_missing_doc_section_is_refused():
    from kaudit.findings import Level, Precision
    from kaudit.rule import Rule, parse_docs

    class Undocumented(Rule):
        """Summary only.

        ## What it does
        Something.
        """

        code = "KA999"
        name = "undocumented"
        level = Level.NOTE
        precision = Precision.LOW

    with pytest.raises(ValueError, match="Why is this bad"):
        parse_docs(Undocumented)
