"""Benchmark result trees: layouts, claims, verdicts, summaries, every output format, baselines
and the result cache."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import kaudit.api
from kaudit import Config, Level, scan_paths
from kaudit.report import markdown
from tests.conftest import FIXTURES, ROOT
from tests.test_sarif import validate

RESULTS = FIXTURES / "results"
TIMINGS = RESULTS / "kernelbench" / "results" / "timing" / "H200" / "baseline_time_torch.json"
#: one tree per layout (symlinked/, runs sharing files, has its own tests: test_result_trees.py)
LAYOUTS = [f"fixtures/results/{name}" for name in ("generated", "jsonl", "kernelbench", "paired")]


@pytest.fixture(scope="module")
def report():
    return scan_paths([str(ROOT / layout) for layout in LAYOUTS],
                      Config(baseline_timings=str(TIMINGS)))


def verdict_of(report, suffix):
    (verdict,) = [v for v in report.verdicts if v.path.endswith(suffix)]
    return verdict


@pytest.mark.parametrize(("suffix", "layout", "where", "claimed", "verdict", "reasons"), [
    ("dict_of_lists/level_1_problem_19_sample_0_kernel.py", "kernelbench-run",
     ("dict_of_lists", 1, 19, 0), (True, 1.5), "trusted", []),
    ("dict_of_lists/level_1_problem_19_sample_1_kernel.py", "kernelbench-run",
     ("dict_of_lists", 1, 19, 1), (False, None), "claimed-incorrect",
     ["the run marks it incorrect"]),
    ("dict_of_lists/level_1_problem_1_sample_0_kernel.py", "kernelbench-run",
     ("dict_of_lists", 1, 1, 0), (True, 2.66 / 1.9), "rejected", ["KA102", "KA108"]),
    ("dict_of_lists/level_1_problem_23_sample_0_kernel.py", "kernelbench-run",
     ("dict_of_lists", 1, 23, 0), (True, 12.0), "suspicious", ["claimed 12.0x > 10x, unconfirmed"]),
    ("task_list/level_1_problem_23_sample_0_kernel.py", "kernelbench-run",
     ("task_list", 1, 23, 0), (True, 150.0), "suspicious", ["claimed 150.0x > 10x, unconfirmed"]),
    ("task_list/level_1_problem_19_sample_0_kernel.py", "kernelbench-run",
     ("task_list", 1, 19, 0), (True, 1.0), "rejected", ["KA103"]),
    ("dict_of_records/level_1_problem_19_sample_0_kernel.py", "kernelbench-run",
     ("dict_of_records", 1, 19, 0), (True, 1.2), "trusted", []),
    ("generated_kernels/level_1/problem_19.py", "generated-kernels",
     ("generated", 1, 19, None), (True, 0.03 / 0.028), "trusted", []),
    ("generated_kernels/level_1/problem_1.py", "generated-kernels",
     ("generated", 1, 1, None), (True, 2.66 / 2.1), "rejected", ["KA102", "KA108"]),
    ("level_1_problem_19/custom_code.py", "paired-folder",
     ("paired", 1, 19, None), (None, None), "trusted", []),
    ("softmax_task/kernel.py", "paired-folder",
     ("paired", None, None, None), (None, None), "rejected", ["KA103"]),
    ("samples.jsonl#L1/custom_code", "jsonl", ("samples", 1, 23, 0), (True, 0.6 / 0.05),
     "suspicious", ["claimed 12.0x > 10x, unconfirmed"]),
    ("samples.jsonl#L2/custom_code", "jsonl", ("samples", 1, 1, 0), (True, 2.9), "rejected",
     ["KA102", "KA108"]),
])
def test_verdicts(report, suffix, layout, where, claimed, verdict, reasons):
    found = verdict_of(report, suffix)
    s = found.submission
    assert s.layout == layout and (s.run, s.level, s.problem, s.sample) == where
    assert s.claim.correctness is claimed[0]
    assert found.speedup == pytest.approx(claimed[1]) if claimed[1] else found.speedup is None
    assert (found.verdict, found.reasons) == (verdict, reasons)


def test_references_are_paired_and_not_judged(report):
    assert verdict_of(report, "custom_code.py").submission.reference.endswith("ref_code.py")
    assert not any(v.path.endswith(("ref_code.py", "problem.py")) for v in report.verdicts)
    assert verdict_of(report, "#L1/custom_code").submission.reference.endswith("#L1/ref_code")


def test_bad_claim_lines_are_reported_and_the_scan_goes_on(report):
    assert [e.path for e in report.errors] == [f"{RESULTS.relative_to(ROOT)}/jsonl/samples.jsonl#L3"] \
        or any(e.path.endswith("samples.jsonl#L3") for e in report.errors)
    assert len(report.verdicts) == 13


def test_summary_per_run_and_level(report):
    runs = {row["key"]: row for row in report.summary["runs"]}
    row = runs["dict_of_lists"]
    assert (row["kernels"], row["claimed_correct"], row["surviving"]) == (4, 3, 1)
    assert row["median_claimed_speedup"] == pytest.approx(1.5)
    assert row["median_surviving_speedup"] == pytest.approx(1.5)
    assert row["fast_1"] == pytest.approx(0.25)
    total = report.summary["total"]
    assert (total["kernels"], total["rejected"], total["suspicious"], total["trusted"],
            total["claimed_incorrect"], total["unverified"]) == (13, 5, 3, 4, 1, 0)
    assert {row["key"] for row in report.summary["levels"]} == {1, None}


def test_jsonl_findings_point_into_the_record(report):
    findings = [f for f in report.findings if "#L2/custom_code" in f.path and f.level is Level.ERROR]
    assert {f.rule for f in findings} == {"KA102"}
    assert all(f.line > 1 for f in findings)  # lines inside the custom_code text


def kaudit_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "kaudit", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_every_format_at_once(tmp_path):
    out = tmp_path / "reports"
    proc = kaudit_cli("scan", *LAYOUTS, "--no-cache", "--output-dir", str(out),
                      "--baseline-timings", str(TIMINGS))
    assert proc.returncode == 1, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "kaudit-static.sarif", "kaudit.json", "kaudit.md", "kaudit.txt"]
    data = json.loads((out / "kaudit.json").read_text())
    assert len(data["verdicts"]) == 13 and data["summary"]["total"]["rejected"] == 5
    assert {"path", "level", "problem", "sample", "claimed", "verdict", "reasons"} <= \
        data["verdicts"][0].keys()
    assert {"compiled", "correctness", "runtime_ms", "speedup"} <= data["verdicts"][0]["claimed"].keys()
    sarif_log = json.loads((out / "kaudit-static.sarif").read_text())
    validate(sarif_log)
    jsonl = [r for r in sarif_log["runs"][0]["results"]
             if r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith(".jsonl")]
    assert jsonl and all(r["locations"][0]["physicalLocation"]["region"]["startLine"] == 2
                         for r in jsonl)
    md = (out / "kaudit.md").read_text()
    assert "### Per run" in md and "| dict_of_lists | 4 | 3 | 1 | 1.50x | 1.50x | 25% |" in md
    assert "| task_list | 2 | 2 | 0 | 75.50x | - | 0% |" in md
    assert "### Kernels not trusted" in md and "**rejected**" in md
    txt = (out / "kaudit.txt").read_text()
    assert "run dict_of_lists: 1 of 3 correctness claims survive" in txt


def test_markdown_for_a_clean_plain_scan(tmp_path):
    kernel = tmp_path / "identity.py"
    kernel.write_text("import torch\n\nclass ModelNew(torch.nn.Module):\n"
                      "    def forward(self, x):\n        return x\n")
    text = markdown.render(scan_paths([str(kernel)]))
    assert "1 kernel scanned" in text and "| trusted | 1 |" in text and "### Findings" not in text


def test_baseline_accepts_known_findings_and_flags_new_ones(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(RESULTS / "paired", tree)
    baseline = tmp_path / "baseline.json"
    proc = kaudit_cli("baseline", "write", str(tree), "--output", str(baseline), cwd=tmp_path)
    assert proc.returncode == 0 and "findings written" in proc.stderr
    again = kaudit_cli("scan", str(tree), "--baseline", str(baseline), "--format", "json",
                       "--no-cache", cwd=tmp_path)
    assert again.returncode == 0
    findings = json.loads(again.stdout)["findings"]
    assert findings and {f["baseline_state"] for f in findings} == {"unchanged"}
    # Edits above a known finding keep it known; a new problem is new.
    kernel = tree / "softmax_task" / "kernel.py"
    kernel.write_text("# edited\n\n" + kernel.read_text() + "\n\nimport torch\n"
                      "def helper(x):\n    return torch.relu(x)\n")
    custom = tree / "level_1_problem_19" / "custom_code.py"
    custom.write_text(custom.read_text().replace(
        "return relu_ext.relu_forward(x.contiguous())", "return torch.relu(x)"))
    third = kaudit_cli("scan", str(tree), "--baseline", str(baseline), "--format", "json",
                       "--no-cache", cwd=tmp_path)
    states = {(f["rule"], f["path"].split("/")[-2], f["baseline_state"])
              for f in json.loads(third.stdout)["findings"]}
    assert ("KA103", "softmax_task", "unchanged") in states
    assert ("KA101", "level_1_problem_19", "new") in states
    assert third.returncode == 1
    other_json = tmp_path / "other.json"
    other_json.write_text('{"findings": []}')
    bad = kaudit_cli("scan", str(tree), "--baseline", str(other_json), cwd=tmp_path)
    assert bad.returncode == 2 and "not a kaudit baseline" in bad.stderr
    unreadable = kaudit_cli("scan", str(tree), "--baseline", str(kernel), cwd=tmp_path)
    assert unreadable.returncode == 2 and "cannot read baseline" in unreadable.stderr


def test_cache_skips_unchanged_files_and_notices_changes(tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    shutil.copytree(FIXTURES / "rules" / "KA005", tree)
    config = Config(cache_dir=str(tmp_path / "cache"))
    scanned: list[str] = []
    real = kaudit.api._scan_item

    def counting(job):
        scanned.append(job[0].display)
        return real(job)

    monkeypatch.setattr(kaudit.api, "_scan_item", counting)
    first = scan_paths([str(tree)], config)
    assert len(scanned) == 4
    scanned.clear()
    second = scan_paths([str(tree)], config)
    assert scanned == [] and second.to_dict() == first.to_dict()
    (tree / "kernels" / "add_bias.cu").write_text(
        (tree / "kernels" / "add_bias.cu").read_text() + "\n// changed\n")
    third = scan_paths([str(tree)], config)
    assert [p.split("/")[-1] for p in scanned] == ["good_sources_on_disk.py"]
    assert third.to_dict()["findings"] == first.to_dict()["findings"]
    scanned.clear()
    other = Config(cache_dir=str(tmp_path / "cache"), ignore=("KA005",))
    scan_paths([str(tree)], other)
    assert len(scanned) == 4, "other options, other cache entries"


def test_a_named_jsonl_file_without_kernels_is_an_error_not_a_clean_scan(tmp_path):
    """A results log named on the command line must not pass as audited: nothing in it was."""
    log = tmp_path / "eval_log.jsonl"
    log.write_text('{"problem": 1, "speedup": 3.2}\n\n{"problem": 2, "speedup": 1.1}\n')
    report = scan_paths([str(log)], Config())
    assert report.files_scanned == 0
    assert [e.message.split(":")[0] for e in report.errors] == ["no kernel in this JSONL file"]
    # found inside a folder beside kernels, it is only another file of the tree
    (tmp_path / "kernel.py").write_text("class ModelNew:\n    pass\n")
    assert scan_paths([str(tmp_path)], Config()).errors == []
