"""Rule metadata and docs: one source for `explain`, the rules table and SARIF help. Each rule's
own Example must trigger it (Fixit-style), so docs cannot drift from behaviour."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kaudit import scan_source
from kaudit.rule import CODE_PATTERN, NAME_PATTERN, REQUIRED_SECTIONS, all_rules, rule_by_code

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
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


def test_readme_rules_table_is_the_registry():
    """The README's rules table is `kaudit rules --format markdown`, byte for byte."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- rules-table:[^\n]*-->\n(.*?)<!-- end rules-table -->", readme, re.S)
    assert block, "README.md has no `<!-- rules-table: ... -->` block"
    listed = subprocess.run([sys.executable, "-m", "kaudit", "rules", "--format", "markdown"],
                            capture_output=True, text=True, check=True).stdout
    assert block.group(1) == listed, "run `python scripts/update_readme_rules.py`"
    codes = re.findall(r"^\| (K[ADP]\d{3}) \|", block.group(1), re.M)
    assert codes == [r.code for r in all_rules()]


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick_start = readme[readme.index("## Quick start"):readme.index("## Using it")]
    return re.findall(r"```sh\n(.+?)\n```", quick_start)


def test_ci_runs_exactly_the_readme_test_command():
    scan_command, test_command = _readme_commands()
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci_lines[-1] == test_command
    # Both commands install into their own virtualenv, so system-wide packages cannot hide a
    # missing dependency, and each runs the tool or the tests from that virtualenv.
    for command in (scan_command, test_command):
        assert command.startswith("python3 -m venv .venv && .venv/bin/pip install")
    assert scan_command.endswith(".venv/bin/kaudit scan fixtures/")
    assert test_command.endswith(".venv/bin/python -m pytest")


def test_extras_declare_what_the_triton_interpreter_imports():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for extra in ("test", "dynamic"):
        names = {re.split(r"[<>=;\[ ]", requirement)[0]
                 for requirement in project["optional-dependencies"][extra]}
        assert "numpy" in names, extra


MODULE_LINES_MAX = 800


def test_no_module_over_800_lines():
    """The developer guide's limit: a module that grows past it is split by concern."""
    long = {str(path.relative_to(ROOT)): count
            for path in [*(ROOT / "kaudit").rglob("*.py"), *(ROOT / "rules").glob("*.py")]
            if (count := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES_MAX}
    assert not long, long

