"""The dynamic probes added to the write-coverage and correctness checks, on the CPU, with small
kernels written here: guard zones (KD103, through Triton's interpreter), the scale sweep (KD301),
deferred work (KD404), poisoning of allocations made on threads the kernel starts, and how kernels
are spread over jobs and GPUs. The paired CUDA and Triton fixtures in fixtures/dynamic/ are run by
tests/test_dynamic.py."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch", reason="the dynamic pass needs torch; CI installs it")

from kaudit.discover import WorkItem
from kaudit.dynamic.kernels import DynamicOptions, GpuSlots, audit_items, audit_kernel
from kaudit.dynamic.tolerance import resolve

#: KAUDIT_TEST_DEVICE=cuda runs the same kernels on the GPU (Triton compiled, not interpreted)
DEVICE = os.environ.get("KAUDIT_TEST_DEVICE", "cpu")

ROWS_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {body}


def get_inputs():
    return [torch.randn(8, 100)]


def get_init_inputs():
    return []
"""

CASES = {
    # an unmasked Triton store: the last block writes 28 elements past the end of the output
    "triton_unmasked_store": ("torch.relu(x)", """
        import torch
        import torch.nn as nn
        import triton
        import triton.language as tl


        @triton.jit
        def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            values = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
            tl.store(out_ptr + offsets, tl.maximum(values, 0.0))


        class ModelNew(nn.Module):
            def forward(self, x):
                out = torch.empty_like(x)
                relu_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
                return out
        """),
    "triton_masked_store": ("torch.relu(x)", """
        import torch
        import torch.nn as nn
        import triton
        import triton.language as tl


        @triton.jit
        def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            values = tl.load(x_ptr + offsets, mask=mask, other=0.0)
            tl.store(out_ptr + offsets, tl.maximum(values, 0.0), mask=mask)


        class ModelNew(nn.Module):
            def forward(self, x):
                out = torch.empty_like(x)
                relu_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
                return out
        """),
    "naive_softmax": ("torch.softmax(x, dim=1)", """
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def forward(self, x):
                e = torch.exp(x)
                return e / e.sum(dim=1, keepdim=True)
        """),
    "stable_softmax": ("torch.softmax(x, dim=1)", """
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def forward(self, x):
                e = torch.exp(x - x.max(dim=1, keepdim=True).values)
                return e / e.sum(dim=1, keepdim=True)
        """),
    "thread_finishes_later": ("torch.tanh(x)", """
        import threading
        import time

        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def forward(self, x):
                out = torch.zeros_like(x)

                def finish():
                    time.sleep(0.03)
                    torch.tanh(x, out=out)

                threading.Thread(target=finish, name="finisher").start()
                return out
        """),
    "thread_allocates_output": ("torch.tanh(x)", """
        import threading

        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def forward(self, x):
                box = []
                worker = threading.Thread(target=lambda: box.append(torch.empty_like(x)))
                worker.start()
                worker.join()
                box[0][0] = torch.tanh(x[0])  # only row 0 is computed
                return box[0]
        """),
    "lazy_subclass": ("torch.tanh(x)", """
        import torch
        import torch.nn as nn


        class Lazy(torch.Tensor):
            pass


        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.tanh(x).as_subclass(Lazy)
        """),
    "returns_a_promise": ("torch.tanh(x)", """
        import torch
        import torch.nn as nn


        class Promise:
            def __init__(self, x):
                self.x = x


        class ModelNew(nn.Module):
            def forward(self, x):
                return Promise(x)
        """),
}
#: GPU only: the output comes from a side stream the current stream never waits for; 20 large
#: matmuls in front of it keep the side stream busy for tens of milliseconds after forward returns
SIDE_STREAM = ("torch.tanh(x)", """
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.side = torch.cuda.Stream()

        def forward(self, x):
            with torch.cuda.stream(self.side):
                busy = torch.ones(4096, 4096, device=x.device)
                for _ in range(20):
                    busy = busy @ busy * (1.0 / 4096)
                return torch.tanh(x) + busy[: x.shape[0], : x.shape[1]] * 0
    """)
if DEVICE == "cuda":
    CASES["side_stream"] = SIDE_STREAM
# an honest kernel with @triton.autotune (as in KernelBenchX's corpus): it benchmarks its configs
# on the device, which Triton's CPU interpreter may have no driver for
CASES["triton_autotuned"] = ("torch.relu(x)", """
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})],
                     key=["n"])
    @triton.jit
    def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        values = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
        tl.store(out_ptr + offsets, tl.maximum(values, 0.0), mask=offsets < n)


    class ModelNew(nn.Module):
        def forward(self, x):
            out = torch.empty_like(x)
            n = x.numel()
            relu_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
            return out
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    options = DynamicOptions(resolve(None, None, None), device=DEVICE, timeout=240, calls=(8, 12))

    def one(name: str):
        body, kernel = CASES[name]
        folder = tmp_path_factory.mktemp(name)
        (folder / "problem.py").write_text(ROWS_PROBLEM.format(body=body))
        (folder / "kernel.py").write_text(textwrap.dedent(kernel))
        path = str(folder / "kernel.py")
        return name, audit_kernel(path, path, (folder / "kernel.py").read_text(), options, DEVICE)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, CASES))


def codes(run) -> set[str]:
    return {f.rule for f in run.findings}


def only(run, code: str):
    (finding,) = [f for f in run.findings if f.rule == code]
    return finding


def test_unmasked_store_is_an_out_of_bounds_write(runs):
    pytest.importorskip("triton", reason="Triton kernels run on the CPU under its interpreter")
    run = runs["triton_unmasked_store"]
    assert codes(run) == {"KD103"}, [f.message for f in run.findings]
    finding = only(run, "KD103")
    # 800 elements in blocks of 64: the 13th block stores 32 elements past the end
    assert finding.metrics["written_after"] == 13 * 64 - 800
    assert finding.metrics["written_before"] == 0 and finding.metrics["output"] == 0
    assert "the output" in finding.message and "32 elements past its end" in finding.message
    assert "in 5 of 5 runs" in finding.message  # the unpoisoned runs are guarded too


def test_an_autotuned_kernel_the_interpreter_cannot_run_is_not_blamed(runs):
    pytest.importorskip("triton", reason="Triton kernels run on the CPU under its interpreter")
    run = runs["triton_autotuned"]
    messages = [f.message for f in run.findings]
    if run.status == "needs-cuda":  # this Triton's interpreter has no driver to autotune on
        assert DEVICE == "cpu" and codes(run) == {"KD500"}, messages
        assert "Triton's CPU interpreter cannot run it" in messages[0]
    else:
        assert run.status == "ok" and not run.findings, messages


def test_masked_store_is_clean(runs):
    pytest.importorskip("triton", reason="Triton kernels run on the CPU under its interpreter")
    run = runs["triton_masked_store"]
    assert run.status == "ok" and not run.findings, [f.message for f in run.findings]
    assert run.metrics["guarded"] >= 4  # the output of each poisoned run had guard zones


def test_exp_without_max_is_scale_fragile(runs):
    finding = only(runs["naive_softmax"], "KD301")
    assert codes(runs["naive_softmax"]) == {"KD301"}
    assert finding.metrics["scale"] == 1000.0
    assert "relative L2 error inf" in finding.message  # exp overflowed: NaN in the output
    assert finding.metrics["reference_relative_l2"] < 1e-6


def test_stable_softmax_is_clean_at_every_scale(runs):
    run = runs["stable_softmax"]
    assert run.status == "ok" and not run.findings, [f.message for f in run.findings]


def test_a_thread_finishing_the_output_is_deferred_work(runs):
    run = runs["thread_finishes_later"]
    finding = only(run, "KD404")
    assert finding.metrics["changed_after_return"] == 800, finding.message
    assert "s after forward returned" in finding.message
    assert 0.25 <= finding.metrics.get("deferred_wait", runs["thread_finishes_later"].metrics[
        "deferred_wait"]) <= 0.75


def test_allocations_on_threads_started_by_forward_are_poisoned(runs):
    finding = only(runs["thread_allocates_output"], "KD101")
    assert finding.metrics["unwritten"] == 700 and finding.metrics["pattern"] == "tail"


def test_a_tensor_subclass_is_deferred_work_and_still_judged(runs):
    run = runs["lazy_subclass"]
    assert codes(run) == {"KD404"}
    assert "Lazy" in only(run, "KD404").message


def test_a_non_tensor_result_is_deferred_work(runs):
    run = runs["returns_a_promise"]
    assert codes(run) == {"KD404"}
    assert "forward returned Promise" in only(run, "KD404").message


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device (KAUDIT_TEST_DEVICE=cuda)")
def test_output_left_on_a_side_stream_is_reported(runs):
    run = runs["side_stream"]
    assert codes(run) == {"KD403"}, [f.message for f in run.findings]
    assert only(run, "KD403").metrics["runs"] >= 1


def test_gpu_slots_spread_jobs_and_share_memory():
    slots = GpuSlots(4, ["0", "1"])
    assert slots.fraction == 0.45  # two jobs at most on each GPU
    with slots.take() as first, slots.take() as second, slots.take() as third:
        assert {first.device, second.device} == {"0", "1"} and third.device in ("0", "1")
        assert first.share == 0.45
    assert slots.busy == {"0": 0, "1": 0}
    with GpuSlots(1, []).take() as nothing:
        assert nothing is None


def test_several_jobs_keep_the_order_of_the_items(tmp_path):
    items = []
    for name in ("b_first", "a_second", "c_third"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "kernel.py").write_text("class ModelNew:\n    pass\n")  # no problem: KD502
        items.append(WorkItem(str(folder / "kernel.py"), name, True))
    progress = []
    options = DynamicOptions(resolve(None, None, None), device="cpu", jobs=3)
    runs = audit_items(items, options, "cpu",
                       on_kernel=lambda done, total, item, run, seconds: progress.append(done))
    assert [r.path for r in runs] == ["b_first", "a_second", "c_third"]
    assert sorted(progress) == [1, 2, 3] and all(r.status == "no-problem" for r in runs)


def test_kernels_with_the_same_text_share_one_checked_build_folder(tmp_path, monkeypatch):
    """A results tree repeats kernels: one build folder per kernel text, for one job at a time;
    a folder whose files changed since the last job (another job replaced a library) is
    emptied before the next, and a scan's own folders go with the scan."""
    import hashlib
    import json
    import tempfile

    from kaudit.dynamic.builds import BuildCache

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    builds = BuildCache()
    with builds.use("kernel A") as first:
        Path(first, "ext.so").write_bytes(b"built")
    with builds.use("kernel A") as again, builds.use("kernel B") as other:
        assert again == first != other and Path(again, "ext.so").read_bytes() == b"built"
    Path(first, "ext.so").write_bytes(b"replaced by a neighbour")
    with builds.use("kernel A") as third:
        assert third == first and not list(Path(third).iterdir()), "emptied, built again"
    assert builds.discarded == [BuildCache.key("kernel A")]
    builds.close()
    assert not Path(first).exists()
    named = BuildCache(str(tmp_path / "cache"))  # a cache the caller names: kept, signed
    with named.use("kernel A") as folder:
        Path(folder, "ext.so").write_bytes(b"built")
    named.close()
    assert BuildCache(str(tmp_path / "cache"))._intact(BuildCache.key("kernel A"), Path(folder))
    manifest = tmp_path / "cache" / f"{BuildCache.key('kernel A')}.manifest"
    record = json.loads(manifest.read_text())
    Path(folder, "ext.so").write_bytes(b"replaced")  # and the record rewritten to match, unsigned
    record["files"] = json.dumps({"ext.so": hashlib.sha256(b"replaced").hexdigest()})
    manifest.write_text(json.dumps(record))
    assert not BuildCache(str(tmp_path / "cache"))._intact(BuildCache.key("kernel A"),
                                                          Path(folder))


def test_kernels_in_jsonl_records_run_against_their_ref_code(tmp_path):
    import json

    from kaudit.discover import discover
    from kaudit.results import ResultTrees

    kernel = textwrap.dedent("""
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.empty_like(x)
        """)
    records = [{"task_id": "level_1_problem_7", "ref_code": ROWS_PROBLEM.format(body="x * 2"),
                "custom_code": kernel},
               {"task_id": "level_1_problem_8", "custom_code": kernel}]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    items = ResultTrees().annotate(discover([str(path)]).items)
    options = DynamicOptions(resolve(None, None, None), device="cpu")
    first, second = audit_items(items, options, "cpu")
    assert first.path.endswith("samples.jsonl#L1/custom_code")
    assert codes(first) == {"KD101"} and only(first, "KD101").metrics["pattern"] == "all"
    assert codes(second) == {"KD502"}  # no ref_code and no --problems


def test_a_triton_kernel_timing_out_in_the_interpreter_is_not_audited_not_failed(tmp_path):
    pytest.importorskip("triton", reason="Triton kernels run on the CPU under its interpreter")
    (tmp_path / "problem.py").write_text(ROWS_PROBLEM.format(body="torch.relu(x)"))
    kernel = tmp_path / "kernel.py"
    kernel.write_text(textwrap.dedent("""
        import time
        import torch.nn as nn
        import triton


        @triton.jit
        def unused(x_ptr):
            pass


        class ModelNew(nn.Module):
            def forward(self, x):
                time.sleep(120)  # as slow as a long kernel in the interpreter
                return x.relu()
    """))
    options = DynamicOptions(resolve(None, None, None), device=DEVICE, timeout=8, calls=(8, 12))
    run = audit_kernel(str(kernel), str(kernel), kernel.read_text(), options, DEVICE)
    expected = ("incomplete", {"KD504"}) if DEVICE == "cpu" else ("failed", {"KD501"})
    assert (run.status, codes(run)) == expected, [f.message for f in run.findings]


def test_unwritten_elements_are_those_holding_their_runs_palette_in_every_run():
    """KD101's mask: an element is unwritten only where all four poisoned runs left it holding
    that run's palette (later runs are only looked up where the earlier ones all did)."""
    from kaudit.dynamic.harness import sentinels
    from kaudit.dynamic.judge import unwritten_mask

    key = "k" * 32
    written = torch.tensor([1.5, 2.5, 3.5, 4.5])
    runs = []
    for run in range(4):
        values = sentinels.palette(torch.float32, run, key)
        poisoned = written.clone()
        left = [0, 1, 3] if run < 2 else [0, 3] if run == 2 else [0, 2, 3]
        bits = poisoned.view(sentinels.bits_dtype(torch.float32))
        bits[left] = values[:len(left)]
        runs.append(poisoned)
    # 0 and 3 hold a palette value in every run; 1 was written in run 2; 2 only in run 3's
    assert unwritten_mask(runs, key).tolist() == [True, False, False, True]
    assert unwritten_mask([written] * 4, key).tolist() == [False] * 4


def test_a_runs_fill_tiles_are_made_before_its_calls_not_during_them():
    """A tile made at an allocation inside a CUDA graph capture is copied from host memory,
    which the capture does not permit: it is invalidated and the kernel fails (KD501). After
    `warm_tiles`, allocations of the common dtypes under the run's mode make no tile."""
    from kaudit.dynamic.harness import sentinels
    from kaudit.dynamic.harness.poison import Poisoner

    key, device = "tiles-test-key", torch.device("cpu")
    sentinels.warm_tiles(2, key, device)
    made = sentinels._tile.cache_info().misses
    poisoner = Poisoner(2, key)
    with poisoner.mode():
        for dtype in sentinels.COMMON_DTYPES:
            torch.empty(1000, dtype=dtype)
            torch.empty((3, 50), dtype=dtype).t().contiguous()
    assert poisoner.counters["poisoned"] >= 2 * len(sentinels.COMMON_DTYPES)
    assert sentinels._tile.cache_info().misses == made, "a tile was made during the calls"
    poisoner.release()


def test_a_cuda_job_makes_the_blas_handles_before_the_kernel_runs(monkeypatch):
    """A benchmark's process has them from the reference it ran first; a CUDA-L1 kernel that
    captures a CUDA graph at its first call made them inside the capture on the H200, and the
    capture failed (KD501). On a CPU device nothing runs."""
    from kaudit.dynamic.harness import kernel_job

    ran: list = []
    real_ones = torch.ones

    def ones(*shape, device=None, **kwargs):
        if device is not None:
            ran.append(("ones", str(device)))
        return real_ones(*shape, **kwargs)

    monkeypatch.setattr(torch, "ones", ones)
    real_linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda *args: ran.append(("linear",)) or real_linear(*args))
    kernel_job._ready_cuda(torch, torch.device("cpu"), {})
    assert ran == []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction: ran.append(("fraction", fraction)))
    kernel_job._ready_cuda(torch, torch.device("cuda"), {"gpu_memory_fraction": 0.25})
    assert ran == [("fraction", 0.25), ("ones", "cuda"), ("linear",)]


def test_distance_is_scale_free_and_the_same_a_slice_at_a_time(monkeypatch):
    """The one measure of KD201/KD202/KD301, in the judge and in the reference job: slices
    summed in float64 give what whole tensors give; a NaN, or values against an all-zero
    truth, are infinitely far."""
    from kaudit.dynamic.harness import scaling

    truth = torch.linspace(-3, 5, 1000)
    values = truth + 1e-3 * torch.sin(torch.arange(1000.0))
    whole = scaling.distance(truth, values)
    diff = (values.double() - truth.double())
    assert whole[0] == pytest.approx(float(diff.norm() / truth.double().norm()), rel=1e-12)
    assert whole[1] == pytest.approx(float(diff.abs().max() / truth.double().abs().max()))
    assert scaling.distance(truth * 1e6, values * 1e6) == pytest.approx(whole, rel=1e-4)
    monkeypatch.setattr(scaling, "SLICE", 7)
    assert scaling.distance(truth, values) == pytest.approx(whole, rel=1e-12)
    assert scaling.distance(torch.zeros(4), torch.zeros(4)) == (0.0, 0.0)
    assert scaling.distance(torch.zeros(4), torch.ones(4)) == (float("inf"), float("inf"))
    nan = values.clone()
    nan[500] = float("nan")
    assert scaling.distance(truth, nan) == (float("inf"), float("inf"))


def test_the_float64_twin_is_kept_at_the_precision_its_checks_need():
    from kaudit.dynamic.harness.scaling import twin

    exact = torch.randn(8, dtype=torch.float64)
    for native, kept in ((torch.float32, torch.float32), (torch.float16, torch.float32),
                         (torch.bfloat16, torch.float32), (torch.float64, torch.float64)):
        assert twin(exact, exact.to(native), torch).dtype == kept
    wide = torch.randn(8, dtype=torch.complex128)
    assert twin(wide, wide.to(torch.complex64), torch).dtype == torch.complex64
    assert twin(wide, wide, torch).dtype == torch.complex128
    counts = torch.arange(8)
    assert twin(counts, counts, torch) is counts


def test_an_answer_identical_to_the_first_for_its_inputs_is_not_written_again(monkeypatch):
    """An honest kernel's poisoned runs and its second call on inputs B give the bits it gave
    first: the job names the first file instead of writing a copy (outputs reach gigabytes),
    and the judge reads that one, as for the plain run's calls; a kernel whose poisoned runs
    differ has them all written."""
    from kaudit.dynamic import judge
    from tests.conftest import DYNAMIC_FIXTURES

    seen: list = []

    class Watched(judge.Answers):
        def __init__(self, candidate, info):
            super().__init__(candidate, info)
            seen.append(self)

    monkeypatch.setattr(judge, "Answers", Watched)
    options = DynamicOptions(device="cpu", timeout=240, calls=(6, 6))
    found = {}
    for name in ("good_pytorch_linear", "bad_empty_output"):
        kernel = DYNAMIC_FIXTURES / name / "kernel.py"
        run = audit_kernel(str(kernel), "kernel.py", kernel.read_text(), options, "cpu")
        found[name] = (run, *seen)  # the candidate job's answers, then the plain run's
        seen.clear()
    run, honest, plain = found["good_pytorch_linear"]
    assert run.findings == []
    assert plain.same_as == {"run1.pt": "run0.pt", "run2.pt": "run0.pt"}
    assert {f"poison{r}.pt" for r in range(4)} <= honest.same_as.keys()
    assert set(honest.same_as.values()) <= {"plain.pt", "fresh.pt", "same.pt"}
    assert len({"fresh.pt", "same.pt"} & honest.same_as.keys()) == 1
    assert not honest.written & honest.same_as.keys()
    run, empty = found["bad_empty_output"]  # rejected: no plain run
    assert [f.rule for f in run.findings] == ["KD101"]
    assert not {f"poison{r}.pt" for r in range(4)} & empty.same_as.keys()


def test_an_answer_named_as_another_must_name_a_written_file_and_replace_none():
    from kaudit.dynamic.judge import Answers

    class Written:
        loads: list = []

        def files(self):
            return ["plain.pt", "poison0.pt"]

        def load_tensors(self, name, max_bytes=None):
            self.loads.append(name)
            return [torch.tensor([float(len(name))])]

    job = Written()
    answers = Answers(job, {"same_as": {"poison1.pt": "plain.pt", "poison0.pt": "plain.pt",
                                        "fresh.pt": "nowhere.pt", "same.pt": 3}})
    assert answers.same_as == {"poison1.pt": "plain.pt"}
    assert answers.has("poison1.pt") and not answers.has("fresh.pt")
    assert answers.load("poison1.pt", 1 << 20) == answers.load("plain.pt", 1 << 20)
    assert job.loads == ["plain.pt"], "read once"
    assert Answers(job, {"same_as": ["poison1.pt"]}).same_as == {}


def test_a_timeout_where_the_kernel_compiles_is_not_audited_not_a_failure(tmp_path):
    """A CUDA-L1 kernel names its extension after id(self), so each of the candidate job's six
    models compiles it again: a timeout there is kaudit's count of constructions, not proof of
    a hang (KD504); without an extension, a construction that never ends is the kernel's
    (KD501)."""
    problem = DYNAMIC_PROBLEM_FOR_TIMEOUTS
    options = DynamicOptions(device="cpu", timeout=15, calls=(6, 6))
    found = {}
    for name, note in (("compiles", "# built with torch.utils.cpp_extension.load_inline"),
                       ("hangs", "# nothing to build")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "problem.py").write_text(problem)
        kernel = folder / "kernel.py"
        kernel.write_text(f"{note}\nimport time\nimport torch.nn as nn\n\n\n"
                          "class ModelNew(nn.Module):\n    def __init__(self):\n"
                          "        super().__init__()\n        time.sleep(600)\n\n"
                          "    def forward(self, x):\n        return x\n")
        run = audit_kernel(str(kernel), name, kernel.read_text(), options, "cpu")
        found[name] = [(f.rule, f.level.value) for f in run.findings], run.status
    assert found["compiles"] == ([("KD504", "warning")], "incomplete")
    assert found["hangs"] == ([("KD501", "error")], "failed")


DYNAMIC_PROBLEM_FOR_TIMEOUTS = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
"""
