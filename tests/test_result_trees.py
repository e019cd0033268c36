"""Result trees as third-party runs write them: runs sharing kernels through symlinks (a re-timed
run linking to another run's files, a run folder linking into another), overlapping arguments,
kernels their own run marks incorrect, and claims that cannot be used. The fixture is
fixtures/results/symlinked/ (relative symlinks, committed to git)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from kaudit import scan_paths
from kaudit.report import markdown
from tests.conftest import FIXTURES, ROOT

TREE = FIXTURES / "results" / "symlinked"

#: run -> rows of its table: (kernel as the row shows it, level, problem, sample, claimed,
#: verdict, reasons)
EXPECTED_TABLES = {
    "run_a": [
        ("problem_1.py", "1", "1", "-", "correct", "rejected", "KA101"),
        ("problem_2.py", "1", "2", "-", "incorrect", "claimed-incorrect",
         "the run marks it incorrect"),
        ("problem_10.py", "1", "10", "-", "correct", "trusted", ""),
    ],
    "run_b": [
        ("level_1_problem_1_sample_0_kernel.py", "1", "1", "0", "correct", "rejected", "KA101"),
        ("level_1_problem_2_sample_0_kernel.py", "1", "2", "0", "correct", "trusted", ""),
        ("level_1_problem_10_sample_0_kernel.py", "1", "10", "0", "not compiled",
         "claimed-incorrect", "the run marks it not compiled"),
    ],
    "run_c": [
        ("problem_1.py", "1", "1", "-", "incorrect", "claimed-incorrect",
         "the run marks it incorrect, KA101"),
        ("problem_2.py", "1", "2", "-", "correct", "trusted", ""),
        ("problem_10.py", "1", "10", "-", "-", "trusted", ""),
    ],
    "bad_types": [
        ("level_1_problem_2_sample_0_kernel.py", "1", "2", "0", "-", "trusted", ""),
    ],
    "unknown_shape": [
        ("level_1_problem_2_sample_0_kernel.py", "1", "2", "0", "-", "trusted", ""),
    ],
    "records": [
        ("records.jsonl#L1/custom_code", "1", "2", "0", "correct", "trusted", ""),
    ],
}

EXPECTED_ERRORS = {
    "bad_types/eval_results.json": "claims not read: problem 2 sample 0: correctness: expected "
                                   "true or false, got 'maybe'; problem 2 sample 0: runtime: "
                                   "expected a number, got 'fast'",
    "jsonl_bad/records.jsonl#L2": "custom_code: expected a string holding the kernel's source, "
                                  "got a list",
    "unknown_shape/eval_results.json": "claims not read: unknown shape: keys 'results', 'model' "
                                       "are not problem ids; expected",
    "claims_only/eval_results.json": "2 claims but no kernels next to it: expected "
                                     "level_<L>_problem_<P>_sample_<S>_kernel.py files",
}


def kaudit(*args: str, cwd=TREE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kaudit", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def tables(text: str) -> dict[str, list[tuple[str, ...]]]:
    """The verdict tables of a text report: run -> rows (wrapped cells joined)."""
    found: dict[str, list[tuple[str, ...]]] = {}
    run = None
    for line in text.splitlines():
        title = re.match(r"run (\S+): \d+ of \d+ correctness claims survive", line)
        if title:
            run = title.group(1)
            found[run] = []
        elif run and line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            if cells[1]:  # a new row (a wrapped line leaves the level cell empty)
                found[run].append(cells)
            else:
                found[run][-1] = [f"{a} {b}".strip() if b else a
                                  for a, b in zip(found[run][-1], cells)]
    return {r: [(c[0], c[1], c[2], c[3], c[4], c[6], c[7]) for c in rows]
            for r, rows in found.items()}


def test_the_symlinked_tree_gives_every_run_all_its_kernels():
    proc = kaudit("scan", ".", "--no-cache")
    assert proc.returncode == 1, proc.stderr
    assert tables(proc.stdout) == EXPECTED_TABLES
    assert "symlink loop" not in proc.stdout and "no kernel files" not in proc.stdout
    # each file is scanned once: 4 kernel files (3 in run_a, the JSONL record) behind 12 paths
    assert "12 kernels: 3 claimed-incorrect, 2 rejected, 0 unverified, 0 suspicious, 7 trusted" \
        in proc.stdout
    assert "1 finding (1 error) in 4 files scanned" in proc.stdout


def test_findings_are_reported_once_under_the_file_itself():
    report = scan_paths([str(TREE)])
    (finding,) = report.findings
    assert finding.path.endswith("run_a/generated_kernels/level_1/problem_1.py")
    linked = [v for v in report.verdicts
              if v.path.endswith("run_b/level_1_problem_1_sample_0_kernel.py")]
    assert [(v.verdict, v.file) for v in linked] == [("rejected", finding.path)]
    data = report.to_dict()["verdicts"]
    assert {v["file"] for v in data if v["problem"] == 1} == {finding.path}


@pytest.mark.parametrize("arguments", [
    (".", "run_a/generated_kernels"),            # a folder and a folder inside it
    ("run_a/generated_kernels", "."),
    ("run_b", "run_a"),                          # a run whose kernels link into the other
    ("run_c", "run_a", "run_b"),                 # a run folder linking into another
    ("run_a/generated_kernels/level_1/problem_1.py", "run_a", "run_b"),  # a file and its folder
])
def test_overlapping_arguments_keep_every_run(arguments):
    proc = kaudit("scan", *arguments, "--no-cache")
    assert proc.returncode == 1, proc.stderr
    found = tables(proc.stdout)
    for run in ("run_a", "run_b", "run_c"):
        if any(a == run or a.startswith(f"{run}/") or a == "." for a in arguments):
            assert found[run] == EXPECTED_TABLES[run], run
    assert "no kernel files" not in proc.stdout and "symlink loop" not in proc.stdout


def test_a_real_symlink_loop_is_still_reported(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "kernel.py").write_text("class ModelNew: pass\n")
    (tmp_path / "run" / "again").symlink_to("..")
    report = scan_paths([str(tmp_path)])
    assert [e.message.split(":")[0] for e in report.errors] == ["symlink loop"]
    assert report.files_scanned == 1 and len(report.verdicts) == 1


def test_claimed_incorrect_in_every_format():
    proc = kaudit("scan", "run_b", "--no-cache", "--format", "json")
    verdicts = {v["problem"]: v for v in json.loads(proc.stdout)["verdicts"]}
    assert verdicts[10]["verdict"] == "claimed-incorrect"
    assert verdicts[10]["claimed"]["compiled"] is False
    summary = json.loads(proc.stdout)["summary"]["total"]
    assert (summary["claimed_incorrect"], summary["trusted"]) == (1, 1)
    md = markdown.render(scan_paths([str(TREE / "run_b")]))
    assert "| claimed-incorrect | 1 |" in md
    assert re.search(r"\| `[^|]*level_1_problem_10_sample_0_kernel\.py` \| not compiled \| "
                     r"\*\*claimed-incorrect\*\* \| the run marks it not compiled \|", md)


def test_a_failed_harness_status_is_claimed_incorrect(tmp_path):
    """per_problem records of kernels the harness never evaluated ("static_failed")."""
    run = tmp_path / "run"
    (run / "generated_kernels" / "level_1").mkdir(parents=True)
    (run / "per_problem" / "level_1").mkdir(parents=True)
    (run / "generated_kernels" / "level_1" / "problem_3.py").write_text(
        (TREE / "run_a" / "generated_kernels" / "level_1" / "problem_2.py").read_text())
    (run / "per_problem" / "level_1" / "problem_3.json").write_text(json.dumps(
        {"problem_id": 3, "status": "static_failed", "static_errors": ["no __global__"]}))
    report = scan_paths([str(tmp_path)])
    (verdict,) = report.verdicts
    assert (verdict.verdict, verdict.reasons) == ("claimed-incorrect",
                                                  ["the run marks it static_failed"])
    assert report.errors == []


def test_generated_kernels_claims_carry_trials_and_hardware():
    report = scan_paths([str(TREE / "run_a")])
    claims = {v.submission.problem: v.submission.claim for v in report.verdicts}
    assert (claims[1].trials, claims[1].hardware, claims[1].runtime_ms) == \
        ("(5 / 5)", "NVIDIA H200", 2.0)
    assert (claims[2].trials, claims[2].hardware) == (None, "NVIDIA H200")


def test_unusable_claims_are_errors_naming_the_file_and_what_was_expected():
    proc = kaudit("scan", ".", "--no-cache", "--format", "json")
    errors = {e["path"]: e["message"] for e in json.loads(proc.stdout)["errors"]}
    assert set(errors) == set(EXPECTED_ERRORS)
    for path, message in EXPECTED_ERRORS.items():
        assert errors[path].startswith(message), path
        # and a line on stderr, since the report went to stdout as JSON
        assert f"kaudit: error: {path}: {message}" in proc.stderr
    assert proc.returncode == 1


@pytest.mark.parametrize(("content", "expected"), [
    ('"just a string"', "unknown shape: got a string"),
    ('[{"problem": 1}, 3]', "record 0: expected a record with"),
    ('{"1": {"correctness": true, "correctness_trials": 5}}',
     'correctness_trials: expected a string like "(5 / 5)", got 5'),
    ('{"1": {"compiled": "yes", "correctness": true}}', "compiled: expected true or false"),
    ('{"1": [{"sample_id": 0, "speedup": "lots", "correctness": true}]}',
     "speedup: expected a number"),
    ('{"1": {"sample_id": 0}}', "no claim in it"),
])
def test_eval_results_of_unknown_shape_or_wrong_types(tmp_path, content, expected):
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval_results.json").write_text(content)
    (run / "level_1_problem_1_sample_0_kernel.py").write_text(
        "class ModelNew:\n    def forward(self, x):\n        return x\n")
    report = scan_paths([str(tmp_path)])
    (error,) = report.errors
    assert error.path.endswith("eval_results.json") and expected in error.message
    assert len(report.verdicts) == 1, "the kernel is still scanned"


def test_per_problem_claims_without_kernels(tmp_path):
    (tmp_path / "run" / "per_problem" / "level_1").mkdir(parents=True)
    (tmp_path / "run" / "per_problem" / "level_1" / "problem_1.json").write_text(
        '{"eval_result": {"correctness": true}}')
    (tmp_path / "other.py").write_text("class ModelNew: pass\n")
    report = scan_paths([str(tmp_path)])
    (error,) = report.errors
    assert error.path.endswith(os.path.join("run", "per_problem"))
    assert error.message.startswith("1 per-problem claims but no kernels")


def test_a_fresh_clone_keeps_the_symlinks():
    """The fixture's links are committed as relative symlinks (mode 120000)."""
    listing = subprocess.run(["git", "ls-files", "-s", str(TREE)], capture_output=True,
                             text=True, cwd=ROOT, check=False).stdout
    if not listing:
        pytest.skip("not a git checkout")
    links = [line.split("\t")[1] for line in listing.splitlines() if line.startswith("120000")]
    assert len(links) == 6
    assert all(not os.path.isabs(os.readlink(ROOT / link)) for link in links)
