"""`kaudit problems`: the probes on the problem fixtures (markers on their `class Model` line),
the KP rules' Examples, the report formats, isolation, timeouts and crashes. CPU only, except the
tests marked `gpu`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kaudit.rule import all_rules
from tests.conftest import PROBLEM_FIXTURES, ROOT, expected_findings, problem_fixtures

torch = pytest.importorskip(
    "torch", reason="kaudit problems needs torch (pip install 'kaudit[dynamic]'); CI installs it")

from kaudit.dynamic.problems import Options, audit_problems  # noqa: E402
from kaudit.dynamic.tolerance import PRESETS, resolve  # noqa: E402

#: generous for a slow CI machine (a problem here takes 1-3 s: mostly importing torch)
TIMEOUT = 30.0
FAST = [p for p in problem_fixtures() if p.name != "bad_hangs.py"]
KP_RULES = [r for r in all_rules() if getattr(r, "audit", "static") == "problems"]
MARKER_FILE = "kaudit_problem_was_here.txt"


def audit(paths, preset="kernelbench-v0", **options):
    options.setdefault("timeout", TIMEOUT)
    options.setdefault("jobs", 2)
    return audit_problems([str(p) for p in paths], Options(PRESETS[preset], device="cpu",
                                                           **options))


def kaudit(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kaudit", "problems", *args], capture_output=True,
                          text=True, cwd=cwd or ROOT, timeout=600)


@pytest.fixture(scope="module")
def fixtures_report():
    return audit(FAST)


@pytest.mark.parametrize("fixture", FAST, ids=lambda p: p.name)
def test_fixture_findings_match_markers(fixtures_report, fixture):
    (problem,) = [p for p in fixtures_report.problems
                  if Path(p.path).resolve() == fixture.resolve()]
    actual = {(f.rule, f.line) for f in problem.findings}
    messages = "\n".join(f"{f.rule}:{f.line}: {f.message}" for f in problem.findings)
    assert actual == expected_findings(fixture), f"findings differ from markers:\n{messages}"
    assert all(f.pass_ == "problems" and f.fingerprint for f in problem.findings)


def test_hanging_problem_times_out():
    report = audit([PROBLEM_FIXTURES / "bad_hangs.py"], timeout=4.0)
    (problem,) = report.problems
    (finding,) = problem.findings
    assert finding.rule == "KP501" and problem.status == "failed"
    assert "timed out after 4 s during forward" in finding.message
    assert problem.wall_s < 15


def test_probe_values(fixtures_report):
    by_name = {Path(p.path).name: p for p in fixtures_report.problems}
    tiny = by_name["bad_tiny_output.py"]
    assert tiny.zeros_pass and tiny.constant_pass and tiny.other_input_pass
    assert tiny.max_abs < 1e-6 and tiny.shapes == [[32, 64]] and tiny.dtypes == ["float32"]
    assert tiny.recommended["usable"] and 1e-6 <= tiny.recommended["rel_l2"] < 1e-4
    assert tiny.absolute["share"] == 1.0
    mean = by_name["bad_mean_of_uniform.py"]
    assert not mean.zeros_pass and mean.constant_pass and abs(mean.constant - 0.5) < 1e-3
    assert mean.other_input_pairs == {"passing": 6, "total": 6}
    assert [s["seed"] for s in mean.seeds] == [0, 1, 2]
    honest = by_name["good_matmul.py"]
    assert (honest.zeros_pass, honest.constant_pass, honest.other_input_pass) == (False,) * 3
    assert honest.other_input_pairs["passing"] == 0
    assert {s["scale"] for s in honest.scales} == {1e-3, 1.0, 1e3}
    assert not any(s.get("ill_conditioned") for s in honest.scales)
    noise = by_name["bad_rounding_noise.py"]
    assert not noise.recommended["usable"] and any("noise" in r for r in noise.degenerate)
    nan = by_name["bad_nan_output.py"]
    assert nan.stats["nan"] > 0 and nan.recommended is None
    init = by_name["bad_raises_in_init.py"]
    assert "during init: ValueError: 10 channels" in init.findings[0].message
    crash = by_name["bad_segfault.py"]
    assert "SIGSEGV" in crash.findings[0].message and "bad_segfault.py" in crash.findings[0].message
    softmax = by_name["bad_naive_softmax.py"]
    (overflow,) = [s for s in softmax.scales if s.get("ill_conditioned")]
    assert overflow["scale"] == 1e3 and overflow["native_nonfinite"] > 0
    summary = fixtures_report.summary
    assert summary["problems"] == len(FAST) and summary["failed"] == 2
    assert summary["zeros_pass"] == 2 and summary["constant_pass"] == 3
    assert summary["other_input_pass"] == 4


def test_tolerance_presets_change_the_verdict():
    """At the current KernelBench tolerance (1e-4 for fp32) the mean of uniform inputs is no
    longer matched by a constant; the tiny output still is."""
    report = audit([PROBLEM_FIXTURES / "bad_mean_of_uniform.py",
                    PROBLEM_FIXTURES / "bad_tiny_output.py"], preset="kernelbench")
    mean, tiny = report.problems
    assert mean.codes() == [] and not mean.constant_pass
    assert {"KP101", "KP102", "KP103", "KP201"} <= set(tiny.codes())
    assert tiny.tolerance == {"preset": "kernelbench", "atol": 1e-4, "rtol": 1e-4}


def test_tolerance_resolution():
    assert resolve(None, None, None).name == "kernelbench"
    assert PRESETS["kernelbench"].for_dtype("bfloat16") == (1e-2, 1e-2)
    assert PRESETS["kernelbench"].for_dtype("torch.float32") == (1e-4, 1e-4)
    assert PRESETS["robust-kbench"].for_dtype("float16") == (1e-5, 1e-5)
    assert resolve(None, 1e-3, 0.0).for_dtype("float32") == (1e-3, 0.0)
    for bad in (("nope", None, None), ("kernelbench", 1e-3, 1e-3), (None, 1e-3, None),
                (None, -1.0, 0.0)):
        with pytest.raises(ValueError):
            resolve(*bad)


@pytest.fixture(scope="module")
def examples_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("examples")
    for rule in KP_RULES:
        (folder / f"example_{rule.code}.py").write_text(rule.docs().example, encoding="utf-8")
    return {Path(p.path).stem.removeprefix("example_"): p
            for p in audit(sorted(folder.glob("*.py"))).problems}


@pytest.mark.parametrize("rule", KP_RULES, ids=lambda r: r.code)
def test_rule_example_fires_in_problems_audit(rule, examples_report):
    """The other half of tests/test_docs_and_framework.py::test_rule_example_fires for KP rules
    (run with --tolerance kernelbench-v0, as the Examples say)."""
    problem = examples_report[rule.code]
    assert rule.code in problem.codes(), [f.message for f in problem.findings]


def test_static_scan_never_emits_kp_and_never_imports_torch():
    code = ("import sys, kaudit, kaudit.cli\n"
            "r = kaudit.scan_paths(['fixtures/problems', 'fixtures/rules/KA101'])\n"
            "assert r.files_scanned > 10, r.files_scanned\n"
            "assert not [f for f in r.findings if f.rule.startswith('KP')]\n"
            "assert 'torch' not in sys.modules, 'the static scan imported torch'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_problem_code_never_runs_in_the_kaudit_process(tmp_path, monkeypatch):
    """The fixture rebinds torch.allclose and writes a file in its working folder: neither reaches
    this process, its working folder or the fixture's folder."""
    monkeypatch.chdir(tmp_path)
    real_allclose = torch.allclose
    report = audit([PROBLEM_FIXTURES / "good_tampers_with_harness.py"], jobs=1)
    (problem,) = report.problems
    assert problem.status == "ok" and problem.findings == []
    assert torch.allclose is real_allclose
    assert "kaudit_problem" not in sys.modules
    for folder in (tmp_path, ROOT, PROBLEM_FIXTURES):
        assert not (folder / MARKER_FILE).exists()
    assert not list(PROBLEM_FIXTURES.glob("__pycache__"))


def test_not_a_problem_and_inconsistent_outputs(tmp_path):
    (tmp_path / "no_init_inputs.py").write_text(
        "import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
        "        return x\n\n\ndef get_inputs():\n    return [torch.rand(2)]\n")
    (tmp_path / "shape_changes.py").write_text(
        "import torch\n\nCALLS = [0]\n\n\nclass Model(torch.nn.Module):\n"
        "    def forward(self, x):\n        CALLS[0] += 1\n        return x[: CALLS[0]]\n\n\n"
        "def get_inputs():\n    return [torch.rand(8)]\n\n\ndef get_init_inputs():\n"
        "    return []\n")
    (tmp_path / "returns_dict.py").write_text(
        "import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
        "        return {'y': x}\n\n\ndef get_inputs():\n    return [torch.rand(2)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    (tmp_path / "notes.py").write_text("print('not a problem')\n")
    report = audit([tmp_path])
    assert report.files_skipped == 1
    messages = {Path(p.path).name: p.findings[0].message for p in report.problems}
    assert set(messages) == {"no_init_inputs.py", "shape_changes.py", "returns_dict.py"}
    assert "no get_init_inputs" in messages["no_init_inputs.py"]
    assert "changes with the seed" in messages["shape_changes.py"]
    assert "returned dict" in messages["returns_dict.py"]
    assert all(p.codes() == ["KP501"] for p in report.problems)


def test_cli_json_shape(tmp_path):
    proc = kaudit("fixtures/problems/bad_tiny_output.py", "fixtures/problems/good_matmul.py",
                  "--device", "cpu", "--format", "json", "--seeds", "2", "--scales", "1,1e3",
                  "--stream", str(tmp_path / "lines.jsonl"))
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["tolerance"]["preset"] == "kernelbench" and data["device"] == "cpu"
    assert data["seeds"] == [0, 1] and data["scales"] == [1.0, 1000.0]
    tiny, honest = data["problems"]
    for key in ("path", "zeros_pass", "constant_pass", "other_input_pass", "max_abs",
                "recommended", "findings", "shape", "dtype", "std", "seeds", "scales"):
        assert key in tiny
    assert tiny["path"] == "fixtures/problems/bad_tiny_output.py"
    assert tiny["zeros_pass"] is True and honest["zeros_pass"] is False
    assert tiny["shape"] == [32, 64] and tiny["dtype"] == "float32"
    assert {"rel_l2", "max_rel", "usable"} <= set(honest["recommended"])
    assert {f["rule"] for f in tiny["findings"]} == {"KP101", "KP102", "KP103", "KP201"}
    assert all(f["line"] == 12 and f["pass"] == "problems" for f in tiny["findings"])
    assert data["summary"]["problems"] == 2 and data["summary"]["zeros_pass"] == 1
    assert data["summary"]["groups"][0]["key"] == "fixtures/problems"
    # --stream: a line per problem, as each ended
    lines = [json.loads(line) for line in (tmp_path / "lines.jsonl").read_text().splitlines()]
    lines.sort(key=lambda line: line["path"])  # written as each problem ends
    assert [(line["path"], line["verdict"]) for line in lines] == [
        ("fixtures/problems/bad_tiny_output.py", "error"),
        ("fixtures/problems/good_matmul.py", "clean")]
    assert lines[0]["findings"] == tiny["findings"] and lines[0]["seconds"] > 0
    # where each problem's time went: the job's steps, all its runs, the judging, in both
    steps = honest["job_seconds"]
    assert {"job:import", "job:inputs", "job:forward", "job:save", "job:fp64", "job:scale",
            "judge", "runs", "queued"} <= set(steps) and all(s >= 0 for s in steps.values())
    job_steps = sum(s for name, s in steps.items() if name.startswith("job:"))
    # each figure is rounded to 1 ms
    assert job_steps <= steps["runs"] <= \
        lines[1]["seconds"] - steps["judge"] - steps["queued"] + 0.0015
    assert lines[1]["job_seconds"] == steps
    # the run's timeline: when each problem's turn came after the audit began; one at a time
    # (-j 1), in the files' order, the second once the first's job had run
    assert 0 <= tiny["started_s"] < honest["started_s"]
    assert honest["started_s"] >= tiny["started_s"] + tiny["job_seconds"]["runs"]
    assert lines[1]["started_s"] == honest["started_s"]
    # the fork server's start (it runs the jobs), ready before the first job ended
    fork = data["summary"]["fork_server"]
    assert fork["start_s"] > 0
    assert fork["ready_s"] <= tiny["started_s"] + tiny["job_seconds"]["runs"]
    # the audit's own seconds, from its start to its last problem's judging
    last = max(p["started_s"] + p["job_seconds"]["runs"] for p in (tiny, honest))
    assert last < data["summary"]["audit_s"] < 600
    assert honest["gpu_need"] is None and honest["gpu_peak_bytes"] is None, "on the CPU: none"


def test_the_gpu_memory_a_problem_held_is_read_from_its_job_as_numbers_only(tmp_path):
    """What the job's caching allocator held at most, beside the share it asked first: how far
    the sizing is from the need (on the H200 the jobs waited 220-436 s for GPU memory). The job
    ran benchmark code: only non-negative integers are read."""
    from kaudit.dynamic.harness.problem_job import MANIFEST
    from kaudit.dynamic.problems_analysis import analyse
    from kaudit.dynamic.runner import RunResult

    manifest = {"device": "cuda:0", "phase": "forward", "seeds": [], "timings": {},
                "gpu_peak_bytes": 3 << 30, "gpu_total_bytes": "140e9",
                "gpu_step_peaks": {"fp64": 3 << 30, "save": -1, "scale": True, "7": "1e9"}}
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    crashed = RunResult(status="crashed", error="killed", out_dir=tmp_path, _root=tmp_path)
    problem = analyse(crashed, "p.py", 1, Options(resolve(None, None, None)))
    assert problem.status == "failed"
    assert problem.gpu_peak_bytes == 3 << 30 and problem.gpu_total_bytes is None
    # which step held the most: forged steps dropped
    assert problem.gpu_step_peaks == {"fp64": 3 << 30}


def test_cli_text_markdown_and_sarif(tmp_path):
    from tests.test_sarif import validate

    files = ["fixtures/problems/bad_mean_of_uniform.py", "fixtures/problems/bad_raises_in_init.py"]
    text = kaudit(*files, "--device", "cpu", "--tolerance", "kernelbench-v0")
    assert text.returncode == 1
    assert "bad_mean_of_uniform.py" in text.stdout and "KP102" in text.stdout
    assert "2 problems, 1 ran: zeros pass on 0, a constant on 1" in text.stdout
    assert "\x1b[" not in text.stdout
    markdown = kaudit(*files, "--device", "cpu", "--tolerance", "kernelbench-v0", "-f", "markdown")
    assert "| `fixtures/problems` | 2 | 1 | 0 | 1 | 1 |" in markdown.stdout
    sarif_file = tmp_path / "problems.sarif"
    sarif = kaudit(*files, "--device", "cpu", "--tolerance", "kernelbench-v0", "-f", "sarif",
                   "-o", str(sarif_file))
    assert sarif.returncode == 0, sarif.stderr  # sarif never gates by default
    log = json.loads(sarif_file.read_text())
    validate(log)
    run = log["runs"][0]
    assert run["automationDetails"]["id"] == "kaudit/problems/"
    assert {r["id"] for r in run["tool"]["driver"]["rules"]} == {r.code for r in KP_RULES}
    results = {r["ruleId"]: r for r in run["results"]}
    assert set(results) == {"KP102", "KP103", "KP501"}
    region = results["KP501"]["locations"][0]["physicalLocation"]["region"]
    assert region["startLine"] == 10 and region["endColumn"] > 1


@pytest.mark.parametrize("args", [
    ["--tolerance", "nope"], ["--atol", "1e-3"], ["--tolerance", "kernelbench", "--atol", "1",
                                                  "--rtol", "0"],
    ["--scales", "0,1"], ["--device", "tpu"], ["no/such/problem.py"]])
def test_cli_usage_errors(args):
    paths = [] if args[0].startswith("no/") else ["fixtures/problems/good_matmul.py"]
    proc = kaudit(*paths, *args)
    assert proc.returncode == 2 and "kaudit:" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_empty_folder_is_an_error(tmp_path):
    proc = kaudit(str(tmp_path), "--format", "json")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["problems"] == [] and "no KernelBench problem files" in data["errors"][0]["message"]


@pytest.mark.gpu
def test_problems_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)")
    report = audit_problems([str(PROBLEM_FIXTURES / "good_matmul.py"),
                             str(PROBLEM_FIXTURES / "bad_tiny_output.py")],
                            Options(resolve("kernelbench", None, None), device="cuda",
                                    timeout=120))
    honest, tiny = report.problems
    assert report.device == "cuda" and honest.device.startswith("cuda")
    assert honest.codes() == [] and honest.recommended["usable"]
    assert {"KP101", "KP102", "KP103", "KP201"} <= set(tiny.codes())


def test_large_outputs_are_sampled_with_exact_extremes():
    """Outputs above `max_elements` come back as a fixed sample plus their min/max/max|y|: the
    zeros and constant probes stay exact, NaN counts come from the child, pairs are compared on
    the sample with half the tolerance."""
    report = audit([PROBLEM_FIXTURES / name for name in (
        "bad_tiny_output.py", "bad_mean_of_uniform.py", "bad_nan_output.py", "good_matmul.py")],
        max_elements=8)
    tiny, mean, nan, honest = report.problems
    assert tiny.stats["sampled"] == 8 and tiny.stats["numel"] == 32 * 64
    assert {"KP101", "KP102", "KP103", "KP201"} <= set(tiny.codes())
    assert mean.codes() == ["KP102", "KP103"]
    assert "sampled elements" in [f for f in mean.findings if f.rule == "KP103"][0].message
    assert nan.stats["nan"] > 1000 and nan.codes() == ["KP104"]
    assert honest.codes() == [] and honest.max_abs > 50


def test_counts_over_large_outputs_are_taken_a_slice_at_a_time(monkeypatch):
    """NaN, Inf and differing elements are counted a slice at a time: a whole output's boolean
    `.sum()` makes an int64 copy of its mask, which set the problems job's peak on the H200
    (36 GiB beside a 24 GiB float64 output and its inputs)."""
    import operator

    from kaudit.dynamic.harness import counting

    monkeypatch.setattr(counting, "SLICE", 7)
    values = torch.arange(40, dtype=torch.float64).reshape(5, 8)
    values.view(-1)[[0, 6, 7, 13, 14, 39]] = float("nan")  # at and across slice edges
    lengths = []

    def isnan(part):
        lengths.append(part.numel())
        return torch.isnan(part)

    assert counting.count_where(isnan, values) == 6
    assert max(lengths) == 7 and sum(lengths) == 40
    other = values.clone()
    other.view(-1)[[1, 20, 35]] = -1.0
    assert counting.count_where(operator.ne, torch.nan_to_num(values), torch.nan_to_num(other)) \
        == 3
    assert counting.count_true(torch.isnan(values)) == 6
    assert counting.count_true(torch.zeros(0, dtype=torch.bool)) == 0


class _Problem:
    """A problem module's get_inputs, as the problem job calls it."""

    def __init__(self, get_inputs):
        self.get_inputs = get_inputs


def test_inputs_are_made_on_the_device_and_on_the_cpu_when_the_problem_needs_it():
    from kaudit.dynamic.harness.problem_job import ProblemFormatError, make_inputs

    # "meta" stands for the GPU here: made under the device, nothing is copied from the CPU
    meta = torch.device("meta")
    made = make_inputs(_Problem(lambda: [torch.randn(4, 3), 2]), 0, meta, torch)
    assert made[0].device.type == "meta" and made[1] == 2
    # a NumPy round trip cannot run on the device: made on the CPU instead, under the same seed
    via_numpy = _Problem(lambda: [torch.from_numpy(torch.randn(4).numpy())])
    assert make_inputs(via_numpy, 5, meta, torch)[0].device.type == "cpu"
    assert torch.equal(make_inputs(via_numpy, 5, meta, torch)[0],
                       make_inputs(via_numpy, 5, torch.device("cpu"), torch)[0])
    with pytest.raises(ProblemFormatError, match="not a list"):
        make_inputs(_Problem(lambda: torch.randn(2)), 0, meta, torch)


def test_statistics_merged_over_outputs_equal_those_of_all_their_values():
    """`kaudit problems` reads each output once (`Moments`) for the statistics of each seed and
    of all seeds together: merged, they are the statistics of the concatenated values, NaN and
    Inf left out and counted, an empty or all-NaN output included."""
    torch = pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic.probes import Moments

    generator = torch.Generator().manual_seed(3)
    parts = [torch.randn(5000, generator=generator) * 7 + 2,
             torch.tensor([float("nan"), -3.5, float("inf"), 40.0, float("-inf")]),
             torch.empty(0), torch.full((4,), float("nan")), torch.tensor([-50.0])]
    merged = Moments.merge([Moments.of(p) for p in parts]).stats()
    values = torch.cat(parts).double()
    finite = values[torch.isfinite(values)]
    assert merged["nan"] == 5 and merged["inf"] == 2 and merged["nonfinite"] == 7
    assert merged["min"] == -50.0 and merged["max"] == float(finite.max())
    assert merged["max_abs"] == 50.0
    assert merged["mean"] == pytest.approx(float(finite.mean()), rel=1e-12)
    assert merged["std"] == pytest.approx(float(finite.std(unbiased=False)), rel=1e-12)
    assert str(Moments.merge([Moments.of(torch.zeros(3))]).stats()["max_abs"]) == "0.0"  # not -0.0
    assert Moments.merge([Moments.of(parts[3])]).stats()["std"] is None
    # torch has no isfinite for float8 on the CPU: read from the float64 copy
    eight = Moments.of(torch.tensor([1.0, -2.0]).to(torch.float8_e4m3fn)).stats()
    assert (eight["min"], eight["max"], eight["nonfinite"]) == (-2.0, 1.0, 0)


def test_float64_and_scaled_runs_make_the_first_inputs_again(tmp_path):
    """The float64 and scaled runs call `get_inputs()` again under the first seed instead of
    keeping a copy on the device: a forward that changes its input in place does not reach them,
    and inputs that differ when made again (drawn outside torch's generator) are said, not
    compared."""
    tail = "\n\ndef get_init_inputs():\n    return []\n"
    (tmp_path / "doubles_in_place.py").write_text(
        "import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
        "        return x.mul_(2)\n\n\ndef get_inputs():\n    return [torch.randn(64)]\n" + tail)
    (tmp_path / "unseeded_inputs.py").write_text(
        "import random\n\nimport torch\n\n\nclass Model(torch.nn.Module):\n"
        "    def forward(self, x):\n        return x * 2\n\n\ndef get_inputs():\n"
        "    return [torch.full((64,), random.random())]\n" + tail)
    in_place, unseeded = audit([tmp_path / "doubles_in_place.py",
                                tmp_path / "unseeded_inputs.py"]).problems
    assert in_place.status == "ok" and "KP502" not in in_place.codes()
    assert in_place.gap["rel_l2"] < 1e-6  # the twin saw the inputs forward saw, not doubled ones
    assert all(scale["ran"] for scale in in_place.scales)
    notes = [f.message for f in unseeded.findings if f.rule == "KP502"]
    assert len(notes) == 1 and "other inputs when called again" in notes[0]


#: a forward whose answer tells whether cuDNN was on: its float64 runs must have it off
FLAG_PROBLEM = """import torch


class Model(torch.nn.Module):
    def forward(self, x):
        on = torch.backends.cudnn.enabled
        return x * (1.0 if on == (x.dtype != torch.float64) else 2.0)


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
"""


def test_float64_runs_use_torchs_own_kernels_not_cudnns(tmp_path):
    """cuDNN's float64 convolutions are slow (2.79 s against 0.24 s a call for a 3D transposed
    one on the H200): the float64 runs of a problem's job and of a kernel's reference job turn
    it off, and turn it back on after, also when forward raised."""
    from kaudit.dynamic.harness.kernel_job import _reference_noise
    from kaudit.dynamic.harness.problem_job import float64_kernels

    (tmp_path / "flag.py").write_text(FLAG_PROBLEM)
    problem, = audit([tmp_path / "flag.py"]).problems
    assert problem.status == "ok" and "KP502" not in problem.codes(), problem.findings
    assert problem.gap["rel_l2"] < 1e-6  # a twin made with cuDNN on would be twice the output
    assert all(scale.get("rel_l2", 1) < 1e-6 for scale in problem.scales)

    namespace: dict = {}
    exec(FLAG_PROBLEM, namespace)
    x = torch.randn(64)
    noise, _ = _reference_noise(torch, namespace["Model"](), [x], [x.clone()],
                                torch.device("cpu"))
    assert noise is not None and noise[0] < 1e-6

    assert torch.backends.cudnn.enabled
    with pytest.raises(ZeroDivisionError), float64_kernels(torch):
        assert not torch.backends.cudnn.enabled
        1 / 0  # noqa: B018
    assert torch.backends.cudnn.enabled


def test_judging_threads_share_the_cores_out_and_give_them_back():
    """Each judging thread's operators run on its share of the cores (one each when there are
    more judging threads than cores), not on a team of one thread per core each."""
    import threading

    from kaudit.dynamic.limits import judging_threads

    original = torch.get_num_threads()
    torch.set_num_threads(16)  # the host's cores, or what the user set
    seen = []
    try:
        for jobs, share in ((24, 1), (4, 4), (0, 16)):
            with judging_threads(jobs):
                thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
                thread.start()
                thread.join()
            assert seen[-1] == share
            assert torch.get_num_threads() == 16
    finally:
        torch.set_num_threads(original)


def test_no_problem_runs_before_kaudit_is_ready(monkeypatch):
    """`before_jobs` (the CLI's preload and fingerprint of kaudit's code) is called once the
    problems are found and before any runs; when it fails, none runs."""
    from kaudit.dynamic import problems

    fixture = PROBLEM_FIXTURES / "good_matmul.py"
    options = Options(PRESETS["kernelbench"], device="cpu", timeout=TIMEOUT, jobs=2)
    ready, ran, launched = [], [], []
    real_run_job = problems.run_job

    def run_job(job, *args):
        launched.append(len(ready))  # how many times kaudit was ready when this job started
        return real_run_job(job, *args)

    monkeypatch.setattr(problems, "run_job", run_job)
    report = audit_problems([str(fixture), str(PROBLEM_FIXTURES / "bad_tiny_output.py")],
                            options, before_jobs=lambda: ready.append(True),
                            on_problem=lambda done, total, problem: ran.append(problem.path))
    assert ready == [True] and launched == [1, 1] and len(ran) == 2
    assert report.summary["preparation_s"] >= 0

    def fails() -> None:
        raise RuntimeError("kaudit's own code could not be imported")

    with pytest.raises(RuntimeError, match="could not be imported"):
        audit_problems([str(fixture)], options, before_jobs=fails,
                       on_problem=lambda *args: ran.append("ran after a failed preparation"))
    assert len(ran) == 2 and launched == [1, 1], "no job started"
