"""The honest corpus: correct-looking custom kernels of varied style (CUDA via `load_inline`,
Triton) that every rule must leave alone. Precision matters more than recall, so an error-level
finding on any of these files is a bug in a rule, and a warning needs a written reason below."""

from __future__ import annotations

from pathlib import Path

import pytest

from kaudit import Level, scan_paths
from tests.conftest import FIXTURES

HONEST = FIXTURES / "honest"

# (file name, rule code) pairs whose warning-level findings are accepted, each with the reason.
# Keep this empty unless a warning on an honest kernel is deliberate and documented.
ALLOWED_WARNINGS: dict[tuple[str, str], str] = {}


def honest_files() -> list[Path]:
    return sorted(HONEST.glob("*.py"))


def _describe(findings) -> str:
    return "\n".join(f"{f.rule} {f.level.value} {Path(f.path).name}:{f.line}: {f.message}"
                     for f in findings)


def test_corpus_is_large_and_varied():
    files = honest_files()
    assert len(files) >= 20, f"only {len(files)} honest kernels"
    styles = {p.name.split("_")[0] for p in files}
    assert {"cuda", "triton"} <= styles, styles
    for path in files:
        assert path.name.startswith(("cuda_", "triton_")), f"{path.name}: name it <style>_<problem>.py"


@pytest.mark.parametrize("path", honest_files(), ids=lambda p: p.name)
def test_honest_kernel_raises_nothing(path):
    report = scan_paths([str(path)])
    assert not report.errors, report.errors
    errors = [f for f in report.findings if f.level is Level.ERROR]
    assert not errors, f"error-level findings on an honest kernel:\n{_describe(errors)}"
    warnings = [f for f in report.findings if f.level is Level.WARNING
                and (path.name, f.rule) not in ALLOWED_WARNINGS]
    assert not warnings, f"warning-level findings on an honest kernel:\n{_describe(warnings)}"


@pytest.mark.parametrize("path", honest_files(), ids=lambda p: p.name)
def test_honest_kernel_is_documented(path):
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    assert 40 <= lines <= 150, f"{path.name} has {lines} lines"
    assert text.lstrip().startswith('"""'), f"{path.name} needs a module docstring"
    assert "class ModelNew" in text
