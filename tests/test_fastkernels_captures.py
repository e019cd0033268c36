"""FastKernels' capture reports (`kaudit.adapters.fastkernels_captures`): which captured cases a
candidate's problem is built from, as `fastkernels bench` chooses them, and why none can be."""

from __future__ import annotations

import json
from pathlib import Path

from kaudit.adapters import fastkernels_captures as captures
from kaudit.adapters.common import Problems
from kaudit.adapters.fastkernels import adapt
from kaudit.discover import discover
from tests.conftest import FIXTURES

TOY = FIXTURES / "benchmarks" / "dynamic" / "fastkernels"


def _spec(name: str):
    items = {Path(i.file).name: i for i in adapt(discover([str(TOY)]).items, [], False)[0]}
    return items[name].submission.spec


def test_cases_are_deduplicated_spread_and_smallest_first():
    """Seven distinct cases over two reports (one repeated): the benchmark keeps five, the
    smallest, the largest, the median and the two most frequent of the rest."""
    spec = _spec("rms_norm.py")
    assert spec.inputs_code.path.endswith("captures/run1/toy_tp1_float32_chat.json")
    # by elements: 4x96, 8x96 (+residual), 16x96, 32x96 (+residual), 64x96, 128x96, 256x96
    # (+residual); kept: 4, 256, the median 32, then 8 (40 calls) and 16 (5 calls)
    assert [s.input_kwargs["elements"] for s in spec.sizes] == [384, 1536, 1536, 6144, 49152]
    assert spec.sizes[0].id == "x=[4, 96] float32, residual=None"
    assert spec.sizes[0].init_kwargs["class"] == "RMSNorm" and spec.dtype == "float32"
    assert spec.sizes[0].init_kwargs["init"]["config"]["$dataclass"] == \
        "fastkernels.infra.config:NormConfig"
    assert spec.reference.path.endswith("tasks/baseline/L1/rms_norm.py")


def test_a_runtime_handle_in_the_init_leaves_no_size_and_says_why():
    spec = _spec("all_reduce.py")
    assert spec.sizes == () and spec.inputs_code is not None
    assert spec.sizes_note == "1 selected case of AllReduce: its init holds a runtime handle " \
        "(ProcessGroup)"


def test_op_refs_bring_the_operators_they_name(tmp_path):
    norm = "fastkernels.tasks.baseline.L1.norm:Norm"
    block = "fastkernels.tasks.baseline.L2.block:Block"
    report = {"operators": {
        norm: {"init": {"variants": [{"count": 1, "args": {"dim": 8}}]}},
        block: {"init": {"variants": [{"count": 1, "args": {
                    "norm": {"$op_ref": {"op": norm, "init_variant_id": 0}},
                    "act": {"$opaque": norm}}}]},
                "forward": {"variants": [
                    {"count": 3, "args": {"x": {"shape": [2, 8], "dtype": "bfloat16"}},
                     "init_variant_ids": [0]},
                    {"count": 1, "args": {"x": {"shape": [2, 8], "dtype": "bfloat16"},
                                          "cache": {"object": "KVCache"}}}]}}}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report), encoding="utf-8")
    reports = captures.Reports(Problems()).of(tmp_path)
    found, sizes, note = captures.sizes(reports, 2, "block", ("Block",))
    assert found == path and note == "" and len(sizes) == 1  # the case with a handle is left out
    (size,) = sizes
    assert size.init_kwargs["operators"] == {norm: report["operators"][norm]}
    # a stateless operator handed to the constructor is built from its first init variant
    assert size.init_kwargs["init"]["act"] == {"$op_ref": {"op": norm, "init_variant_id": 0}}
    assert size.input_kwargs["dtype"] == "bfloat16"
    assert captures.sizes(reports, 1, "block", ("Block",)) == (None, (), "")


def test_unreadable_reports_are_problems_and_others_are_ignored(tmp_path):
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    (tmp_path / "other.json").write_text('{"kernels": []}', encoding="utf-8")
    problems = Problems()
    assert captures.Reports(problems).of(tmp_path) == []
    (error,) = problems.errors
    assert error.path.endswith("bad.json") and "cannot read" in error.message
