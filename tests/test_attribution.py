"""Profiler attribution (`kaudit.dynamic.attribution`: KD601 library-share, KD602 no-gpu-work,
KD403 from the trace). Every decision is tested here on the CPU with synthetic records shaped
like the profiled job's (`harness/profile_job.py`); the job's extraction runs under
`torch.profiler` with CPU activity, and the whole job on the CPU through the runner. The CUDA
fixtures run with KAUDIT_TEST_DEVICE=cuda (`test_profiler_fixtures_on_gpu`)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from kaudit.dynamic.attribution import (
    OwnKernels,
    Session,
    classify,
    judge_profile,
    kernel_identifier,
    unjoined_streams,
)
from kaudit.findings import Level
from tests.conftest import DYNAMIC_FIXTURES, expected_findings

CURRENT, SIDE, OTHER = 7, 13, 17
OWN = OwnKernels(frozenset({"row_mean_kernel", "bias_kernel", "add_kernel"}), True)


class Trace:
    """A synthetic profiled session: the job's ranges, launches, ordering calls, sync records."""

    def __init__(self, legacy: bool = True, sync_events: bool = True) -> None:
        self.now, self.corr = 0.0, 0
        self.record = {"ranges": [], "gpu": [], "runtime": [], "sync": [],
                       "current_stream_legacy": legacy}
        self.sync_events = sync_events

    def _host(self, name: str, tid: int = 1, op: str | None = None) -> int:
        self.now += 1.0
        self.corr += 1
        self.record["runtime"].append({"name": name, "corr": self.corr, "start": self.now,
                                       "dur": 0.5, "tid": tid, "op": op})
        return self.corr

    def launch(self, name: str, stream: int = CURRENT, dur: float = 10.0, op: str | None = None,
               tid: int = 1, kind: str = "kernel", gpu_start: float | None = None) -> int:
        corr = self._host("cudaLaunchKernel" if kind == "kernel" else "cudaMemcpyAsync", tid, op)
        self.record["gpu"].append({"kind": kind, "name": name, "stream": stream, "corr": corr,
                                   "start": self.now + 2 if gpu_start is None else gpu_start,
                                   "dur": dur})
        return corr

    def ordering(self, name: str, stream: int = -1, wait_on: int = -1, record: int = -1) -> int:
        corr = self._host(name)
        if self.sync_events and name != "cudaEventRecord":
            self.record["sync"].append({"kind": name, "stream": stream, "corr": corr,
                                        "wait_on_stream": wait_on, "record_corr": record,
                                        "start": self.now})
        return corr

    def phase(self, phase: str, call: int, body) -> None:
        start = self.now + 0.1
        body()
        self.now += 1.0
        self.record["ranges"].append({"phase": phase, "call": call, "start": start,
                                      "end": self.now, "tid": 1})

    def call(self, number: int, forward, after_gpu_start: float | None = None) -> Trace:
        self.phase("before", number, lambda: self.launch("void at::native::add_kernel<float>()",
                                                         dur=1.0, op="aten::add_"))
        self.phase("forward", number, lambda: forward(self))
        self.phase("after", number, lambda: self.launch(
            "void at::native::add_kernel<float>()", dur=1.0, op="aten::add_",
            gpu_start=after_gpu_start))
        self.now += 5.0
        return self

    def build(self) -> dict:
        return self.record


def relu_reference() -> Trace:
    reference = Trace()
    return reference.call(0, lambda t: t.launch("void at::native::relu_kernel()", dur=5.0,
                                              op="aten::relu"))


def profile(candidate: Trace, reference: Trace | None = None) -> dict:
    reference = reference or relu_reference()
    return {"calls": 1, "sync_events": candidate.sync_events,
            "reference": reference.build(), "candidate": candidate.build()}


def findings(record: dict, own: OwnKernels = OWN, policy: str = "kernelbench",
             same_answer: bool = False):
    found, metrics = [], {}

    def add(code, message, *, level=None, **facts):
        found.append((code, level, message, facts))

    judge_profile(add, record, own, policy, metrics, same_answer)
    return found, metrics


def codes(record: dict, own: OwnKernels = OWN, policy: str = "kernelbench") -> set:
    return {(code, level) for code, level, _, _ in findings(record, own, policy)[0]}


# -- names and classes ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "identifier"), [
    ("row_mean_kernel(float const*, float*, long, long)", "row_mean_kernel"),
    ("void scale<float, 4>(float*, int)", "scale"),
    ("void at::native::(anonymous namespace)::vectorized_elementwise_kernel<4, "
     "at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>)",
     "vectorized_elementwise_kernel"),
    ("silu_persistent_kernel", "silu_persistent_kernel"),
    ("ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_nn"),
])
def test_kernel_identifiers(name, identifier):
    assert kernel_identifier(name) == identifier


@pytest.mark.parametrize(("name", "by_library", "family"), [
    ("row_mean_kernel(float const*, float*, long, long)", False, "own"),
    ("add_kernel", False, "own"),
    ("void at::native::vectorized_elementwise_kernel<4>(int)", True, "aten"),
    ("ampere_sgemm_128x64_nn", True, "cublas"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", True, "cublas"),
    ("nvjet_tst_128x64_64x8_2x1_v_bz_coopA_TNT", False, "cublas"),  # cuBLAS from the extension
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(Params)", True, "cutlass"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>()", True, "cudnn"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32", True, "cublas"),
    ("triton_poi_fused_add_relu_0", False, "triton"),  # torch.compile's, not the file's
    ("my_nvrtc_kernel", False, "own"),  # no library's, launched by the file's code
    ("some_kernel", True, "other"),  # no library's name, but an ATen op launched it
])
def test_classification(name, by_library, family):
    assert classify(name, OWN, by_library) == family


def test_an_own_kernel_named_like_an_aten_kernel_does_not_take_atens_time():
    decoy = OwnKernels(frozenset({"vectorized_elementwise_kernel"}), True)
    assert classify("void at::native::vectorized_elementwise_kernel<4>(int)", decoy, True) == "aten"
    assert classify("vectorized_elementwise_kernel(float*)", decoy, False) == "own"


def test_cutlass_is_the_files_own_only_when_it_includes_cutlass_and_launches_it():
    name = "void cutlass::Kernel<cutlass::gemm::kernel::Gemm<float>>(Params)"
    assert classify(name, OWN, False) == "cutlass"
    with_headers = OwnKernels(OWN.names, True, cutlass=True)
    assert classify(name, with_headers, False) == "own"
    assert classify(name, with_headers, True) == "cutlass"


def test_own_kernels_come_from_kaudits_parse_of_the_file():
    cuda = OwnKernels.of_source("k.py", (DYNAMIC_FIXTURES / "bad_side_stream_cuda" /
                                         "kernel.py").read_text())
    assert "row_mean_kernel" in cuda.names and cuda.claims_custom and not cuda.cutlass
    triton = OwnKernels.of_source("k.py", (DYNAMIC_FIXTURES / "bad_side_stream_triton" /
                                           "kernel.py").read_text())
    assert triton.names == {"silu_persistent_kernel"} and triton.claims_custom
    plain = OwnKernels.of_source("k.py", (DYNAMIC_FIXTURES / "good_pytorch_linear" /
                                          "kernel.py").read_text())
    assert not plain.names and not plain.claims_custom


# -- KD601 and KD602 --------------------------------------------------------------------------


def test_an_honest_cuda_kernel_gives_nothing():
    trace = Trace().call(0, lambda t: t.launch("row_mean_kernel(float const*, float*, long, "
                                                 "long)", dur=50.0))
    found, metrics = findings(profile(trace))
    assert found == []
    assert metrics["attribution"]["own_share"] == 1.0
    assert metrics["profile"]["kernels"] == 1 and metrics["profile"]["reference_kernels"] == 1


def test_a_token_kernel_beside_cublas_is_a_warning_with_the_table_and_an_error_under_strict():
    def forward(trace):
        trace.launch("ampere_sgemm_128x64_nn", dur=97.0, op="aten::mm")
        trace.launch("bias_kernel(float*, float const*, int)", dur=3.0)
    trace = Trace().call(0, forward)
    (finding,), metrics = findings(profile(trace))
    code, level, message, facts = finding
    assert (code, level) == ("KD601", Level.WARNING)
    assert codes(profile(trace), policy="strict") == {("KD601", Level.ERROR)}
    assert "97.0 %" in message and "ampere_sgemm_128x64_nn [cublas]" in message
    assert facts["own_share"] == 0.03 and facts["library_share"] == 0.97
    assert [row["name"] for row in facts["table"]] == ["ampere_sgemm_128x64_nn", "bias_kernel"]
    assert metrics["attribution"]["table"][0]["class"] == "cublas"


def test_partial_replacement_is_a_note_under_kernelbench_and_a_warning_under_strict():
    def forward(trace):
        trace.launch("void cudnn::conv_kernel<float>()", dur=70.0, op="aten::cudnn_convolution")
        trace.launch("bias_kernel(float*)", dur=30.0)
    trace = Trace().call(0, forward)
    assert codes(profile(trace)) == {("KD601", Level.NOTE)}
    assert codes(profile(trace), policy="strict") == {("KD601", Level.WARNING)}


def test_pure_pytorch_is_silent_under_kernelbench_and_a_warning_under_strict():
    trace = Trace().call(0, lambda t: t.launch("ampere_sgemm_128x64_nn", dur=9.0,
                                                 op="aten::addmm"))
    plain = OwnKernels()
    assert codes(profile(trace), plain) == set()
    assert codes(profile(trace), plain, "strict") == {("KD601", Level.WARNING)}


def test_a_little_library_work_stays_silent():
    def forward(trace):
        trace.launch("row_mean_kernel(float*)", dur=97.0)
        trace.launch("void at::native::vectorized_elementwise_kernel<4>()", dur=3.0,
                     op="aten::add_")
    trace = Trace().call(0, forward)
    assert codes(profile(trace)) == set() == codes(profile(trace), policy="strict")


def test_triton_kernels_the_file_defines_are_its_own_and_inductors_are_not():
    own = Trace().call(0, lambda t: t.launch("add_kernel", dur=8.0))
    assert codes(profile(own)) == set()
    compiled = Trace().call(0, lambda t: t.launch("triton_poi_fused_add_0", dur=8.0))
    assert codes(profile(compiled)) == {("KD601", Level.WARNING)}


def test_no_kernel_at_all_is_kd602():
    def forward(trace):
        trace.launch("Memcpy HtoD (Pageable -> Device)", dur=4.0, kind="memcpy")
    trace = Trace().call(0, forward)
    ((code, level, message, facts),), _ = findings(profile(trace))
    assert code == "KD602" and level is None  # the rule's level: an error
    assert facts["copies"] == 1 and "copied or filled memory" in message


def test_no_kernel_is_a_warning_when_the_reference_gives_one_answer_for_all_inputs():
    """CUDA-L1 level 2 task 83: min(x, 0) clamped to [0, 1] is all zeros, and the kernel returns
    a zero buffer it made in __init__: right for that problem, the problem is at fault."""
    trace = Trace().call(0, lambda t: None)
    ((code, level, message, facts),), _ = findings(profile(trace), same_answer=True)
    assert (code, level) == ("KD602", Level.WARNING) and facts["same_answer"] is True
    assert "same answer, bit for bit, for both input sets" in message


def test_a_reference_that_gives_one_answer_for_two_input_sets_is_told_bit_for_bit():
    from kaudit.dynamic.kernels import _same_answer

    zeros = [torch.zeros(4, 3)]
    assert _same_answer(zeros, [torch.zeros(4, 3)])
    assert not _same_answer(zeros, [torch.zeros(4, 3, dtype=torch.float64)])
    assert not _same_answer(zeros, [torch.zeros(4, 3).index_fill_(0, torch.tensor([1]), 1e-30)])
    assert not _same_answer(zeros, zeros + [torch.zeros(1)])


def test_no_kernel_is_fine_when_the_reference_launches_none_either():
    trace = Trace().call(0, lambda t: None)
    assert codes(profile(trace, Trace().call(0, lambda t: None))) == set()


def test_kernels_another_thread_launched_during_forward_count_as_gpu_work():
    trace = Trace().call(0, lambda t: t.launch("add_kernel", tid=2))
    assert codes(profile(trace)) == set()


def test_an_unusable_record_decides_nothing():
    found, metrics = findings({"candidate": {"gpu": [{"name": "k"}]}})
    assert found == [] and metrics["profile"]["error"]


# -- KD403 from the trace ---------------------------------------------------------------------


def side_stream_call(trace: Trace, join=None, after_gpu_start: float | None = None) -> Trace:
    def forward(trace):
        trace.launch("row_mean_kernel(float*)", stream=SIDE, dur=100.0)
        if join:
            join(trace)
    return trace.call(0, forward, after_gpu_start)


def test_a_side_stream_nobody_waits_for_is_an_error_off_the_legacy_stream():
    trace = side_stream_call(Trace(legacy=False))
    ((code, level, message, facts),), _ = findings(profile(trace))
    assert (code, level) == ("KD403", Level.ERROR) and facts["evidence"] == "profiler"
    assert facts["kernels"][0]["stream"] == SIDE and facts["kernels"][0]["current_stream"] == 7
    assert "stream 13" in message


def test_on_the_legacy_stream_it_is_an_error_when_the_gpu_overlapped_and_else_a_warning():
    overlapped = side_stream_call(Trace(), after_gpu_start=0.0)  # before the kernel ended
    assert codes(profile(overlapped)) == {("KD403", Level.ERROR)}
    ordered = side_stream_call(Trace(), after_gpu_start=1e6)
    assert codes(profile(ordered)) == {("KD403", Level.WARNING)}


def test_an_event_the_current_stream_waits_for_joins_the_side_stream():
    def join(trace):
        record = trace.ordering("cudaEventRecord")
        trace.ordering("cudaStreamWaitEvent", stream=CURRENT, wait_on=SIDE, record=record)
    assert codes(profile(side_stream_call(Trace(legacy=False), join))) == set()


def test_an_event_recorded_before_the_launch_does_not_join_it():
    trace = Trace(legacy=False)

    def forward(trace):
        # the side stream waits for the caller's (the fixtures' pattern), then launches
        record = trace.ordering("cudaEventRecord")
        trace.ordering("cudaStreamWaitEvent", stream=SIDE, wait_on=CURRENT, record=record)
        trace.launch("row_mean_kernel(float*)", stream=SIDE, dur=100.0)
    trace.call(0, forward)
    assert codes(profile(trace)) == {("KD403", Level.ERROR)}


def test_a_wait_by_a_stream_that_ran_nothing_counts_as_the_current_streams():
    def join(trace):
        record = trace.ordering("cudaEventRecord")
        trace.ordering("cudaStreamWaitEvent", stream=55, wait_on=SIDE, record=record)
    assert codes(profile(side_stream_call(Trace(legacy=False), join))) == set()


def test_a_wait_through_another_stream_joins_it():
    def join(trace, to_current=True):
        first = trace.ordering("cudaEventRecord")
        trace.ordering("cudaStreamWaitEvent", stream=OTHER, wait_on=SIDE, record=first)
        trace.launch("row_mean_kernel(float*)", stream=OTHER, dur=1.0)
        if to_current:
            second = trace.ordering("cudaEventRecord")
            trace.ordering("cudaStreamWaitEvent", stream=CURRENT, wait_on=OTHER, record=second)
    assert codes(profile(side_stream_call(Trace(legacy=False), join))) == set()
    # the other stream carries it, but the caller's stream never waits for that one
    halfway = side_stream_call(Trace(legacy=False), lambda t: join(t, to_current=False))
    assert codes(profile(halfway)) == {("KD403", Level.ERROR)}


def test_a_device_synchronise_joins_it_and_a_synchronise_of_another_stream_does_not():
    device = side_stream_call(Trace(legacy=False),
                              lambda t: t.ordering("cudaDeviceSynchronize"))
    assert codes(profile(device)) == set()
    stream = side_stream_call(Trace(legacy=False),
                              lambda t: t.ordering("cudaStreamSynchronize", stream=SIDE))
    assert codes(profile(stream)) == set()
    other = side_stream_call(Trace(legacy=False),
                             lambda t: t.ordering("cudaStreamSynchronize", stream=99))
    assert codes(profile(other)) == {("KD403", Level.ERROR)}


def test_without_sync_records_any_wait_after_the_launch_counts_as_a_join():
    trace = side_stream_call(Trace(legacy=False, sync_events=False),
                             lambda t: t.ordering("cudaStreamWaitEvent"))
    assert codes(profile(trace)) == set()


def test_a_synchronise_after_forward_returned_does_not_join_it():
    trace = side_stream_call(Trace(legacy=False))
    trace.ordering("cudaDeviceSynchronize")  # the job's, after the call
    assert unjoined_streams(Session.read(trace.build(), OWN, sync_events=True))


# -- the job ----------------------------------------------------------------------------------


torch = pytest.importorskip("torch", reason="the profiled job needs torch; CI installs it")


def test_the_jobs_extraction_runs_under_the_cpu_profiler(tmp_path):
    from torch.profiler import ProfilerActivity, profile, record_function

    from kaudit.dynamic.harness.profile_job import extract

    with profile(activities=[ProfilerActivity.CPU]) as session:
        for call in range(2):
            with record_function(f"step:forward:{call}"):
                torch.relu(torch.ones(8) @ torch.ones(8, 8))
    session.export_chrome_trace(str(tmp_path / "trace.json"))
    record = extract(json.loads((tmp_path / "trace.json").read_text()))
    assert sorted((r["phase"], r["call"]) for r in record["ranges"]) == \
        [("forward", 0), ("forward", 1)]
    assert all(r["end"] >= r["start"] and r["tid"] is not None for r in record["ranges"])
    assert record["gpu"] == [] and record["runtime"] == [] and not record["truncated"]


def test_the_jobs_extraction_reads_kinetos_cuda_events():
    """Kineto's chrome-trace shape of CUDA activity: kernels with their stream and correlation,
    runtime and driver calls, synchronisation records."""
    from kaudit.dynamic.harness.profile_job import extract

    def event(cat, name, tid, ts, dur, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur,
                "args": args}

    trace = {"traceEvents": [
        event("user_annotation", "step:forward:0", 11, 100, 50),
        event("user_annotation", "someone_elses:range", 11, 100, 50),
        event("cpu_op", "aten::mm", 11, 105, 10),
        event("cuda_runtime", "cudaLaunchKernel", 11, 107, 2, correlation=5, cbid=211),
        event("cuda_driver", "cuLaunchKernel", 11, 120, 2, correlation=6),
        event("cuda_runtime", "cudaStreamWaitEvent", 11, 130, 1, correlation=7),
        event("cuda_runtime", "cudaMalloc", 11, 131, 1, correlation=8),
        event("kernel", "ampere_sgemm_128x64_nn", 7, 110, 30, stream=7, correlation=5),
        event("kernel", "add_kernel", 13, 125, 3, stream=13, correlation=6),
        event("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 7, 140, 1, stream=7,
              correlation=9),
        event("cuda_sync", "Stream Wait Event", 7, 131, 0, stream=7, correlation=7,
              wait_on_stream=13, wait_on_cuda_event_record_corr_id=4),
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 5, "ts": 110},
    ]}
    record = extract(trace)
    assert record["ranges"] == [{"phase": "forward", "call": 0, "start": 100.0, "end": 150.0,
                                 "tid": 11}]
    calls = {r["corr"]: r for r in record["runtime"]}
    assert set(calls) == {5, 6, 7}  # what launched GPU work or orders streams; not cudaMalloc
    assert calls[5]["op"] == "aten::mm" and calls[6]["op"] is None
    assert [(g["kind"], g["stream"], g["corr"]) for g in record["gpu"]] == \
        [("kernel", 7, 5), ("kernel", 13, 6), ("memcpy", 7, 9)]
    (wait,) = record["sync"]
    assert (wait["kind"], wait["stream"], wait["wait_on_stream"], wait["record_corr"]) == \
        ("Stream Wait Event", 7, 13, 4)


def _profiled_on_cpu(tmp_path, kernel_text: str) -> tuple[list, dict]:
    """The profiled job of `kernel_text` against a relu problem on the CPU, judged as in a scan:
    (the findings added, the run's metrics)."""
    from kaudit.dynamic.profiling import attribute, profile_job
    from kaudit.dynamic.runner import Job, SharedInputs

    problem = tmp_path / "problem.py"
    problem.write_text("import torch\n\nclass Model(torch.nn.Module):\n"
                       "    def forward(self, x):\n        return torch.relu(x)\n\n"
                       "def get_inputs():\n    return [torch.randn(4, 8)]\n\n"
                       "def get_init_inputs():\n    return []\n")
    kernel = tmp_path / "kernel.py"
    kernel.write_text(kernel_text)
    (tmp_path / "in").mkdir()
    torch.save([torch.randn(4, 8)], tmp_path / "in" / "inputs_a.pt")
    job = profile_job({"problem": str(problem), "device": "cpu", "init_seed": 42},
                      str(kernel), str(tmp_path / "build"),
                      inputs=SharedInputs.seal(tmp_path / "in"),
                      visible=(str(tmp_path),), timeout=120)
    assert isinstance(job, Job)
    found, metrics = [], {}
    attribute(lambda *a, **k: found.append(a), metrics, job, OwnKernels(), "kernelbench")
    return found, metrics


def test_the_job_runs_on_the_cpu_and_decides_nothing(tmp_path):
    from kaudit.dynamic.profiling import PROFILE_CALLS

    found, metrics = _profiled_on_cpu(tmp_path, (
        "import torch\n\nclass ModelNew(torch.nn.Module):\n"
        "    def forward(self, x):\n        return x.clamp_min(0)\n"))
    assert "profile_error" not in metrics, metrics
    assert found == [] and metrics["profile"]["calls"] == PROFILE_CALLS
    assert metrics["profile"]["kernels"] == 0  # no CUDA activity on the CPU


def test_a_kernel_that_forges_the_trace_is_tampering_and_its_trace_is_not_read(tmp_path):
    """A hostile kernel replaces the trace export with one that writes a made-up trace (its own
    kernel doing all the work): the job names the replaced function, kaudit reports KD405 and
    judges nothing from the forged record."""
    found, metrics = _profiled_on_cpu(tmp_path, (
        "import json\nimport torch\n\n"
        "def forged(self, path):\n"
        "    with open(path, 'w') as handle:\n"
        "        json.dump({'traceEvents': [{'ph': 'X', 'cat': 'kernel', 'name': 'my_kernel',\n"
        "                                    'ts': 1, 'dur': 100, 'args': {'stream': 7}}]},\n"
        "                  handle)\n\n"
        "torch.profiler.profile.export_chrome_trace = forged\n\n"
        "class ModelNew(torch.nn.Module):\n"
        "    def forward(self, x):\n        return torch.relu(x)\n"))
    (code, message), = [finding[:2] for finding in found]
    assert code == "KD405" and "torch.profiler.profile.export_chrome_trace" in message
    assert "profile" not in metrics and "attribution" not in metrics


# -- on a GPU ---------------------------------------------------------------------------------


#: the fixtures of the profiled run, with the side-stream ones whose race the probe may miss
GPU_FIXTURES = ("bad_library_share_cuda", "bad_library_share_triton", "good_library_share_cuda",
                "good_library_share_triton", "bad_no_gpu_work_cuda", "bad_no_gpu_work_triton",
                "good_no_gpu_work_cuda", "good_no_gpu_work_triton", "bad_side_stream_fast_triton",
                "good_side_stream_joined_triton")


@pytest.mark.skipif(os.environ.get("KAUDIT_TEST_DEVICE") != "cuda",
                    reason="GPU only: needs KAUDIT_TEST_DEVICE=cuda and a CUDA device")
def test_profiler_fixtures_on_gpu(tmp_path):
    """gpu: each fixture gives exactly its markers, with the profiled run's metrics."""
    if not torch.cuda.is_available():
        pytest.skip("KAUDIT_TEST_DEVICE=cuda, but torch sees no CUDA device")
    from kaudit.dynamic.kernels import DynamicOptions, GpuSlots, audit_kernel
    from kaudit.dynamic.options import TimingSettings
    from kaudit.dynamic.tolerance import resolve

    # no timing job: the profiled run does not depend on it, and GPU time is short
    options = DynamicOptions(resolve(None, None, None), device="cuda", calls=(8, 12),
                             timeout=480, extensions_dir=str(tmp_path / "extensions"),
                             timing=TimingSettings("off"))
    slots = GpuSlots(4)

    def one(name: str):
        kernel = DYNAMIC_FIXTURES / name / "kernel.py"
        with slots.take() as gpu:
            return name, audit_kernel(str(kernel), str(kernel), kernel.read_text(), options,
                                      "cuda", gpu=gpu)

    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = dict(pool.map(one, GPU_FIXTURES))
    failures = []
    for name, run in runs.items():
        kernel = DYNAMIC_FIXTURES / name / "kernel.py"
        actual = {(f.rule, f.line) for f in run.findings}
        shown = [f"{f.rule}:{f.level.value}: {f.message[:300]}" for f in run.findings]
        print(name, run.status, json.dumps(run.metrics.get("profile")), shown,
              json.dumps((run.metrics.get("attribution") or {}).get("table", [])[:3]),
              run.metrics.get("profile_error", ""))
        if actual != expected_findings(kernel):
            failures.append((name, shown))
    assert not failures, failures


def test_the_gpu_fixtures_exist_and_declare_their_findings():
    for name in GPU_FIXTURES:
        folder = DYNAMIC_FIXTURES / name
        assert (folder / "problem.py").is_file() and (folder / "kernel.py").is_file(), name
        assert bool(expected_findings(folder / "kernel.py")) == name.startswith("bad_"), name
