"""SARIF contract: every file kaudit writes validates against the OASIS 2.1.0 schema and meets the
GitHub code-scanning rules the schema cannot express."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema

from kaudit import scan_paths
from kaudit.report import sarif
from kaudit.rule import all_rules
from tests.conftest import RULE_FIXTURES, ROOT, SARIF_SCHEMA

LEVELS = {"error", "warning", "note"}
PRECISIONS = {"very-high", "high", "medium", "low"}


def validate(log: dict) -> None:
    schema = json.loads(SARIF_SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft4Validator(schema).validate(log)
    assert_github_rules(log)


def assert_github_rules(log: dict) -> None:
    assert log["version"] == "2.1.0" and log["$schema"]
    assert len(log["runs"]) == 1, "one run per tool and category"
    run = log["runs"][0]
    assert run["automationDetails"]["id"].startswith("kaudit/")
    driver = run["tool"]["driver"]
    assert driver["name"] == "kaudit" and driver["version"] and driver["semanticVersion"]
    rules = driver["rules"]
    for rule in rules:
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
        assert rule["help"]["text"] and rule["help"]["markdown"]
        assert rule["defaultConfiguration"]["level"] in LEVELS
        assert rule["properties"]["precision"] in PRECISIONS
        assert 0 < len(rule["properties"]["tags"]) <= 10
        assert rule["properties"]["problem.severity"] in {"error", "warning", "recommendation"}
    assert "results" in run, "results must be present even when empty"
    assert "%SRCROOT%" in run["originalUriBaseIds"]
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"].endswith("/")
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] in LEVELS
        assert result["message"]["text"]
        location = result["locations"][0]["physicalLocation"]
        artifact = location["artifactLocation"]
        assert artifact["uriBaseId"] == "%SRCROOT%" and not artifact["uri"].startswith("/")
        region = location["region"]
        start = (region["startLine"], region.get("startColumn", 1))
        assert start >= (1, 1)
        assert (region.get("endLine", start[0]), region.get("endColumn", start[1])) >= start
        digest, _, occurrence = result["partialFingerprints"]["primaryLocationLineHash"].partition(":")
        assert len(digest) == 16 and occurrence.isdigit()


def render(paths, rules=None) -> dict:
    report = scan_paths([str(p) for p in paths])
    return json.loads(sarif.render(report, list(rules or all_rules())))


def test_sarif_for_every_fixture_validates():
    log = render([RULE_FIXTURES])
    validate(log)
    fired = {r["ruleId"] for r in log["runs"][0]["results"]}
    assert {"KA001", "KA003", "KA101", "KA102", "KA103"} <= fired


def test_sarif_lists_every_rule_that_can_fire():
    proc = subprocess.run([sys.executable, "-m", "kaudit", "scan", "fixtures/rules/KA101",
                           "--format", "sarif", "--no-cache"], capture_output=True, text=True,
                          cwd=ROOT)
    listed = [r["id"] for r in json.loads(proc.stdout)["runs"][0]["tool"]["driver"]["rules"]]
    assert listed == [r.code for r in all_rules() if r.audit == "static"]
    assert "KA101" in listed and not any(code.startswith("KP") for code in listed)


def test_empty_results_are_present(in_tmp):
    clean = in_tmp / "identity.py"
    clean.write_text("import torch\n\nclass ModelNew(torch.nn.Module):\n"
                     "    def forward(self, x):\n        return x\n")
    log = render([clean])
    validate(log)
    assert log["runs"][0]["results"] == []


def test_regions_match_the_finding(in_tmp):
    kernel = in_tmp / "kernel.py"
    kernel.write_text("import torch\nclass ModelNew(torch.nn.Module):\n"
                      "    def forward(self, a, b):\n        return torch.mm(a, b)\n")
    (in_tmp / ".git").mkdir()
    log = render([kernel])
    validate(log)
    result = log["runs"][0]["results"][0]
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "kernel.py"
    assert location["region"] == {"startLine": 4, "startColumn": 16, "endLine": 4, "endColumn": 30}
    assert result["level"] == "error"


def test_fingerprint_survives_edits_above(in_tmp):
    body = "class ModelNew(torch.nn.Module):\n    def forward(self, a, b):\n        return a @ b\n"
    kernel = in_tmp / "kernel.py"
    kernel.write_text("import torch\n" + body)
    before = render([kernel])["runs"][0]["results"][0]
    kernel.write_text("import torch\n# a new comment\n\nimport math\n" + body)
    after = render([kernel])["runs"][0]["results"][0]
    line = lambda r: r["locations"][0]["physicalLocation"]["region"]["startLine"]  # noqa: E731
    assert line(after) == line(before) + 3
    assert after["partialFingerprints"] == before["partialFingerprints"]


def test_identical_lines_get_distinct_fingerprints(in_tmp):
    kernel = in_tmp / "kernel.py"
    kernel.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, a):\n"
                      "        a = torch.relu(a)\n        a = torch.relu(a)\n        return a\n")
    results = render([kernel])["runs"][0]["results"]
    prints = [r["partialFingerprints"]["primaryLocationLineHash"] for r in results]
    assert len(set(prints)) == 2 and {p.split(":")[1] for p in prints} == {"1", "2"}


def test_suppressed_findings_are_left_out(in_tmp):
    kernel = in_tmp / "kernel.py"
    kernel.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, a):\n"
                      "        return torch.relu(a)  # kaudit: ignore[KA101]\n")
    assert render([kernel])["runs"][0]["results"] == []


def test_scan_errors_become_notifications(in_tmp):
    (in_tmp / "empty").mkdir()
    log = render([in_tmp / "empty"])
    validate(log)
    notes = log["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert "no kernel files" in notes[0]["message"]["text"]


def test_cli_sarif_output_file_validates(tmp_path):
    out = tmp_path / "kaudit.sarif"
    proc = subprocess.run([sys.executable, "-m", "kaudit", "scan", "fixtures", "--format", "sarif",
                           "--output", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr  # sarif never gates by default
    validate(json.loads(out.read_text()))
