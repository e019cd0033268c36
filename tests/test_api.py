"""The Python API harnesses call directly: in-memory scans, plain serialisable results."""

from __future__ import annotations

import json

import pytest

import kaudit
from kaudit import Config, Finding, Level, scan_paths, scan_source

FALLBACK = ("import torch as T\n\n\nclass ModelNew(T.nn.Module):\n"
            "    def forward(self, a, b):\n        return T.bmm(a, b)\n")


def test_scan_source_needs_no_files():
    (finding,) = scan_source(FALLBACK, path="sample_17.py")
    assert (finding.rule, finding.level, finding.path, finding.line) == (
        "KA101", Level.ERROR, "sample_17.py", 6)
    assert "torch.bmm" in finding.message and "T.bmm" in finding.message


def test_scan_source_accepts_bytes_and_reports_bad_ones():
    assert scan_source(FALLBACK.encode())[0].rule == "KA101"
    (finding,) = scan_source(b"class ModelNew:\n    x = '\xff'\n")
    assert finding.rule == "KA003" and finding.line == 2


def test_findings_round_trip_through_json():
    findings = scan_source(FALLBACK)
    data = json.loads(json.dumps([f.to_dict() for f in findings]))
    assert [Finding.from_dict(d) for d in data] == findings


def test_config_selects_rules():
    assert scan_source(FALLBACK, config=Config(ignore=("KA101",))) == []
    assert scan_source(FALLBACK, config=Config(select=("KA103",))) == []
    with pytest.raises(ValueError, match="not a rule code"):
        Config(select=("K",))
    # a whole family by its two letters
    assert {f.rule for f in scan_source(FALLBACK, config=Config(select=("ka",)))} == \
        {f.rule for f in scan_source(FALLBACK)}
    assert scan_source(FALLBACK, config=Config(select=("KD",))) == []


def test_input_problems_stay_on_under_select():
    (finding,) = scan_source("class ModelNew(:\n", config=Config(select=("KA1",)))
    assert finding.rule == "KA001"


def test_scan_paths_report(tmp_path):
    (tmp_path / "k.py").write_text(FALLBACK)
    (tmp_path / "other.py").write_text("x = 1\n")
    report = scan_paths([str(tmp_path)])
    assert (report.files_scanned, report.files_skipped) == (1, 1)
    data = report.to_dict()
    assert data["tool"]["name"] == "kaudit" and data["findings"][0]["rule"] == "KA101"
    json.dumps(data)


def test_scan_paths_missing_path_raises():
    with pytest.raises(FileNotFoundError):
        scan_paths(["/nonexistent/kernel.py"])


def test_public_names():
    assert set(kaudit.__all__) >= {"scan_source", "scan_paths", "Config", "Finding", "Report"}


def test_a_kernel_whose_analysis_failed_is_not_trusted(tmp_path, monkeypatch):
    """An internal error leaves the file unaudited: its verdict must not read as a pass."""
    kernel = tmp_path / "kernel.py"
    kernel.write_text("import torch\n\n\nclass ModelNew(torch.nn.Module):\n"
                      "    def forward(self, x):\n        return x\n")

    def broken(model, config):
        raise RuntimeError("a bug in a rule")

    monkeypatch.setattr("kaudit.engine.check_model", broken)
    report = scan_paths([str(kernel)], Config(cache_dir=None))
    (error,) = report.errors
    assert error.internal and "a bug in a rule" in error.message
    (verdict,) = report.verdicts
    assert verdict.verdict == "unverified"
    assert verdict.reasons == ["internal error in the static analysis"]
