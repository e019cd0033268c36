"""`kaudit scan --dynamic` on the CPU: every fixture in fixtures/dynamic/ (a problem.py and a
kernel.py per folder) gives exactly the KD findings its markers name; the honest ones none. Also
the pairing rules, the CUDA decision, the coverage analysis, the sentinels and the CLI/SARIF/JSON
integration. The two C++ fixtures compile with g++ (about 25 s each, in parallel, cached per run);
the Triton fixtures run under Triton's interpreter (a few seconds each); the CUDA fixtures
(load_inline with cuda_sources) are KD500 notes here and run with KAUDIT_TEST_DEVICE=cuda."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import (
    CPU_ONLY,
    CPU_ONLY_FINDINGS,
    DYNAMIC_FIXTURES,
    GPU_ONLY_FINDINGS,
    ROOT,
    dynamic_fixtures,
    expected_findings,
)

torch = pytest.importorskip(
    "torch", reason="kaudit scan --dynamic needs torch (pip install 'kaudit[dynamic]'); CI installs it")

from kaudit.dynamic.harness import sentinels
from kaudit.dynamic.kernels import (
    DynamicOptions,
    GpuSlots,
    audit_kernel,
    cuda_reason,
    forward_location,
    pair_problem,
)
from kaudit.dynamic.judge import write_coverage
from kaudit.dynamic.tolerance import resolve

#: KAUDIT_TEST_DEVICE=cuda runs the fixtures on the GPU: the CUDA fixtures are then compiled and
#: judged by their markers, the Triton ones compiled for the GPU, and the CPU C++ fixtures skipped
DEVICE = os.environ.get("KAUDIT_TEST_DEVICE", "cpu")
#: calls on the candidate's model per fixture
FIXTURE_CALLS = (8, 12)
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("KAUDIT_TEST_DEVICE=cuda, but torch sees no CUDA device", allow_module_level=True)


def expected_on_device(folder: Path) -> set[tuple[str, int]]:
    """The (code, line) pairs the fixture must give on DEVICE: its markers, less the findings of
    the other device; a kernel that needs CUDA gives only the KD500 note on a CPU run."""
    kernel = folder / "kernel.py"
    text = kernel.read_text()
    if DEVICE != "cuda" and cuda_reason(text) is not None:
        return {("KD500", forward_location(str(kernel), text).line)}
    other_device = CPU_ONLY_FINDINGS if DEVICE == "cuda" else GPU_ONLY_FINDINGS
    return {(code, line) for code, line in expected_findings(kernel) if code not in other_device}


@pytest.fixture(scope="module")
def fixture_runs(tmp_path_factory):
    """Every fixture folder audited once, several at a time (on CUDA spread over the GPUs)."""
    # on CUDA every candidate job compiles its extension first, many at once; fewer calls than the
    # default dozens keep the Triton interpreter's fixtures within CI time (tests/adversarial
    # runs the default schedule)
    options = DynamicOptions(resolve(None, None, None), device=DEVICE, calls=FIXTURE_CALLS,
                             timeout=480 if DEVICE == "cuda" else 240,
                             extensions_dir=str(tmp_path_factory.mktemp("extensions")))
    workers = min(8, os.cpu_count() or 1)
    slots = GpuSlots(workers) if DEVICE == "cuda" else None

    def one(folder: Path):
        kernel = folder / "kernel.py"
        text = kernel.read_text()
        # `# fixture-tolerance: NAME`: the fixture is judged by that benchmark's check
        preset = re.search(r"^# fixture-tolerance: ([\w-]+)", text, re.M)
        chosen = dataclasses.replace(options, tolerance=resolve(preset.group(1), None, None)) \
            if preset else options
        with slots.take() if slots else contextlib.nullcontext() as gpu:
            return folder.name, audit_kernel(str(kernel), str(kernel), text, chosen, DEVICE,
                                             gpu=gpu)

    folders = [f for f in dynamic_fixtures() if not (DEVICE == "cuda" and f.name in CPU_ONLY)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(one, folders))


@pytest.mark.parametrize("folder", dynamic_fixtures(), ids=lambda p: p.name)
def test_dynamic_fixture_findings_match_markers(folder, fixture_runs):
    if DEVICE == "cuda" and folder.name in CPU_ONLY:
        pytest.skip("a CPU C++ extension: its kernel dereferences host pointers")
    run = fixture_runs[folder.name]
    expected = expected_on_device(folder)
    actual = {(f.rule, f.line) for f in run.findings}
    messages = "\n".join(f"{f.rule}:{f.line}: {f.message}" for f in run.findings)
    assert actual == expected, messages
    assert all(f.pass_ == "dynamic" and f.message for f in run.findings)
    markers = expected_findings(folder / "kernel.py")
    if folder.name.startswith("good_"):
        assert not markers, "an honest fixture declares no finding"
        assert run.status == ("needs-cuda" if expected else "ok"), messages
    else:
        assert folder.name.startswith("bad_") and markers, "a bad fixture declares its findings"


@pytest.mark.skipif(DEVICE == "cuda", reason="the C++ fixtures are CPU extensions")
def test_write_coverage_numbers(fixture_runs):
    (first_row,) = fixture_runs["bad_cpp_first_row"].findings  # at::empty_like in C++ poisoned
    metrics = first_row.metrics
    assert metrics["numel"] == 32 * 48 and metrics["unwritten"] == 31 * 48
    assert metrics["pattern"] == "tail" and metrics["first_unwritten"] == 48
    assert metrics["rows_unwritten"] == 31 and "96.9 %" in first_row.message
    (empty,) = fixture_runs["bad_empty_output"].findings
    assert empty.metrics["fraction"] == 1.0 and empty.metrics["pattern"] == "all"
    (dependent,) = fixture_runs["bad_uninitialised_accumulator"].findings
    assert dependent.metrics["dependent"] == 32 and dependent.metrics["deterministic"]
    tiny = fixture_runs["bad_tiny_output_atol"].findings[0]
    assert tiny.metrics["relative_l2"] > 0.5 and tiny.metrics["max_abs_reference"] < 1e-8
    assert fixture_runs["good_cpp_extension"].metrics["poisoned"] >= 4  # one per poisoned run


def test_levels_follow_what_the_output_still_carries(fixture_runs):
    """KD201 is an error at a relative L2 error of 0.5 or more (the output carries none of the
    reference's signal), a warning below; KD402 an error, a warning when the reference problem
    modifies its inputs too."""
    def finding(name: str, code: str):
        (found,) = [f for f in fixture_runs[name].findings if f.rule == code]
        return found

    hardtanh = finding("bad_tiny_output_hardtanh", "KD201")
    assert hardtanh.level.value == "warning" and 0.1 < hardtanh.metrics["relative_l2"] < 0.5
    for name in ("bad_tiny_output_atol", "bad_zeros_tiny_triton", "bad_tiny_output_approx_triton"):
        tiny = finding(name, "KD201")
        assert tiny.level.value == "error" and tiny.metrics["relative_l2"] >= 0.5, tiny.message
        assert "none of the reference's signal" in tiny.message
    assert finding("bad_zeros_tiny_triton", "KD201").metrics["relative_l2"] == 1.0
    for name in ("bad_zeroes_input", "bad_inplace_triton"):
        assert finding(name, "KD402").level.value == "error"
    as_reference = finding("bad_inplace_as_reference", "KD402")
    assert as_reference.level.value == "warning"
    assert "the reference problem modifies its inputs too" in as_reference.message


def test_a_kernel_right_only_with_its_own_initialisation_is_judged_on_it(fixture_runs):
    """An `__init__` that folds a constant into a parameter is right as KernelBench builds it:
    a warning, and the later jobs (the plain run here: no KD406) build it the same way; an answer
    kept from the first call is still wrong on its own model; a kernel that draws its own
    parameters in another order is judged with Model's weights, as before."""
    folded = fixture_runs["bad_folds_constant_into_bias"]
    (warning,) = folded.findings
    assert warning.level.value == "warning" and warning.metrics["own_init_entries"] == [
        "linear.bias"], warning.message
    assert "right only with its own initialisation" in warning.message
    assert folded.metrics["initialisation"] == "own"
    (stale,) = fixture_runs["bad_folds_constant_then_caches"].findings
    assert stale.level.value == "error" and "initialisation" not in stale.message
    assert "initialisation" not in fixture_runs["bad_folds_constant_then_caches"].metrics
    assert "initialisation" not in fixture_runs["good_own_parameter_order"].metrics


def test_a_stale_output_names_what_can_explain_it(fixture_runs):
    """In the first call's buffers a side stream that reads them too early gives the first
    answer as a cache does; in new buffers only a kept answer can."""
    for name in ("bad_data_ptr_cache", "bad_shape_cache_triton"):
        (stale,) = [f for f in fixture_runs[name].findings if f.rule == "KD401"]
        assert "keeps an answer between calls" in stale.message, stale.message
        early_read = "before the caller's copy into them is done" in stale.message
        assert early_read == (stale.metrics["buffers"] == "same"), stale.message


def test_allocations_are_poisoned_on_the_device(fixture_runs):
    (empty,) = fixture_runs["bad_empty_output"].findings
    assert empty.rule == "KD101" and empty.metrics["fraction"] == 1.0
    assert fixture_runs["bad_empty_output"].metrics["poisoned"] >= 4
    assert fixture_runs["good_pytorch_linear"].metrics["state_matched"] == 2  # weight and bias


KEY = "test-key"


def _runs(tensor_of_run):
    return [tensor_of_run(run) for run in range(sentinels.RUNS)]


def _poisoned(shape, written, dtype=torch.float32):
    """Outputs of the poisoned runs where `written` (a bool mask) holds 1.0, run's pattern
    elsewhere."""
    def make(run):
        out = torch.empty(shape, dtype=dtype)
        sentinels.fill(out, run, KEY)
        out[written] = 1
        return out
    return _runs(make)


def test_coverage_patterns():
    mask = torch.zeros(8, 6, dtype=torch.bool)
    mask[::2] = True  # odd rows never written
    coverage = write_coverage(_poisoned((8, 6), mask), KEY)
    assert coverage["pattern"] == "rows" and coverage["rows_unwritten"] == 4
    mask = torch.ones(8, 7, dtype=torch.bool)
    mask.view(-1)[1::3] = False  # every third element: not whole columns of 7
    coverage = write_coverage(_poisoned((8, 7), mask, torch.float16), KEY)
    assert coverage["pattern"] == "strided" and coverage["stride"] == 3
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[:, 4] = False
    assert write_coverage(_poisoned((4, 5), mask, torch.int32), KEY)["pattern"] == "columns"
    full = write_coverage(_poisoned((4, 5), torch.ones(4, 5, dtype=torch.bool), torch.bfloat16),
                          KEY)
    assert full["unwritten"] == 0 and full["dependent"] == 0 and full["deterministic"]


def test_an_element_holding_a_pattern_value_in_one_run_only_is_written():
    runs = [torch.ones(4) for _ in range(sentinels.RUNS)]
    sentinels.fill(runs[1], 1, KEY)  # looks like run 1's pattern, but not in the other runs
    coverage = write_coverage(runs, KEY)
    assert coverage["unwritten"] == 0 and coverage["dependent"] == 4


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_patterns_are_keyed_disjoint_and_the_repeat_run_repeats(dtype):
    palettes = [set(sentinels.palette(dtype, run, KEY).tolist()) for run in range(sentinels.RUNS)]
    assert all(len(p) == sentinels.PALETTE for p in palettes)
    assert not (palettes[0] & palettes[1]) and not (palettes[1] & palettes[2]) \
        and not (palettes[0] & palettes[2]) and palettes[3] == palettes[0]
    assert palettes[0] != set(sentinels.palette(dtype, 0, "another scan").tolist())
    fills = []
    for run in range(sentinels.RUNS):
        tensor = torch.empty(5000, dtype=dtype)
        assert sentinels.fill(tensor, run, KEY, salt=7)
        bits = sentinels.as_bits(tensor)
        assert set(bits.tolist()) <= palettes[run] and len(set(bits.tolist())) > 8, \
            "many values of the run's palette, not one repeated"
        fills.append(bits)
    assert torch.equal(fills[3], fills[0]) and not torch.equal(fills[1], fills[0])
    if dtype.is_floating_point:  # each element a NaN in exactly one of runs 0-2
        nan = [torch.isnan(f.view(dtype)) for f in fills[:3]]
        assert bool((nan[0].int() + nan[1].int() + nan[2].int() == 1).all())
        assert not bool(nan[0].all()), "fresh memory is not all NaN"


def test_the_same_allocation_number_gets_the_same_rotation_in_every_run():
    first, again, other = (torch.empty(100) for _ in range(3))
    sentinels.fill(first, 0, KEY, salt=3)
    sentinels.fill(again, 3, KEY, salt=3)
    sentinels.fill(other, 0, KEY, salt=4)
    assert torch.equal(sentinels.as_bits(first), sentinels.as_bits(again))
    assert not torch.equal(sentinels.as_bits(first), sentinels.as_bits(other))


def test_pairing_order(tmp_path):
    options = DynamicOptions(resolve(None, None, None), problems_root=str(tmp_path / "KB"))
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "KB" / "level2").mkdir(parents=True)
    kb_problem = tmp_path / "KB" / "level2" / "17_Conv2d_ReLU.py"
    kb_problem.write_text("")
    kernel = run / "level_2_problem_17_sample_0_kernel.py"
    kernel.write_text("")
    assert pair_problem(str(kernel), None, options) == str(kb_problem)
    assert pair_problem(str(kernel), None, DynamicOptions(resolve(None, None, None))) is None
    folder_kernel = tmp_path / "gen" / "level_2" / "problem_17.py"
    folder_kernel.parent.mkdir(parents=True)
    folder_kernel.write_text("")
    assert pair_problem(str(folder_kernel), None, options) == str(kb_problem)
    # a results tree's reference, then a sibling, beats the KernelBench name
    sibling = run / "ref_code.py"
    sibling.write_text("")
    assert pair_problem(str(kernel), None, options) == str(sibling)
    named = tmp_path / "named.py"
    named.write_text("")
    assert pair_problem(str(kernel), str(named), options) == str(named)
    assert pair_problem(str(kernel), "runs.jsonl#L3/ref_code", options) == str(sibling)
    explicit = DynamicOptions(resolve(None, None, None), problem=str(kb_problem))
    assert pair_problem(str(kernel), str(named), explicit) == str(kb_problem)
    # a kernel is never its own problem
    alone = tmp_path / "alone" / "problem.py"
    alone.parent.mkdir()
    alone.write_text("")
    assert pair_problem(str(alone), None, DynamicOptions(resolve(None, None, None))) is None


def test_cuda_is_decided_from_the_text():
    cuda = (DYNAMIC_FIXTURES / "bad_needs_cuda" / "kernel.py").read_text()
    cpp = (DYNAMIC_FIXTURES / "good_cpp_extension" / "kernel.py").read_text()
    triton = "import triton\nimport triton.language as tl\n"
    assert "cuda_sources" in cuda_reason(cuda, False)
    assert cuda_reason(cpp, False) is None
    assert "install triton" in cuda_reason(triton, False)
    assert cuda_reason(triton, True) is None  # runs under TRITON_INTERPRET=1
    assert cuda_reason("ext = load(name='k', sources=['k.cu'])\n", False) is not None


def test_needs_cuda_is_a_note_without_any_compile(tmp_path):
    kernel = DYNAMIC_FIXTURES / "bad_needs_cuda" / "kernel.py"
    options = DynamicOptions(resolve(None, None, None), extensions_dir=str(tmp_path))
    run = audit_kernel(str(kernel), "kernel.py", kernel.read_text(), options, "cpu")
    assert [(f.rule, f.level.value) for f in run.findings] == [("KD500", "note")]
    assert "not run: needs CUDA" in run.findings[0].message
    assert not any(tmp_path.iterdir()), "nothing may be built for a kernel that is not run"


def _kaudit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run([sys.executable, "-m", "kaudit", *args], check=False, capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def test_cli_json_and_sarif(tmp_path):
    # run from the repository root, so SARIF locations are %SRCROOT%-relative
    folders = [f"fixtures/dynamic/{name}" for name in ("bad_empty_output", "bad_no_problem")]
    proc = _kaudit("scan", *folders, "--dynamic", "--device", "cpu", "--no-cache", "-f", "json",
                   cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    dynamic = sorted((f["rule"], f["pass"], f["line"]) for f in data["findings"]
                     if f["rule"].startswith("KD"))
    assert dynamic == [("KD101", "dynamic", 11), ("KD502", "dynamic", 11)]
    assert all(f["fingerprint"] for f in data["findings"])
    verdicts = {Path(v["path"]).parent.name: v for v in data["verdicts"]}
    assert verdicts["bad_empty_output"]["verdict"] == "rejected"
    assert "KD101" in verdicts["bad_empty_output"]["reasons"]
    assert data["summary"]["dynamic"]["statuses"] == {"ok": 1, "no-problem": 1}
    proc = _kaudit("scan", *folders, "--dynamic", "--device", "cpu", "--no-cache", "-f", "sarif",
                   cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    log = json.loads(proc.stdout)
    from tests.test_sarif import assert_github_rules, validate

    for run in log["runs"]:  # GitHub takes one run per category and file: see --output-dir
        assert_github_rules({**log, "runs": [run]})
    runs = log["runs"]
    assert [r["automationDetails"]["id"] for r in runs] == ["kaudit/static/", "kaudit/dynamic/"]
    assert not [r for r in runs[0]["results"] if r["ruleId"].startswith("KD")]
    assert sorted(r["ruleId"] for r in runs[1]["results"]) == ["KD101", "KD502"]
    assert {d["id"] for d in runs[1]["tool"]["driver"]["rules"]} >= {"KD101", "KD202", "KD501"}
    proc = _kaudit("scan", folders[0], "--dynamic", "--device", "cpu", "--no-cache",
                   "--output-dir", str(tmp_path / "out"), cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    # the static pass sees the unwritten `torch.empty_like` returned as well (KA105)
    for name, category, rules in (("kaudit-static.sarif", "kaudit/static/", ["KA105"]),
                                  ("kaudit-dynamic.sarif", "kaudit/dynamic/", ["KD101"])):
        log = json.loads((tmp_path / "out" / name).read_text())
        validate(log)
        (run,) = log["runs"]
        assert run["automationDetails"]["id"] == category
        assert [r["ruleId"] for r in run["results"]] == rules


def test_cli_usage_errors(tmp_path):
    folder = str(DYNAMIC_FIXTURES / "bad_no_problem")
    proc = _kaudit("scan", folder, "--dynamic", "--tolerance", "nope", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown tolerance preset" in proc.stderr
    proc = _kaudit("scan", folder, "--dynamic", "--problem", "missing.py", cwd=tmp_path)
    assert proc.returncode == 2 and "not a file" in proc.stderr


def test_static_scan_without_dynamic_never_imports_torch_nor_runs_kernels():
    code = ("import sys, kaudit.cli\n"
            "from typer.testing import CliRunner\n"
            "result = CliRunner().invoke(kaudit.cli.app, ['scan', 'fixtures/dynamic', "
            "'--no-cache', '-f', 'json'])\n"
            "assert result.exit_code in (0, 1), result.output\n"
            "assert '\"pass\": \"dynamic\"' not in result.output\n"
            "assert 'torch' not in sys.modules, 'the static scan imported torch'\n"
            "ran = {'kaudit.dynamic.kernels', 'kaudit.dynamic.runner', 'kaudit.dynamic.harness.sentinels'}"
            " & set(sys.modules)\n"
            "assert not ran, ran\n")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout


def _write_pair(folder: Path, kernel: str) -> Path:
    folder.mkdir()
    (folder / "problem.py").write_text((DYNAMIC_FIXTURES / "bad_raises" / "problem.py").read_text())
    (folder / "kernel.py").write_text(kernel)
    return folder / "kernel.py"


HEAD = "import time\nimport torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"


def test_timeout_and_compile_error_are_kd501(tmp_path):
    hangs = _write_pair(tmp_path / "hangs", HEAD + (
        "\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n"
        "        time.sleep(600)\n"
        "        return x\n"))
    broken = _write_pair(tmp_path / "broken", HEAD + (
        "ext = load_inline(name='kaudit_broken', cpp_sources='int f( { return 1; }', functions=[])\n"
        "\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x\n"))
    def audit(kernel: Path, timeout: float):
        options = DynamicOptions(resolve(None, None, None), device="cpu", timeout=timeout)
        return audit_kernel(str(kernel), str(kernel), kernel.read_text(), options, "cpu")

    with ThreadPoolExecutor(2) as pool:
        hung, failed = pool.map(audit, (hangs, broken), (15, 240))
    (finding,) = hung.findings
    assert finding.rule == "KD501" and "timed out" in finding.message
    assert "during forward" in finding.message, finding.message
    assert finding.metrics["status"] == "timeout" and finding.line == 8
    (finding,) = failed.findings
    assert finding.rule == "KD501" and "import or compile" in finding.message, finding.message


def test_a_kernel_that_raises_is_kd501_with_where_it_raised(fixture_runs):
    (finding,) = [f for f in fixture_runs["bad_raises"].findings if f.rule == "KD501"]
    tail = finding.metrics["traceback_tail"]
    assert "in forward" in tail and "raise ValueError" in tail, tail
    assert tail.rstrip().endswith("columns must be a multiple of 128, got 64"), tail


def test_a_miss_against_a_reference_that_is_rounding_noise_is_a_warning(fixture_runs):
    """A CUDA-L1 reference (GroupNorm, then a mean) is zero in exact arithmetic: its float32
    output is noise, and kaudit rejected a kernel (KD201 error) for noise of its own. The
    reference's distance from its float64 run now tells; a tiny output with a signal is still
    rejected."""
    (noise,) = fixture_runs["bad_reference_is_rounding_noise"].findings
    assert noise.rule == "KD201" and noise.level.value == "warning", noise.message
    # its exact answer is zero: the distance is infinite
    assert "rounding noise (relative L2 inf" in noise.message, noise.message
    assert fixture_runs["good_reference_is_rounding_noise"].findings == [], \
        "a kernel that matches the noise is not flagged"
    (tiny,) = fixture_runs["bad_tiny_output_atol"].findings
    assert tiny.rule == "KD201" and tiny.level.value == "error", tiny.message
