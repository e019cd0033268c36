"""The profiled run: what the GPU really ran during a few calls of forward, recorded with
`torch.profiler` (CPU and CUDA activity) for the parent's attribution module to judge (KD601,
KD602, KD403). This file only records and extracts; it decides nothing.

It imports only the standard library and torch, and is loaded by path with the rest of its package
forgotten, like the plain run. Arguments: `in_dir` (`inputs_a.pt`, `init.pt`), `problem`,
`kernel`, `device`, `init_seed`, `own_init` (as in the plain run), `build_dir`,
`gpu_memory_fraction`, `warmup` (unprofiled calls first: compiles, autotuning), `calls` (profiled
calls per model).

The reference problem is profiled first, before the kernel file is imported, then the candidate,
each in its own profiler session, with no poisoning. Each profiled call is bracketed by the job's
own ranges (`record_function`): `step:before` and `step:after` launch one small marker kernel
on the caller's current stream (so the parent learns which stream that is, and whether the GPU ran
the caller's next work before forward's kernels finished), `step:forward` holds the call; the
device is synchronised after `step:after`. On CUDA the profiler is asked for CUDA
synchronisation events (stream waits with the stream of the awaited event) where torch offers it.

The chrome trace is exported to a scratch file, read back and reduced (`extract`) to a compact
record per session, written as `profile.json`: the job's ranges, GPU activity (kernels, copies,
fills: name, stream, start, duration, correlation id), the runtime and driver calls that launched
it or that order streams (name, correlation id, start, duration, thread, the innermost profiler
op around it), and the synchronisation events. Times are microseconds on the trace's clock.

What it relies on (the profiler, its ranges, the synchronise) is captured before the kernel file is
imported; what the kernel rebound is listed in `tampered`.
"""

import bisect
import importlib.util
import json
import os
import sys

#: the job's own ranges around each profiled call
RANGE_PREFIX = "step:"
#: runtime and driver calls that order streams or the host against the device
ORDERING_CALLS = frozenset({
    "cudaStreamWaitEvent", "cudaStreamSynchronize", "cudaDeviceSynchronize",
    "cudaEventSynchronize", "cudaEventRecord", "cudaEventRecordWithFlags", "cudaStreamQuery",
    "cuStreamWaitEvent", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
    "cuEventRecord", "cuEventRecordWithFlags"})
#: trace categories of GPU activity, by the kind the parent reads
GPU_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
#: events of each kind kept per session: a forward launching more is summarised by these
MAX_EVENTS = 20000


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: loaded by path from beside this file (its package is forgotten in a file job)
model_state = _load("model_state", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                "model_state.py"))


def _int(value, default=None):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def extract(trace):
    """The compact record of one chrome trace (a dict with `traceEvents`), see the docstring."""
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    ops = {}  # thread -> (starts, [(start, end, name)]) of profiler ops, by start
    ranges, gpu, host, sync = [], [], [], []
    for event in events:
        category, name = event.get("cat", ""), str(event.get("name", ""))
        start, duration = _float(event.get("ts")), _float(event.get("dur"))
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        if category == "user_annotation" and name.startswith(RANGE_PREFIX):
            parts = name[len(RANGE_PREFIX):].split(":")
            if len(parts) == 2 and parts[1].isdigit():
                ranges.append({"phase": parts[0], "call": int(parts[1]), "start": start,
                               "end": start + duration, "tid": _int(event.get("tid"))})
        elif category == "cpu_op":
            ops.setdefault(_int(event.get("tid")), []).append((start, start + duration, name))
        elif category in GPU_KINDS and len(gpu) < MAX_EVENTS:
            gpu.append({"kind": GPU_KINDS[category], "name": name[:300],
                        "stream": _int(args.get("stream"), _int(event.get("tid"))),
                        "start": start, "dur": duration,
                        "corr": _int(args.get("correlation"))})
        elif category in ("cuda_runtime", "cuda_driver") and len(host) < MAX_EVENTS:
            host.append({"name": name, "corr": _int(args.get("correlation")), "start": start,
                         "dur": duration, "tid": _int(event.get("tid"))})
        elif category == "cuda_sync" and len(sync) < MAX_EVENTS:
            sync.append({"kind": str(args.get("cuda_sync_kind") or name),
                         "stream": _int(args.get("stream"), -1),
                         "corr": _int(args.get("correlation")),
                         "wait_on_stream": _int(args.get("wait_on_stream"), -1),
                         "record_corr": _int(args.get("wait_on_cuda_event_record_corr_id"), -1),
                         "start": start})
    launched = {g["corr"] for g in gpu if g["corr"] is not None}
    host = [h for h in host if h["corr"] in launched or h["name"] in ORDERING_CALLS]
    for thread in ops:
        ops[thread].sort()
    for call in host:
        call["op"] = _innermost(ops.get(call["tid"], []), call["start"])
    return {"ranges": ranges, "gpu": gpu, "runtime": host, "sync": sync,
            "truncated": any(len(kind) >= MAX_EVENTS for kind in (gpu, host, sync))}


def _innermost(ops, at):
    """The name of the latest-starting op of one thread (sorted by start) that holds time `at`."""
    index = bisect.bisect_right(ops, (at, float("inf"), ""))
    for start, end, name in reversed(ops[max(0, index - 256):index]):
        if start <= at <= end:
            return name
    return None


class _Recorder:
    """The profiler, its ranges and the synchronise, captured before any code of the kernel
    runs."""

    def __init__(self, torch, device):
        from torch import profiler

        self.torch = torch
        self.cuda = device.type == "cuda"
        self.profile = profiler.profile
        self.range = profiler.record_function
        self.activities = [profiler.ProfilerActivity.CPU] + (
            [profiler.ProfilerActivity.CUDA] if self.cuda else [])
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.no_grad = torch.no_grad
        self.call = torch.nn.Module.__call__
        self.add = torch.Tensor.add_
        self.clone = torch.Tensor.clone
        self.current_stream = torch.cuda.current_stream if self.cuda else None
        self.marker = torch.zeros(1, device=device)
        self.recorded = {name: (owner, attribute, getattr(owner, attribute))
                         for name, (owner, attribute) in {
                             "torch.profiler.profile": (profiler, "profile"),
                             "torch.profiler.record_function": (profiler, "record_function"),
                             "torch.nn.Module.__call__": (torch.nn.Module, "__call__"),
                             "torch.profiler.profile.__enter__": (profiler.profile, "__enter__"),
                             "torch.profiler.profile.__exit__": (profiler.profile, "__exit__"),
                             "torch.profiler.profile.export_chrome_trace": (
                                 profiler.profile, "export_chrome_trace"),
                             "torch.Tensor.add_": (torch.Tensor, "add_"),
                             "torch.Tensor.clone": (torch.Tensor, "clone"),
                             "torch.cuda.current_stream": (torch.cuda, "current_stream"),
                             "torch.cuda.synchronize": (torch.cuda, "synchronize")}.items()}
        self.sync_events = False

    def tampered(self):
        return sorted(name for name, (owner, attribute, value) in self.recorded.items()
                      if getattr(owner, attribute, None) is not value)

    def _session(self):
        if self.cuda:
            try:  # stream waits with the awaited event's stream (torch >= 2.1)
                config = self.torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
                session = self.profile(activities=self.activities, experimental_config=config)
                self.sync_events = True
                return session
            except (AttributeError, TypeError, RuntimeError):
                self.sync_events = False
        return self.profile(activities=self.activities)

    def record(self, model, inputs, calls, scratch):
        """Profile `calls` calls of `model` on fresh copies of `inputs`; the extracted record."""
        clone = self.clone
        # the legacy default stream orders itself with every blocking stream
        legacy = self.cuda and self.current_stream().cuda_stream == 0
        with self.no_grad(), self._session() as session:
            for call in range(calls):
                values = [clone(v) if isinstance(v, self.torch.Tensor) else v for v in inputs]
                self.sync()
                with self.range(f"{RANGE_PREFIX}before:{call}"):
                    self.add(self.marker, 1)
                with self.range(f"{RANGE_PREFIX}forward:{call}"):
                    result = self.call(model, *values)
                with self.range(f"{RANGE_PREFIX}after:{call}"):
                    self.add(self.marker, 1)
                self.sync()
                del result
        session.export_chrome_trace(scratch)
        try:
            with open(scratch, encoding="utf-8") as handle:
                return {**extract(json.load(handle)), "current_stream_legacy": legacy}
        finally:
            os.remove(scratch)


def run(args, out_dir):
    import torch

    if args.get("build_dir"):
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(args["build_dir"], "torch")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(args["build_dir"], "triton")
    device = torch.device(args.get("device", "cpu"))
    if device.type == "cuda" and args.get("gpu_memory_fraction"):
        torch.cuda.set_per_process_memory_fraction(float(args["gpu_memory_fraction"]))

    def load(name):
        return torch.load(os.path.join(args["in_dir"], name), map_location="cpu",
                          weights_only=True)

    inputs = [v.to(device) if isinstance(v, torch.Tensor) else v for v in load("inputs_a.pt")]
    seed = int(args["init_seed"])
    problem = _load("problem", args["problem"])
    if os.path.exists(os.path.join(args["in_dir"], "init.pt")):
        data = load("init.pt")
        init_inputs, state = list(data["init_inputs"]), dict(data["state"])
    else:
        torch.manual_seed(seed)
        init_inputs = problem.get_init_inputs()
        state = problem.Model(*init_inputs).state_dict()
    recorder = _Recorder(torch, device)
    warmup, calls = int(args.get("warmup", 2)), int(args.get("calls", 3))
    scratch = os.path.join(out_dir, "trace.json")
    sessions = {}
    for name in ("reference", "candidate"):
        if name == "reference":
            model = model_state.build(torch, problem.Model, init_inputs, state, seed, device)
        else:
            # own_init: built as KernelBench builds it, the way the judge found it right
            model = model_state.build(torch, _load("kernel", args["kernel"]).ModelNew,
                                      init_inputs, {} if args.get("own_init") else state, seed,
                                      device)
        with torch.no_grad():
            for _ in range(warmup):
                recorder.call(model, *[v.clone() if isinstance(v, torch.Tensor) else v
                                       for v in inputs])
        recorder.sync()
        sessions[name] = recorder.record(model, inputs, calls, scratch)
        del model
    record = {"calls": calls, "sync_events": recorder.sync_events, "torch": torch.__version__,
              **sessions}
    with open(os.path.join(out_dir, "profile.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    return {"calls": calls, "tampered": recorder.tampered(),
            "events": {name: len(session["gpu"]) for name, session in sessions.items()}}
