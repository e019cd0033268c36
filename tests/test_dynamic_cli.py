"""`kaudit scan --dynamic` options reaching `DynamicOptions` (--scales, --jobs, --artifacts), their
usage errors, and picture links in the reports. The dynamic pass (`pipeline.run_pass`) is replaced
by a stand-in: no kernel runs here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch", reason="kaudit scan --dynamic needs torch (kaudit[dynamic])")

import kaudit.dynamic.kernels
import kaudit.dynamic.pipeline
from kaudit.cli import app
from kaudit.findings import Finding, Level, Location

KERNEL = ("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
          "        return x\n")


@pytest.fixture
def kernel(in_tmp) -> Path:
    (in_tmp / "kernel.py").write_text(KERNEL)
    return in_tmp / "kernel.py"


class Recorder:
    """A stand-in for the dynamic pass: records the options of every call and, with `metrics`
    set, adds a KD101 finding with those metrics to the first kernel."""

    def __init__(self) -> None:
        self.options: list = []
        self.metrics: dict | None = None

    def __call__(self, items, options, config, baseline=None, on_kernel=None):
        self.options.append(options)
        result = kaudit.dynamic.pipeline.DynamicPass("cpu")
        if self.metrics is not None:
            result.findings[items[0].key] = [Finding(
                "KD101", "unwritten-output", Level.ERROR, Location("kernel.py", 5, 5),
                "output 0: 31 of 32 rows never written", pass_="dynamic",
                metrics=self.metrics)]
        return result


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(kaudit.dynamic.pipeline, "run_pass", recorder)
    return recorder


def scan(*args: str):
    return CliRunner().invoke(app, ["scan", "kernel.py", "--dynamic", "--no-cache", *args])


def test_options_reach_dynamic_options(kernel, recorder):
    result = scan("--scales", "0.5, 2,1e4", "--jobs", "3", "--artifacts", "pictures",
                  "-f", "json")
    assert result.exit_code == 0, result.output
    (options,) = recorder.options
    assert options.scales == (0.5, 2.0, 1e4)
    assert options.jobs == 3
    assert options.artifacts_dir == "pictures"


def test_defaults(kernel, recorder, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    result = scan("-f", "json")
    assert result.exit_code == 0, result.output
    (options,) = recorder.options
    assert options.scales == kaudit.dynamic.kernels.DEFAULT_SCALES
    assert options.jobs == 1
    assert options.artifacts_dir is None
    assert options.extensions_dir == str(tmp_path / "user-cache" / "kernel-builds")


@pytest.mark.parametrize(("given", "folder"), [("none", None), ("builds", "builds")])
def test_build_cache_option(kernel, recorder, given, folder):
    assert scan("--build-cache", given).exit_code == 0
    assert recorder.options[0].extensions_dir == folder


@pytest.mark.parametrize(("scales", "message"), [
    ("0,1", "--scales: give positive, finite factors"),
    ("1,-1e3", "--scales: give positive, finite factors"),
    ("1,inf", "--scales: give positive, finite factors"),
    ("nan", "--scales: give positive, finite factors"),
    (",", "--scales: give positive, finite factors"),
    ("1e-3;1", "--scales: not a comma-separated list of numbers: '1e-3;1'"),
])
def test_bad_scales_are_usage_errors(kernel, recorder, scales, message):
    result = scan("--scales", scales)
    assert result.exit_code == 2
    assert message in result.stderr
    assert recorder.options == [], "no dynamic run after a usage error"


def test_artifacts_must_be_a_folder(kernel, recorder):
    result = scan("--artifacts", "kernel.py")
    assert result.exit_code == 2 and "--artifacts: not a folder: kernel.py" in result.stderr
    assert recorder.options == []


def test_picture_links_in_reports(kernel, recorder, in_tmp):
    recorder.metrics = {"unwritten": 1488, "artifact": "pictures/KD101 kernel.py out0.svg"}
    result = scan("-f", "text", "--artifacts", "pictures")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "KD101" in line)
    assert lines[at + 3] == "         picture: pictures/KD101 kernel.py out0.svg"

    result = scan("-f", "markdown")
    assert "31 of 32 rows never written [picture](pictures/KD101%20kernel.py%20out0.svg) |" \
        in result.stdout, "stdout: as the finding gives it"
    (in_tmp / "reports").mkdir()
    result = scan("-f", "markdown", "-o", "reports/kaudit.md")
    assert result.exit_code == 1, result.output
    markdown = (in_tmp / "reports" / "kaudit.md").read_text()
    assert "[picture](../pictures/KD101%20kernel.py%20out0.svg)" in markdown

    result = scan("--output-dir", "out")
    assert "[picture](../pictures/KD101%20kernel.py%20out0.svg)" in (in_tmp / "out" / "kaudit.md"
                                                                      ).read_text()
    assert "picture: pictures/KD101 kernel.py out0.svg" in (in_tmp / "out" / "kaudit.txt"
                                                            ).read_text()
    (finding,) = [f for f in json.loads((in_tmp / "out" / "kaudit.json").read_text())["findings"]
                  if f["rule"] == "KD101"]
    assert finding["metrics"]["artifact"] == "pictures/KD101 kernel.py out0.svg"


def test_no_picture_line_without_artifact(kernel, recorder):
    recorder.metrics = {"unwritten": 1488}
    result = scan("-f", "text")
    assert "KD101" in result.stdout and "picture:" not in result.stdout
    assert "[picture]" not in scan("-f", "markdown").stdout
