"""Benchmark adapters (`kaudit.adapters`): each layout of fixtures/benchmarks/ is recognised from
its files, its claims reach the verdicts, findings point at the real file and line in JSON and
SARIF, `--benchmark` forces a layout, and bad input is an `errors[]` entry while the rest of the
scan goes on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kaudit import Config, scan_paths
from kaudit.adapters.jsonpos import Located
from kaudit.config import ConfigError, load_config
from tests.conftest import FIXTURES, ROOT
from tests.test_cli import kaudit, scan_json
from tests.test_sarif import validate

BENCHMARKS = FIXTURES / "benchmarks"


@pytest.fixture(scope="module")
def report():
    return scan_paths([str(BENCHMARKS)])


def verdict(report, suffix: str):
    found = [v for v in report.verdicts if v.path.endswith(suffix)]
    assert len(found) == 1, [v.path for v in report.verdicts]
    return found[0]


@pytest.mark.parametrize("suffix, benchmark, layout, verdict_name, reasons", [
    ("kbx_corpus/records.jsonl#L1/after_code", "kernelbenchx", "kernelbenchx-corpus", "trusted",
     []),
    ("kbx_corpus/records.jsonl#L2/after_code", "kernelbenchx", "kernelbenchx-corpus", "rejected",
     ["KA101", "KA107", "KA104"]),
    ("kbx_corpus/records.jsonl#L3/after_code", "kernelbenchx", "kernelbenchx-corpus",
     "claimed-incorrect", ["the run marks it incorrect"]),
    ("predictions.jsonl#L1/predict", "kernelbenchx", "kernelbenchx-predictions", "trusted", []),
    ("out_run/metrics.json#L15/code", "kernelbenchx", "kernelbenchx-metrics", "rejected",
     ["KA101", "KA107", "KA104"]),
    ("submissions/relu.py", "kernelbenchx", "kernelbenchx-file", "trusted", []),
    ("fastkernels/set/L1/gelu.py", "fastkernels", "fastkernels-set", "trusted", []),
    ("fastkernels/set/L1/silu.py", "fastkernels", "fastkernels-set", "trusted", []),
    ("candidate/L1/gelu.py", "fastkernels", "fastkernels-candidate", "trusted", []),
    ("scaled_relu/generated_kernel.py", "atrex", "atrex-candidate", "trusted", []),
    ("scaled_relu/candidate.py", "atrex", "atrex-eval", "trusted", []),
    ("toy_gpu.json#L6/custom_code", "cuda-l1", "cuda-l1", "trusted", []),
    ("toy_gpu.json#L11/custom_code", "cuda-l1", "cuda-l1", "rejected", ["KA101", "KA301"]),
    ("toy_gpu.jsonl#L2/custom_code", "cuda-l1", "cuda-l1", "rejected", ["KA101", "KA301"]),
])
def test_layouts_are_recognised(report, suffix, benchmark, layout, verdict_name, reasons):
    found = verdict(report, suffix)
    assert (found.submission.benchmark, found.submission.layout) == (benchmark, layout)
    assert (found.verdict, found.reasons) == (verdict_name, reasons)


def test_problems_and_inputs_are_not_candidates(report):
    scanned = {v.path for v in report.verdicts}
    for name in ("kernelbenchx/Activation/relu.py", "scaled_relu/reference.py",
                 "scaled_relu/input.py", "baseline/L1/gelu.py"):
        assert not any(path.endswith(name) for path in scanned), name
    assert not report.errors


def test_kernelbenchx_claims_keep_the_round_transition(report):
    data = verdict(report, "records.jsonl#L2/after_code").to_dict()
    assert data["benchmark"] == "kernelbenchx" and data["task"] == "Activation/relu.py"
    claimed = data["claimed"]
    assert (claimed["correctness"], claimed["speedup"], claimed["runtime_ms"]) == (True, 70.0, 0.001)
    assert claimed["round"] == "round_1_to_round_2"
    assert claimed["previous"] == {"compiled": True, "correctness": True, "runtime_ms": 0.05,
                                   "speedup": 1.4}


def test_kernelbenchx_problem_spec(report):
    submission = verdict(report, "records.jsonl#L1/after_code").submission
    spec = submission.spec
    assert spec.tolerance == "kernelbenchx" and spec.inputs == "test-function"
    assert spec.reference.path.endswith("data/kernelbenchx/Activation/relu.py")
    assert (spec.reference_kind, spec.reference_name) == ("function", "relu")
    assert submission.candidate.entry.names == ("relu", "kernel_function")
    assert submission.candidate.backend == "triton"
    assert submission.reference == spec.reference.path


def test_fastkernels_claims_from_manifest_and_bench(report):
    silu = verdict(report, "set/L1/silu.py").to_dict()["claimed"]
    assert (silu["correctness"], silu["speedup"]) == (True, 2.5)
    checkout = verdict(report, "candidate/L1/gelu.py")
    claimed = checkout.to_dict()["claimed"]
    assert [case["shape"] for case in claimed["cases"]] == ["[64, 4096]", "[15644, 1152]"]
    assert claimed["speedup"] == pytest.approx((1.2 * 1.1) ** 0.5)  # the passed shapes' geomean
    assert checkout.submission.candidate.entry.names == ("GELU",)  # read from the baseline
    assert checkout.submission.spec.tolerance == "fastkernels"
    # the set is not under the checkout: its kernels do not take the checkout's bench.json
    assert "cases" not in verdict(report, "set/L1/gelu.py").to_dict()["claimed"]


def test_fastkernels_load_op_sources_are_analysed(report):
    assert any(f.path.endswith("set/L1/silu_fk.cu") and f.rule == "KA308"
               for f in report.findings)


def test_cuda_l1_scores(report):
    data = verdict(report, "toy_gpu.jsonl#L2/custom_code").to_dict()
    assert data["claimed"]["speedup"] == 40.0 and data["claimed"]["hardware"] == "toy_gpu"
    assert data["claimed"]["scores"] == {"score_default": 40.0,
                                         "score_torch_compile_default": 35.0,
                                         "score_cuda_graph": 30.0}
    assert (data["level"], data["problem"]) == (1, 2)
    assert data["reference"].endswith("toy_gpu.jsonl#L2/ref_code")
    assert verdict(report, "toy_gpu.json#L6/custom_code").to_dict()["claimed"]["speedup"] is None


def test_atrex_roofline_and_sizes(report):
    found = verdict(report, "scaled_relu/candidate.py")
    spec = found.submission.spec
    assert [size.id for size in spec.sizes] == ["0", "1"]
    assert spec.sizes[0].init_kwargs == {"scale": 2.0}
    assert spec.roofline["1"] == {"H20": 0.033, "H200": 0.028}  # from the checkout's data/
    assert spec.sol_ms("0", "NVIDIA H200") == 0.0035
    assert (spec.tolerance, spec.inputs_name, spec.dtype) == ("atrex", "_make_inputs", "bf16")
    cases = found.to_dict()["claimed"]["cases"]
    assert cases[0] == {"shape": "0", "status": "passed", "time_ms": 0.008, "sol_ms": 0.0035,
                        "sol_fraction": pytest.approx(0.4375)}
    assert found.submission.candidate.entry.names == ("Model",)


def test_record_findings_point_at_their_line_in_json_and_sarif(tmp_path):
    code, data = scan_json(str(BENCHMARKS / "cuda-l1"), "--no-cache", cwd=ROOT)
    assert code == 1
    stream = [f for f in data["findings"] if f["rule"] == "KA301"]
    assert {f["path"] for f in stream} == {
        "fixtures/benchmarks/cuda-l1/optimized_cuda_code/toy_gpu.json#L11/custom_code",
        "fixtures/benchmarks/cuda-l1/release/toy_gpu.jsonl#L2/custom_code"}
    text = (BENCHMARKS / "cuda-l1/optimized_cuda_code/toy_gpu.json").read_text().splitlines()
    assert text[10].lstrip().startswith('"custom_code"') and "cuda.Stream" in text[10]
    proc = kaudit("scan", str(BENCHMARKS / "cuda-l1"), "--no-cache", "--format", "sarif",
                  cwd=ROOT)
    log = json.loads(proc.stdout)
    validate(log)
    regions = {(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
                r["locations"][0]["physicalLocation"]["region"]["startLine"])
               for r in log["runs"][0]["results"] if r["ruleId"] == "KA301"}
    assert regions == {("fixtures/benchmarks/cuda-l1/optimized_cuda_code/toy_gpu.json", 11),
                       ("fixtures/benchmarks/cuda-l1/release/toy_gpu.jsonl", 2)}


def test_metrics_json_findings_point_at_the_code_line(report):
    finding = next(f for f in report.findings if f.rule == "KA101" and "metrics.json" in f.path)
    path, _, line = finding.path.partition("#L")
    lines = (ROOT / path).read_text().splitlines()
    assert lines[int(line.split("/")[0]) - 1].lstrip().startswith('"code"')


def test_benchmark_option_forces_a_layout(tmp_path):
    kernel = tmp_path / "relu.py"
    shutil.copy(BENCHMARKS / "kernelbenchx/submissions/relu.py", kernel)
    plain = kernel.read_text().split("#" * 146)[0]
    kernel.write_text(plain)  # no separator: nothing says KernelBenchX
    folder = str(tmp_path)
    assert scan_paths([folder]).files_skipped == 1
    forced = scan_paths([folder], Config(benchmark="kernelbenchx"))
    assert forced.files_scanned == 1 and forced.verdicts[0].submission.benchmark == "kernelbenchx"
    assert not forced.findings
    kernel.write_text(plain.replace("def relu(", "def not_the_entry("))
    missing = scan_paths([folder], Config(benchmark="kernelbenchx", cache_dir=None))
    assert [(f.rule, f.message) for f in missing.findings if f.rule == "KA002"] == [
        ("KA002", "no `relu` or `kernel_function` in this file; there is nothing to audit")]


def test_benchmark_config_key_and_bad_names(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.kaudit]\nbenchmark = "atrex"\n')
    assert load_config(tmp_path).benchmark == "atrex"
    (tmp_path / "pyproject.toml").write_text('[tool.kaudit]\nbenchmark = "kernelbench-x"\n')
    with pytest.raises(ConfigError, match="benchmark must be one of"):
        load_config(tmp_path)
    proc = kaudit("scan", str(tmp_path), "--benchmark", "nope", cwd=ROOT)
    assert proc.returncode == 2 and "nope" in proc.stderr


def test_kernelbenchx_bad_records_are_errors_and_the_rest_is_scanned(tmp_path):
    corpus = tmp_path / "records.jsonl"
    good = (BENCHMARKS / "kernelbenchx/data/kbx_corpus/records.jsonl").read_text().splitlines()
    bad_claims = json.loads(good[0])
    bad_claims["after"]["speedup"] = "fast"
    no_code = json.loads(good[0])
    no_code["after_code"] = 42
    corpus.write_text("\n".join([good[0], "{not json", json.dumps(no_code),
                                 json.dumps(bad_claims)]) + "\n")
    result = scan_paths([str(corpus)])
    assert [(e.path.rsplit("/", 1)[-1], e.message.split(":")[0]) for e in result.errors] == [
        ("records.jsonl#L2", "not JSON"), ("records.jsonl#L3", 'expected a record with "task_id" '
                                           '(a string) and "after_code" (the kernel\'s source), got '
                                           "task_id str and after_code int"),
        ("records.jsonl#L4", "claims not read")]
    assert [v.path.rsplit("/", 2)[-2:] for v in result.verdicts] == [
        ["records.jsonl#L1", "after_code"], ["records.jsonl#L4", "after_code"]]
    assert result.verdicts[1].speedup is None


def test_fastkernels_file_differing_from_the_manifest(tmp_path):
    results = tmp_path / "set"
    shutil.copytree(BENCHMARKS / "fastkernels/set", results)
    source = results / "L1/silu_fk.cu"
    source.write_text(source.read_text().replace("__expf(-x[i])", "1.f"))
    result = scan_paths([str(results)])
    assert len(result.errors) == 1
    error = result.errors[0]
    assert error.path.endswith("set/L1/silu.py")
    assert error.message.startswith("L1/silu_fk.cu differs from the sha256 in ")
    assert "(composed_speedup 2.5x) were measured on other code; not used" in error.message
    silu = next(v for v in result.verdicts if v.path.endswith("silu.py"))
    gelu = next(v for v in result.verdicts if v.path.endswith("gelu.py"))
    assert (silu.speedup, silu.submission.claim.correctness) == (None, None)
    assert gelu.speedup == 1.15
    # the same text with Windows line endings is the same file
    gelu_file = results / "L1/gelu.py"
    gelu_file.write_bytes(gelu_file.read_bytes().replace(b"\n", b"\r\n"))
    assert len(scan_paths([str(results)]).errors) == 1


def test_fastkernels_missing_kernel_is_reported(tmp_path):
    results = tmp_path / "set"
    shutil.copytree(BENCHMARKS / "fastkernels/set", results)
    (results / "L1/gelu.py").unlink()
    result = scan_paths([str(results)])
    assert [e.message for e in result.errors] == [
        "kernel L1/gelu.py is listed with claims but the file is missing"]
    assert len(result.verdicts) == 1


def test_cuda_l1_bad_scores_and_bad_json(tmp_path):
    release = tmp_path / "gpu.jsonl"
    lines = (BENCHMARKS / "cuda-l1/release/toy_gpu.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["score_default"] = "fast"
    release.write_text(json.dumps(record) + "\n" + lines[1] + "\n")
    broken = tmp_path / "other.json"
    broken.write_text('{"1": [{"task_id": 1, "custom_code": "x"')
    result = scan_paths([str(tmp_path)])
    assert sorted((e.path.rsplit("/", 1)[-1], e.message) for e in result.errors) == [
        ("gpu.jsonl#L1", "claims not read: score_default is 'fast'"),
        ("other.json", "cannot read: expected ',' at line 1")]
    assert len(result.verdicts) == 2


def test_atrex_bad_roofline_is_reported_and_the_kernel_scanned(tmp_path):
    operator = tmp_path / "data/scaled_relu"
    shutil.copytree(BENCHMARKS / "atrex/data/scaled_relu", operator)
    (operator / "roofline.json").write_text("[1, 2]")
    result = scan_paths([str(tmp_path)])
    assert [e.message.split(";")[0] for e in result.errors] == [
        'expected {"shapes": {"<id>": {"SOL_time_ms": {"<gpu>": <ms>}}}}']
    assert result.verdicts[0].submission.spec.roofline == {}
    assert result.files_scanned == 1


def test_atrex_generated_kernel_differing_from_its_bundle(tmp_path):
    operator = tmp_path / "data/scaled_relu"
    shutil.copytree(BENCHMARKS / "atrex/data/scaled_relu", operator)
    out = tmp_path / "outputs/scaled_relu_triton"
    out.mkdir(parents=True)
    shutil.copy(operator / "generated_kernel.py", out / "generated_kernel.py")
    (out / "generation.json").write_text(json.dumps(
        {"kernel": {"name": "scaled_relu", "backend": "triton", "path": "generated_kernel.py",
                    "sha256": "0" * 64}}))
    result = scan_paths([str(out)])
    assert [e.message for e in result.errors] == [
        "differs from the sha256 recorded in generation.json: this is not the kernel the "
        "generator wrote"]
    spec = result.verdicts[0].submission.spec
    assert spec.reference.path.endswith("data/scaled_relu/reference.py")  # found above it
    assert result.verdicts[0].submission.candidate.backend == "triton"


def test_json_positions():
    located = Located('{\n "a": [\n  {"b": "x"},\n  {"b":\n   "y"}\n ],\n "c": 3\n}\n')
    assert located.value == {"a": [{"b": "x"}, {"b": "y"}], "c": 3}
    assert (located.line("a"), located.line("a", 0, "b"), located.line("a", 1, "b"),
            located.line("c")) == (2, 3, 5, 7)
    for bad in ('{"a": 1,}', '[1 2]', '{"a": 1} x', '{1: 2}'):
        with pytest.raises(ValueError):
            Located(bad)


def test_vendored_samples():
    """The benchmarks' own files: KernelBenchX's 822x record computes its batch statistics with
    PyTorch and normalises in Triton, a partial replacement (KA108) whose claim stays unconfirmed;
    Atrex-Bench's operator folder is a problem, not a submission."""
    result = scan_paths([str(BENCHMARKS / "vendored")])
    assert not result.errors
    by_task = {v.submission.task: v for v in result.verdicts}
    claimed = by_task["Fusion/fused_silu_batch_norm.py"]
    assert (claimed.speedup, claimed.verdict, claimed.reasons) == (
        822.5223, "suspicious", ["KA108", "claimed 822.5x > 10x, unconfirmed"])
    assert claimed.submission.spec.reference is None  # the task is not in the published set
    assert by_task["Activation/gelu_bf16.py"].submission.reference.endswith(
        "Activation/gelu_bf16.py")
    assert result.files_scanned == 3  # reference.py and input.py of rms_norm are not kernels
    license_text = (BENCHMARKS / "vendored/atrex-bench/LICENSE").read_text()
    assert "Apache License" in license_text
    assert (BENCHMARKS / "vendored/PROVENANCE.md").is_file()


def test_cuda_l1_records_written_on_one_line_stay_apart(tmp_path):
    """A compact release file (the whole object on one line): each record keeps its own path."""
    release = json.loads((BENCHMARKS / "cuda-l1/optimized_cuda_code/toy_gpu.json").read_text())
    compact = tmp_path / "optimized_cuda_code" / "toy_gpu.json"
    compact.parent.mkdir()
    compact.write_text(json.dumps(release))
    records = [(level, position) for level, listed in release.items()
               for position in range(len(listed))]
    result = scan_paths([str(compact)])
    paths = sorted(v.path.split("#", 1)[1] for v in result.verdicts)
    assert paths == sorted(f"L1/{level}/{position}/custom_code" for level, position in records)
    assert all(v.submission.reference.endswith(v.path.split("#", 1)[1].replace("custom_code",
                                                                              "ref_code"))
               for v in result.verdicts)
