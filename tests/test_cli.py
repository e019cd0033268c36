"""The command line as a user meets it: formats, gating exit codes, selection, configuration and
bad input. Runs the real `python -m kaudit` in a subprocess."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from kaudit import __version__
from tests.conftest import FIXTURES, RULE_FIXTURES

FALLBACK = ("import torch\nimport torch.nn.functional as F\n\n\nclass ModelNew(torch.nn.Module):\n"
            "    def forward(self, x):\n        return F.softmax(x, dim=-1)\n")
CLEAN = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def kaudit(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kaudit", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def scan_json(*args: str, cwd=None) -> tuple[int, dict]:
    proc = kaudit("scan", "--format", "json", *args, cwd=cwd)
    return proc.returncode, json.loads(proc.stdout)


def test_version():
    proc = kaudit("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"kaudit {__version__}"


def test_text_output_shows_finding_and_source_line(in_tmp):
    (in_tmp / "kernel.py").write_text(FALLBACK)
    proc = kaudit("scan", "kernel.py")
    assert proc.returncode == 1
    assert "kernel.py:7:16: KA101 error" in proc.stdout
    assert "return F.softmax(x, dim=-1)" in proc.stdout and "^^^^" in proc.stdout
    assert "1 finding (1 error) in 1 file scanned" in proc.stdout
    assert "\x1b[" not in proc.stdout, "no colour codes when stdout is not a terminal"


def test_json_shape(in_tmp):
    (in_tmp / "kernel.py").write_text(FALLBACK)
    code, data = scan_json("kernel.py")
    assert code == 1
    assert data["tool"] == {"name": "kaudit", "version": __version__}
    assert data["files_scanned"] == 1 and data["files_skipped"] == 0 and data["errors"] == []
    (finding,) = data["findings"]
    assert {k: finding[k] for k in ("rule", "name", "level", "path", "line", "column", "pass")} == {
        "rule": "KA101", "name": "library-fallback", "level": "error", "path": "kernel.py",
        "line": 7, "column": 16, "pass": "static"}
    assert finding["end_line"] == 7 and finding["end_column"] == 36


@pytest.mark.parametrize(("fail_on", "expected"), [
    ("error", 1), ("warning", 1), ("note", 1), ("never", 0)])
def test_fail_on_thresholds(in_tmp, fail_on, expected):
    (in_tmp / "kernel.py").write_text(FALLBACK)
    assert kaudit("scan", "kernel.py", "--fail-on", fail_on).returncode == expected


def test_note_does_not_fail_by_default_but_does_with_fail_on_note(in_tmp):
    (in_tmp / "kernel.py").write_text(CLEAN.replace("return x", "return x  # kaudit: ignore[KA101]"))
    assert kaudit("scan", "kernel.py").returncode == 0
    assert kaudit("scan", "kernel.py", "--fail-on", "note").returncode == 1


def test_sarif_does_not_gate_by_default(in_tmp):
    (in_tmp / "kernel.py").write_text(FALLBACK)
    proc = kaudit("scan", "kernel.py", "--format", "sarif")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["runs"][0]["results"][0]["ruleId"] == "KA101"
    assert kaudit("scan", "kernel.py", "--format", "sarif", "--fail-on", "error").returncode == 1


def test_select_and_ignore(in_tmp):
    (in_tmp / "kernel.py").write_text(FALLBACK)
    assert scan_json("kernel.py", "--ignore", "KA101")[1]["findings"] == []
    assert scan_json("kernel.py", "--select", "KA2xx,KA3")[1]["findings"] == []
    assert len(scan_json("kernel.py", "--select", "KA1")[1]["findings"]) == 1


def test_unknown_code_is_a_usage_error(in_tmp):
    (in_tmp / "kernel.py").write_text(CLEAN)
    proc = kaudit("scan", "kernel.py", "--select", "bogus!")
    assert proc.returncode == 2 and "not a rule code" in proc.stderr


def test_pyproject_configuration(in_tmp):
    (in_tmp / "kernels").mkdir()
    (in_tmp / "kernels" / "a.py").write_text(FALLBACK)
    (in_tmp / "legacy").mkdir()
    (in_tmp / "legacy" / "b.py").write_text(FALLBACK)
    (in_tmp / "pyproject.toml").write_text(
        '[tool.kaudit]\nper-file-ignores = { "legacy/*" = ["KA101"] }\n')
    code, data = scan_json(".")
    assert [f["path"] for f in data["findings"]] == [os.path.join("kernels", "a.py")]
    (in_tmp / "pyproject.toml").write_text('[tool.kaudit]\nignore = ["KA1"]\n')
    assert scan_json(".")[1]["findings"] == []
    (in_tmp / "pyproject.toml").write_text('[tool.kaudit]\nselekt = ["KA1"]\n')
    proc = kaudit("scan", ".")
    assert proc.returncode == 2 and "unknown [tool.kaudit] keys: selekt" in proc.stderr


def test_nonexistent_path_is_a_usage_error(in_tmp):
    proc = kaudit("scan", "missing.py")
    assert proc.returncode == 2 and "no such file or directory: missing.py" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_directory_walk_skips_files_without_model_new(in_tmp):
    (in_tmp / "runs").mkdir()
    (in_tmp / "runs" / "kernel.py").write_text(FALLBACK)
    (in_tmp / "runs" / "helper.py").write_text("import torch\nx = torch.matmul\n")
    (in_tmp / "runs" / "notes.txt").write_text("ModelNew")
    (in_tmp / "runs" / ".hidden").mkdir()
    (in_tmp / "runs" / ".hidden" / "k.py").write_text(FALLBACK)
    code, data = scan_json("runs")
    assert (data["files_scanned"], data["files_skipped"]) == (1, 1)
    proc = kaudit("scan", "runs")
    assert "1 skipped (no ModelNew)" in proc.stdout


def test_bad_input_is_reported_and_the_scan_goes_on(in_tmp):
    (in_tmp / "good.py").write_text(FALLBACK)
    (in_tmp / "binary.py").write_bytes(b"ModelNew\x00\x01\x02")
    (in_tmp / "broken.py").write_text("class ModelNew(:\n")
    (in_tmp / "huge.py").write_bytes(b"# ModelNew\n" + b"x = 1\n" * 1_000_000)
    (in_tmp / "dangling.py").symlink_to(in_tmp / "nowhere.py")
    (in_tmp / "empty").mkdir()
    loop = in_tmp / "loop"
    loop.mkdir()
    (loop / "again").symlink_to(loop)
    code, data = scan_json(".", "empty")
    rules = {(f["path"], f["rule"]) for f in data["findings"]}
    assert {("good.py", "KA101"), ("binary.py", "KA003"), ("broken.py", "KA001"),
            ("huge.py", "KA003"), ("dangling.py", "KA003")} <= rules
    messages = " ".join(e["message"] for e in data["errors"])
    assert "symlink loop" in messages and "no kernel files" in messages
    assert not any(e["internal"] for e in data["errors"])
    assert code == 1


def test_a_folder_of_json_files_is_empty_only_when_no_benchmark_takes_them(in_tmp):
    """A CUDA-L1 release's `optimized_cuda_code/` holds `.json` files only: its kernels are
    scanned and no "no kernel files" error is given; a folder of other `.json` files keeps it."""
    release = in_tmp / "optimized_cuda_code"
    release.mkdir()
    shutil.copyfile(FIXTURES / "benchmarks" / "cuda-l1" / "optimized_cuda_code" / "toy_gpu.json",
                    release / "toy_gpu.json")
    (in_tmp / "settings").mkdir()
    (in_tmp / "settings" / "config.json").write_text('{"a": 1}')
    _code, data = scan_json("optimized_cuda_code", "settings")
    assert {f["path"].split("#")[0] for f in data["findings"]} == {
        "optimized_cuda_code/toy_gpu.json"}
    (error,) = data["errors"]
    assert error["path"] == "settings" and "no kernel files" in error["message"]


def test_jobs_give_the_same_report(in_tmp):
    for i in range(24):
        (in_tmp / f"k{i:02}.py").write_text(FALLBACK if i % 2 else CLEAN)
    serial = scan_json(".", "--jobs", "1", "--no-cache")[1]
    parallel = scan_json(".", "--jobs", "2", "--no-cache")[1]
    assert serial == parallel and len(serial["findings"]) == 12


def test_rules_table_and_json():
    proc = kaudit("rules", "--format", "json")
    rows = json.loads(proc.stdout)
    assert {"KA001", "KA101", "KA102", "KA103"} <= {r["code"] for r in rows}
    assert all(r["summary"] and r["level"] in {"error", "warning", "note"} for r in rows)
    assert "library-fallback" in kaudit("rules").stdout


def test_explain_prints_the_rule_docs():
    proc = kaudit("explain", "ka101")
    assert proc.returncode == 0
    for heading in ("What it does", "Why is this bad?", "Example"):
        assert heading in proc.stdout
    bad = kaudit("explain", "KA999")
    assert bad.returncode == 2 and "unknown rule code" in bad.stderr


def test_output_file(in_tmp):
    (in_tmp / "kernel.py").write_text(FALLBACK)
    proc = kaudit("scan", "kernel.py", "--output", "report.txt")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "KA101" in (in_tmp / "report.txt").read_text()


def test_bundled_fixtures_scan():
    """The README quick start: `kaudit scan fixtures/` finds the bad fixtures' problems, and
    prints exactly the `error:` lines the README announces."""
    root = RULE_FIXTURES.parent.parent
    code, data = scan_json("fixtures/", cwd=root)
    assert code == 1 and data["files_scanned"] > 50
    assert not any(e["internal"] for e in data["errors"])
    readme = (root / "README.md").read_text()
    quick_start = readme[readme.index("## Quick start"):readme.index("## Using it")]
    listed = re.findall(r"^- `([^`]+)`:", quick_start, re.M)
    assert sorted(e["path"] for e in data["errors"]) == sorted(listed)
    words = {1: "one line", 2: "two lines", 3: "three lines", 4: "four lines", 5: "five lines",
             6: "six lines"}
    assert f"prints {words[len(listed)]} starting `error:`" in " ".join(quick_start.split())
    text = kaudit("scan", "fixtures/", cwd=root).stdout.splitlines()
    assert [line for line in text if line.startswith("error:")] == [
        f"error: {e['path']}: {e['message']}" for e in data["errors"]]
    assert re.fullmatch(r"\d+ kernels: (\d+ [a-z-]+, ){4}\d+ trusted", text[-2])
    notes = sum(f["level"] == "note" for f in data["findings"])
    assert text[-1].endswith(f"{len(listed)} errors; not shown: {notes} notes "
                             "(--min-level note shows them)")


def test_kaudit_leaves_without_the_interpreters_teardown_but_loses_nothing():
    """`cli.leave` ends the process without tearing the interpreter down (0.6-1.2 s after a
    dynamic pass's imports), yet as `sys.exit` would: threads still running finish, atexit
    handlers run, buffered output comes out, and the status is sys.exit's."""
    script = ("import atexit, sys, threading, time\nfrom kaudit.cli import leave\n"
              "atexit.register(lambda: print('atexit ran'))\n"
              "threading.Thread(target=lambda: (time.sleep(0.2), print('thread ran'))).start()\n"
              "sys.stdout.write('buffered')\nleave(sys.argv[1] if sys.argv[1:] else None)\n")
    for argument, status, stderr in (("bye", 1, "bye\n"), ("", 0, "")):
        done = subprocess.run([sys.executable, "-c", script, *([argument] if argument else [])],
                              capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stderr) == (status, stderr)
        assert done.stdout == "bufferedthread ran\natexit ran\n"
    # an idle thread pool left open, as the interpreter's exit wakes it; output that could not
    # be written is not a success (the interpreter's 120)
    idle = ("from concurrent.futures import ThreadPoolExecutor\nfrom kaudit.cli import leave\n"
            "pool = ThreadPoolExecutor(2)\npool.submit(print, 'x').result()\nleave(0)\n")
    assert subprocess.run([sys.executable, "-c", idle], capture_output=True,
                          timeout=60).returncode == 0
    if os.path.exists("/dev/full"):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, "-m", "kaudit", "explain", "KA004"],
                                  stdout=full, stderr=subprocess.PIPE, text=True, env=env,
                                  timeout=60)
        assert done.returncode == 120 and "could not write the output" in done.stderr
