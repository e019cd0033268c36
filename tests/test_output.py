"""What users read: user text never read as markup or emoji codes in any renderer, baselines in
text, the verdict tables (natural order, the tail of long paths, fast_1 without timings), summary
lines in logs, `kaudit rules` in a terminal, `--min-level`, and unusable cache or output paths."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys

import pytest
from markdown_it import MarkdownIt

import kaudit.cache as result_cache
from kaudit import Config, scan_paths
from kaudit.report import markdown
from kaudit.rule import all_rules
from tests.conftest import FIXTURES, RULE_FIXTURES

#: a name and a source line holding every kind of rich markup and emoji code, and GitHub's
#: rewrites (mentions, issue references)
ODD = ":smile: [bold]x[/bold] :100: [red]@someone #12"
#: the same in a file name (no slash)
ODD_NAME = ":smile: [bold]x :100: [red]@someone #12"
RUN = "run:100:[bold]b:smile:"
FALLBACK_AT_100 = ("import torch\n" + "\n" * 95 + "class ModelNew(torch.nn.Module):\n"
                   "    def forward(self, x):\n"
                   f"        y = open({ODD!r}).read()  # {ODD}\n"
                   "        return torch.relu(x)\n")
NOTES = RULE_FIXTURES / "KA308" / "bad_unchecked_launches.py"
EMOJI = re.compile("[\U0001F300-\U0001FAFF\u2600-\u27BF]")


def run_cli(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kaudit", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env=env)


@pytest.fixture
def odd_tree(in_tmp):
    run = in_tmp / RUN
    run.mkdir()
    (run / "eval_results.json").write_text(json.dumps(
        {"1": {"compiled": True, "correctness": True, "runtime": 1.0}}))
    (run / "level_1_problem_1_sample_0_kernel.py").write_text(FALLBACK_AT_100)
    (in_tmp / f"{ODD_NAME}.py").write_text(FALLBACK_AT_100)
    return in_tmp


# -- 3. user text is text ---------------------------------------------------------------------


def test_text_prints_paths_source_lines_and_messages_as_they_are(odd_tree):
    proc = run_cli("scan", ".", "--no-cache")
    out = proc.stdout
    assert not EMOJI.search(out + proc.stderr), "an emoji code was rendered"
    kernel = f"{RUN}/level_1_problem_1_sample_0_kernel.py"
    assert f"{kernel}:100:16: KA101 error " in out  # file:line:col for editors and CI
    assert f"{ODD_NAME}.py:100:16: KA101" in out
    assert f"   99 |         y = open({ODD!r}).read()  # {ODD}" in out
    assert f"opens a file (`open({ODD!r})`)" in out
    assert f"run {RUN}: 0 of 1 correctness claims survive" in out
    assert "level_1_problem_1_sample_0_kernel.py" in out


def test_markdown_never_reads_user_text_as_markup(odd_tree):
    md = markdown.render(scan_paths(["."]))
    parsed = MarkdownIt("commonmark").enable("table").enable("strikethrough").parse(md)
    assert not [t for t in parsed if t.type == "html_block"]
    assert _only_kaudit_bold(parsed)
    inline = [child for token in parsed if token.type == "inline" for child in token.children]
    for token in inline:
        if token.type == "text":  # GitHub rewrites plain text only; code spans stay as they are
            assert not re.search(r":[\w+-]+:|@\w|#\d", token.content), token.content
    visible = "".join(t.content for t in inline if t.type in ("text", "code_inline"))
    assert ODD.replace("`", "") in visible.replace("`", "")
    assert f"{RUN}/level_1_problem_1_sample_0_kernel.py:100" in visible


def _only_kaudit_bold(parsed) -> bool:
    """No emphasis, link, picture, HTML or strikethrough; bold only around the verdict words
    kaudit writes."""
    for token in parsed:
        if token.type != "inline":
            continue
        children = token.children
        for i, child in enumerate(children):
            if child.type in ("em_open", "link_open", "image", "html_inline", "s_open"):
                return False
            if child.type == "strong_open" and children[i + 1].content not in (
                    "rejected", "suspicious", "claimed-incorrect", "unverified"):
                return False
    return True


@pytest.mark.parametrize("value", [
    ODD, "a|b", "`code`", "``x`", "*not em*", "_x_", "<b>x</b>", "[l](http://e.x)", "a\\b",
    "  spaced  ", "www.example.com", "x & y", "~~s~~", "![i](x)", "__init__"])
def test_markdown_cells_are_literal(value):
    md = f"| a |\n|---|\n| {markdown.text(value)} |\n| {markdown.code(value)} |\n"
    parsed = MarkdownIt("commonmark").enable("table").enable("strikethrough").parse(md)
    cells = [t for t in parsed if t.type == "inline"][1:]
    for cell in cells:
        assert {c.type for c in cell.children} <= {"text", "code_inline"}, md
        shown = "".join(c.content for c in cell.children)
        assert " ".join(shown.replace("`", "").split()) == \
            " ".join(value.replace("`", "").split()), md


def test_errors_and_usage_errors_print_paths_as_they_are(odd_tree):
    missing = f"{ODD_NAME}-missing.py"
    proc = run_cli("scan", missing)
    assert proc.returncode == 2 and f"no such file or directory: {missing}" in proc.stderr
    (odd_tree / RUN / "eval_results.json").write_text("{not json")
    proc = run_cli("scan", RUN, "--no-cache", "-f", "json")
    assert f"kaudit: error: {RUN}/eval_results.json: claims not read" in proc.stderr
    assert not EMOJI.search(proc.stderr)


def test_rules_and_explain_print_the_docs_as_written():
    table = run_cli("rules", env={**os.environ, "COLUMNS": "200"}).stdout
    assert not EMOJI.search(table)
    flat = " ".join(table.replace("│", " ").split())
    for rule in all_rules():
        assert rule.name in table
        words = rule.docs().summary.split()
        assert " ".join(words[:3]) in flat, rule.code
    assert "`kaudit: ignore[...]`" in table
    from typer.testing import CliRunner

    import kaudit.cli

    for rule in all_rules():  # not a terminal: the docs' Markdown as written
        result = CliRunner().invoke(kaudit.cli.app, ["explain", rule.code])
        assert result.output == f"# {rule.code} {rule.name}\n\nlevel: {rule.level.value} · " \
            f"precision: {rule.precision.value} · family: {rule.family()}\n\n" \
            f"{rule.docs().markdown}\n"


def test_explain_on_a_terminal_renders_no_emoji(monkeypatch):
    from typer.testing import CliRunner

    import kaudit.cli

    made = kaudit.cli.make_console
    monkeypatch.setattr(kaudit.cli, "make_console",
                        lambda **kw: made(force_terminal=True, width=120, **kw))
    for rule in all_rules():
        result = CliRunner().invoke(kaudit.cli.app, ["explain", rule.code])
        assert result.exit_code == 0 and not EMOJI.search(result.output), rule.code
        assert rule.name in result.output


def test_problems_reports_print_paths_as_they_are(tmp_path):
    pytest.importorskip("torch", reason="kaudit problems needs torch")
    from kaudit.dynamic.problems import Options, ProblemsReport, analyse, summarize
    from kaudit.dynamic.problems_report import render_markdown
    from kaudit.dynamic.runner import RunResult
    from kaudit.dynamic.tolerance import resolve
    from kaudit.findings import ScanError

    problem = tmp_path / f"{ODD_NAME}.py"
    shutil.copyfile(FIXTURES / "problems" / "bad_raises_in_init.py", problem)
    text = subprocess.run([sys.executable, "-m", "kaudit", "problems", problem.name, "--device",
                           "cpu"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert text.returncode == 1, text.stderr
    assert f"{ODD_NAME}.py:10: KP501 error" in text.stdout and not EMOJI.search(text.stdout)
    options = Options(resolve(None, None, None))
    failed = analyse(RunResult(status="error", error_type="ValueError", error=ODD), problem.name,
                     10, options)
    report = ProblemsReport(options, "cpu", [failed], [ScanError(f"{ODD_NAME}.py", ODD)])
    report.summary = summarize(report.problems)
    md = render_markdown(report)
    assert markdown.code(f"{ODD_NAME}.py") in md
    assert f"| {markdown.code(f'{ODD_NAME}.py')} | {markdown.text(ODD)} |" in md


# -- 4. baselines in text ---------------------------------------------------------------------


def test_text_marks_new_and_unchanged_findings(in_tmp):
    (in_tmp / "kernel.py").write_text(FALLBACK_AT_100.replace("y = open", "# y = open"))
    assert run_cli("baseline", "write", "kernel.py", "-o", "base.json").returncode == 0
    (in_tmp / "kernel.py").write_text((in_tmp / "kernel.py").read_text().replace(
        "        return", "        x = torch.sigmoid(x)\n        return"))
    proc = run_cli("scan", "kernel.py", "--baseline", "base.json", "--no-cache")
    lines = [line for line in proc.stdout.splitlines() if ": KA1" in line]
    assert any(re.search(r"KA101 error new .*sigmoid", line) for line in lines), lines
    assert any(re.search(r"KA101 error unchanged .*relu", line) for line in lines), lines
    assert "2 findings (2 errors), 1 new against the baseline in 1 file scanned" in proc.stdout


# -- 5. tables and summary lines --------------------------------------------------------------


@pytest.fixture
def long_run(in_tmp):
    """A generated_kernels run deep in folders, problems 1, 2, 10 and 100, no timings."""
    run = in_tmp / "results" / "some-lab" / "a-rather-long-model-name-2025-01-01" / "run"
    kernels = run / "generated_kernels" / "level_1"
    kernels.mkdir(parents=True)
    (run / "per_problem" / "level_1").mkdir(parents=True)
    for number in (100, 10, 2, 1):
        (kernels / f"problem_{number}.py").write_text(FALLBACK_AT_100.replace("y = open", "# y"))
        (run / "per_problem" / "level_1" / f"problem_{number}.json").write_text(json.dumps(
            {"eval_result": {"compiled": True, "correctness": True}}))
    return in_tmp


def test_tables_keep_the_tail_in_natural_order_and_fast_1_without_timings(long_run):
    proc = run_cli("scan", "results", "--no-cache")
    rows = [line.split("│")[1].strip() for line in proc.stdout.splitlines()
            if line.startswith("│")]
    assert rows == ["problem_1.py", "problem_2.py", "problem_10.py", "problem_100.py"]
    assert "…" not in proc.stdout
    assert "kernels in results/some-lab/a-rather-long-model-name-2025-01-01/run/" \
           "generated_kernels/level_1/" in proc.stdout
    assert "median speedup claimed -, surviving -; fast_1 -" in proc.stdout
    data = json.loads(run_cli("scan", "results", "--no-cache", "-f", "json").stdout)
    assert data["summary"]["total"]["fast_1"] is None
    assert [v["problem"] for v in data["verdicts"]] == [1, 2, 10, 100]
    md = markdown.render(scan_paths(["results"]))
    assert "| run | 4 | 4 | 0 | - | - | - |" in md


def test_summary_lines_are_not_wrapped_in_logs(long_run):
    (long_run / "extra").mkdir()
    shutil.copyfile(NOTES, long_run / "extra" / "notes.py")
    (long_run / "extra" / "helper.py").write_text("x = 1\n")
    proc = run_cli("scan", "results", "extra", "--no-cache", "-o", "out.txt")
    (line,) = proc.stderr.splitlines()
    assert line == ("4 findings (4 errors) in 5 files scanned, 1 skipped (no ModelNew); "
                    "not shown: 3 notes (--min-level note shows them)")
    proc = run_cli("scan", "results", "extra", "--no-cache", "--output-dir", "reports")
    (line,) = proc.stderr.splitlines()
    assert line.endswith("; reports in reports/") and len(line) > 80


@pytest.mark.parametrize("width", [200, 100, 80, 60])
def test_rules_fit_a_terminal(width):
    proc = run_cli("rules", env={**os.environ, "COLUMNS": str(width)})
    lines = proc.stdout.splitlines()
    assert max(map(len, lines)) <= width
    names = {rule.name for rule in all_rules()}
    shown = {cells[2].strip() for line in lines if (cells := line.split("│"))[1:2]
             and cells[1].strip().startswith("K")}
    assert shown == names, "every name whole, none cut with an ellipsis"
    assert ("precision" in lines[1]) is (width >= 100)


# -- 6. --min-level ---------------------------------------------------------------------------


def test_min_level_hides_notes_from_people_not_from_tools_or_the_gate(in_tmp):
    shutil.copyfile(NOTES, in_tmp / "kernel.py")
    text = run_cli("scan", "kernel.py", "--no-cache")
    assert "KA308" not in text.stdout and text.returncode == 0
    assert text.stdout.strip().endswith(
        "0 findings in 1 file scanned; not shown: 3 notes (--min-level note shows them)")
    shown = run_cli("scan", "kernel.py", "--no-cache", "--min-level", "note")
    assert shown.stdout.count("KA308 note") == 3 and "not shown" not in shown.stdout
    data = json.loads(run_cli("scan", "kernel.py", "--no-cache", "-f", "json").stdout)
    assert len(data["findings"]) == 3 and "findings_hidden" not in data
    data = json.loads(run_cli("scan", "kernel.py", "--no-cache", "-f", "json", "--min-level",
                             "warning").stdout)
    assert data["findings"] == [] and data["findings_hidden"] == {"note": 3}
    md = run_cli("scan", "kernel.py", "--no-cache", "-f", "markdown").stdout
    assert "KA308" not in md and "not shown: 3 notes" in md
    sarif = json.loads(run_cli("scan", "kernel.py", "--no-cache", "-f", "sarif").stdout)
    assert len(sarif["runs"][0]["results"]) == 3
    assert run_cli("scan", "kernel.py", "--no-cache", "--fail-on", "note").returncode == 1


def test_output_dir_gives_each_format_its_default(in_tmp):
    shutil.copyfile(NOTES, in_tmp / "kernel.py")
    run_cli("scan", "kernel.py", "--no-cache", "--output-dir", "out")
    assert "KA308" not in (in_tmp / "out" / "kaudit.txt").read_text()
    assert len(json.loads((in_tmp / "out" / "kaudit.json").read_text())["findings"]) == 3


# -- 12. cache and output locations ------------------------------------------------------------


def test_a_cache_dir_that_is_a_file_is_a_warning(in_tmp):
    shutil.copyfile(NOTES, in_tmp / "kernel.py")
    (in_tmp / "cache").write_text("not a folder")
    proc = run_cli("scan", "kernel.py", "--cache-dir", "cache", "-f", "json")
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["findings"]) == 3
    (warning,) = proc.stderr.splitlines()
    assert warning.startswith("kaudit: warning: result cache cache not usable (FileExistsError")
    assert warning.endswith("scanning without it")


def test_a_read_only_working_folder_is_a_warning(in_tmp, monkeypatch):
    shutil.copyfile(NOTES, in_tmp / "kernel.py")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", ".kaudit_cache")

    monkeypatch.setattr(result_cache.os, "makedirs", refuse)
    report = scan_paths(["kernel.py"], Config(cache_dir=".kaudit_cache"))
    assert len(report.findings) == 3 and report.errors == []
    assert report.warnings == ["result cache .kaudit_cache not usable (PermissionError: "
                               "Permission denied); scanning without it"]


def test_a_broken_cache_database_is_a_warning(in_tmp):
    shutil.copyfile(NOTES, in_tmp / "kernel.py")
    (in_tmp / "cache").mkdir()
    (in_tmp / "cache" / "results.sqlite").write_bytes(b"garbage, not sqlite" * 100)
    report = scan_paths(["kernel.py"], Config(cache_dir="cache"))
    assert len(report.findings) == 3
    (warning,) = report.warnings
    assert "DatabaseError" in warning


def test_a_cache_that_fails_while_writing_is_dropped(in_tmp, monkeypatch):
    shutil.copyfile(NOTES, in_tmp / "kernel.py")

    def full(self, key, result):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(result_cache.ResultCache, "put", full)
    report = scan_paths(["kernel.py"], Config(cache_dir="cache"))
    assert len(report.findings) == 3
    assert report.warnings == ["result cache failed (OperationalError: database or disk is "
                               "full); going on without it"]


def test_an_output_dir_that_is_a_file_is_a_usage_error(in_tmp):
    shutil.copyfile(NOTES, in_tmp / "kernel.py")
    (in_tmp / "reports").write_text("a file")
    proc = run_cli("scan", "kernel.py", "--output-dir", "reports")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "kaudit: --output-dir: not a folder: reports"
    proc = run_cli("scan", "kernel.py", "--output-dir", "reports/inside")
    assert proc.returncode == 2 and proc.stderr.startswith("kaudit: --output-dir: cannot create")
    proc = run_cli("scan", "kernel.py", "-o", "reports/out.txt")
    assert proc.returncode == 2 and proc.stderr.startswith("kaudit: cannot write reports/out.txt")
    assert "Traceback" not in proc.stderr
