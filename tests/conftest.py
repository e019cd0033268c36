from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

# The console scripts (`kaudit`) are installed beside the interpreter that runs the tests; the
# README's test command runs `.venv/bin/python -m pytest` without activating the virtualenv.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
RULE_FIXTURES = FIXTURES / "rules"
PROBLEM_FIXTURES = FIXTURES / "problems"
DYNAMIC_FIXTURES = FIXTURES / "dynamic"
#: `bad_x.fixed.py` holds what `kaudit fix` makes of `bad_x.py`
FIXED_SUFFIX = ".fixed.py"
SARIF_SCHEMA = Path(__file__).parent / "data" / "sarif-schema-2.1.0.json"

#: dynamic fixtures that only run on the CPU: C++ extensions whose kernels read host pointers
CPU_ONLY = {"good_cpp_extension", "bad_cpp_first_row"}
#: findings only a GPU run can give: a race with a side stream (KD403) needs CUDA streams; on the
#: CPU the same fixture's kernel runs synchronously and honestly, so none is expected there; the
#: profiled run (KD601, KD602, KD403 from the trace) needs CUDA activity
GPU_ONLY_FINDINGS = {"KD403", "KD601", "KD602"}
#: and only a run without CUDA: a kernel that needs CUDA is a KD500 note there, whatever it does
CPU_ONLY_FINDINGS = {"KD500"}

_EXPECT = re.compile(rb"(?:#|//)\s*expect:\s*(K[ADP]\d{3}(?:\s*,\s*K[ADP]\d{3})*)")
_POLICY = re.compile(rb"^#\s*fixture-policy:\s*(\w+)", re.M)


def expected_findings(path: Path) -> set[tuple[str, int]]:
    """The (code, line) pairs a fixture declares with `# expect: CODE` markers."""
    expected = set()
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        for match in _EXPECT.finditer(line):
            for code in match.group(1).split(b","):
                expected.add((code.strip().decode(), number))
    return expected


def fixture_policy(path: Path) -> str:
    """The policy a fixture is scanned with: `# fixture-policy: strict` in the file, else the
    default. (A convention of the test suite; kaudit itself never reads it.)"""
    match = _POLICY.search(path.read_bytes())
    return match.group(1).decode() if match else "kernelbench"


def rule_fixtures() -> list[Path]:
    """`bad_*`/`good_*` fixtures; not `bad_x.fixed.py`, the fixed form of `bad_x.py`."""
    return sorted(p for p in RULE_FIXTURES.glob("*/*")
                  if p.is_file() and p.suffix == ".py" and not p.name.endswith(FIXED_SUFFIX))


def problem_fixtures() -> list[Path]:
    """Benchmark problem files for the KP rules (`kaudit problems`), marked like rule fixtures."""
    return sorted(PROBLEM_FIXTURES.glob("*.py"))


def dynamic_fixtures() -> list[Path]:
    """Paired problem/kernel folders for the KD rules (`kaudit scan --dynamic`): markers on the
    `def forward` line of `ModelNew` in each folder's kernel.py."""
    return sorted(p for p in DYNAMIC_FIXTURES.iterdir() if (p / "kernel.py").is_file())


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty folder, so relative paths and pyproject lookup are the test's own."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
