"""Property-based robustness: truncated, mutated and random inputs never raise or break kaudit;
each gives findings (KA001/KA003 for what cannot be read) and no internal error."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kaudit import Config, scan_paths
from kaudit.engine import scan_text
from kaudit.findings import Finding
from tests.conftest import rule_fixtures

CORPUS = [p.read_bytes() for p in rule_fixtures()]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_clean(data: bytes | str) -> None:
    result = scan_text(data, "fuzzed.py", Config())
    assert result.errors == [], result.errors
    for finding in result.findings:
        assert isinstance(finding, Finding)
        loc = finding.location
        assert loc.line >= 1 and loc.column >= 1
        assert (loc.end_line, loc.end_column) >= (loc.line, loc.column)


@FUZZ
@given(st.sampled_from(CORPUS), st.floats(0, 1))
def test_truncated_kernels(source, fraction):
    assert_clean(source[: int(len(source) * fraction)])


@FUZZ
@given(st.sampled_from(CORPUS), st.lists(st.tuples(st.floats(0, 1), st.binary(max_size=4)),
                                         min_size=1, max_size=6))
def test_mutated_kernels(source, edits):
    data = bytearray(source)
    for where, insert in edits:
        at = int(len(data) * where)
        data[at:at + len(insert)] = insert
    assert_clean(bytes(data))


@FUZZ
@given(st.sampled_from(CORPUS), st.lists(st.sampled_from(
    ['"""', "'", "{", "}", "\\", "(", ")", ":", "\n", "    ", "f\"", "@", "#", "\udcff", "é"]),
    min_size=1, max_size=8), st.lists(st.floats(0, 1), min_size=8, max_size=8))
def test_token_level_mutations(source, tokens, positions):
    text = source.decode("utf-8", "replace")
    for token, where in zip(tokens, positions):
        at = int(len(text) * where)
        text = text[:at] + token + text[at:]
    assert_clean(text.encode("utf-8", "surrogateescape") if "\udcff" in text else text)


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes(data):
    assert_clean(data)


@FUZZ
@given(st.text(max_size=2048))
def test_random_text(text):
    assert_clean("class ModelNew:\n" + text)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=512), min_size=1, max_size=5))
def test_random_files_on_disk(tmp_path, blobs):
    for i, blob in enumerate(blobs):
        (tmp_path / f"k{i}.py").write_bytes(b"ModelNew\n" + blob)
    report = scan_paths([str(tmp_path)])
    assert not any(error.internal for error in report.errors)
    assert report.files_scanned == len(list(tmp_path.glob("*.py")))
