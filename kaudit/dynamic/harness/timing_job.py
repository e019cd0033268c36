"""A benchmark's timing run of a kernel and its reference problem, in one process on one device:
no poisoning, no guard zones, no watching of the outputs, as any harness times a submission. The
parent judges what it hands back (medians, spread, the comparison of CUDA events with the wall
clock, the check of the outputs of two trials); this file only measures.

It imports only the standard library and torch, and is loaded by path with the rest of its package
forgotten, like the plain run. Arguments: `in_dir` (`inputs_a.pt`, `inputs_b.pt`, `init.pt`),
`problem`, `kernel`, `device`, `init_seed`, `own_init` (as in the plain run), `build_dir`,
`gpu_memory_fraction`, `method` (`robust` or `kernelbench`), `warmup`, `min_trials`, `max_trials`,
`budget_s` (seconds of timed calls per model that set the trial count between the two), `discard`
(KernelBench's discarded first trials), `check` (trial numbers whose candidate outputs are saved as
`check<t>.pt`), `go` (on a GPU: the job is gated, and waits there for its turn alone on the GPU,
its process and CUDA context made and no code of the problem or kernel run; the go file brings
its cap).

`robust`: the reference is timed first, before the kernel file is imported (`reference_before`);
then reference and candidate alternate, trial by trial, in alternating order. Each trial gets
fresh input buffers holding new values (inputs A or B, floating tensors scaled by a factor that
differs per trial; the checked trials unscaled), the whole device synchronised before and after
the call, on CUDA the L2 cache flushed first (a buffer of four times the L2 size, at least 256
MiB, zeroed) and the call timed by CUDA events on the current stream and by the wall clock. On the
CPU the wall clock alone, torch on one thread. `kernelbench`: as KernelBench's `cuda_event` method (its `host_time`
method on the CPU): warm-up calls, then trials on the same inputs A, the L2 cache flushed with a
256 MiB buffer, the first trials discarded; the parent takes the mean.

What it relies on (the timer, the device synchronise, the events, the calls it makes on tensors)
is captured before the kernel file is imported; what the kernel rebound is listed in `tampered`.
With `marks` (the path of the parent's socket), each alternating trial is also marked on that
socket, connected before the kernel file is imported: `<trial> <model> start` right before its
timer starts, `<trial> <model> end` right after it stops. The operating system stamps each mark as
it is sent, so the parent has the trials' brackets on a clock the kernel cannot rewrite.
"""

import importlib.util
import os
import socket
import sys
import time

#: KernelBench flushes the L2 cache by filling a tensor of this many bytes
KERNELBENCH_FLUSH_BYTES = 256 << 20
#: the robust flush: this many times the L2 size, and at least the KernelBench buffer
FLUSH_L2_MULTIPLE = 4


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: loaded by path from beside this file (its package is forgotten in a file job)
model_state, go = (_load(name, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            f"{name}.py")) for name in ("model_state", "go"))


class _Clock:
    """The timer, captured before any code of the kernel runs."""

    def __init__(self, torch, device, mark):
        self.torch = torch
        #: sends one mark to the parent (a bound `send` of its connected socket), or None
        self.mark = mark
        self.cuda = device.type == "cuda"
        self.perf = time.perf_counter
        self.sync = torch.cuda.synchronize if self.cuda else None
        self.event = torch.cuda.Event if self.cuda else None
        self.zero = torch.Tensor.zero_
        self.clone = torch.Tensor.clone
        self.mul = torch.Tensor.mul
        self.no_grad = torch.no_grad
        self.call = torch.nn.Module.__call__
        self.flush_buffer = None
        self.recorded = self._targets()

    def _targets(self):
        torch = self.torch
        targets = {"time.perf_counter": (time, "perf_counter"),
                   "torch.Tensor.zero_": (torch.Tensor, "zero_"),
                   "torch.Tensor.clone": (torch.Tensor, "clone"),
                   "torch.Tensor.mul": (torch.Tensor, "mul"),
                   "torch.no_grad": (torch, "no_grad"),
                   "torch.nn.Module.__call__": (torch.nn.Module, "__call__")}
        if self.cuda:
            targets.update({"torch.cuda.synchronize": (torch.cuda, "synchronize"),
                            "torch.cuda.Event": (torch.cuda, "Event"),
                            "torch.cuda.Event.record": (torch.cuda.Event, "record"),
                            "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time")})
        return {name: (owner, attribute, getattr(owner, attribute))
                for name, (owner, attribute) in targets.items()}

    def tampered(self):
        return sorted(name for name, (owner, attribute, value) in self.recorded.items()
                      if getattr(owner, attribute, None) is not value)

    def use_flush(self, nbytes):
        self.flush_buffer = self.torch.empty(nbytes // 4, dtype=self.torch.int32, device="cuda")

    def settle(self):
        """The whole device idle, and its L2 cache holding nothing of the last call."""
        if self.cuda:
            self.sync()
            if self.flush_buffer is not None:
                self.zero(self.flush_buffer)
                self.sync()

    def time(self, model, inputs, label=None):
        """One call: (CUDA event milliseconds or None, wall-clock milliseconds, the outputs); a
        call with a `label` is marked on the parent's socket, right outside its timer."""
        self.settle()
        marked = label is not None and self.mark is not None
        with self.no_grad():
            if self.cuda:
                start, end = self.event(enable_timing=True), self.event(enable_timing=True)
            if marked:
                self.mark(label + b" start")
            began = self.perf()
            if self.cuda:
                start.record()
                result = self.call(model, *inputs)
                end.record()
                self.sync()
            else:
                result = self.call(model, *inputs)
            wall = (self.perf() - began) * 1e3
            if marked:
                self.mark(label + b" end")
            return start.elapsed_time(end) if self.cuda else None, wall, result


def _fresh(clock, torch, values, factor):
    """New buffers holding `values` (on the device), floating tensors multiplied by `factor`."""
    fresh = []
    for value in values:
        if isinstance(value, torch.Tensor):
            value = clock.clone(value)
            if factor != 1 and value.is_floating_point():
                value = clock.mul(value, factor)
        fresh.append(value)
    return fresh


def _clock_mhz(torch, device):
    if device.type != "cuda":
        return None
    try:
        return int(torch.cuda.clock_rate(device))
    except Exception:  # noqa: BLE001 - pynvml missing or no permission: clocks unknown
        return None


def _save_outputs(torch, result, path):
    items = list(result) if isinstance(result, (list, tuple)) else [result]
    torch.save([t.detach().cpu().clone().as_subclass(torch.Tensor) if isinstance(t, torch.Tensor)
                else torch.tensor(float("nan")) for t in items], path)


def _connect(path):
    """The bound `send` of a socket connected to the parent's (None without one, or when it
    cannot be reached: the parent sees that no trial was marked)."""
    if not path:
        return None
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    folder = None
    try:
        if len(path.encode()) >= 100:  # longer than an address holds: through the folder's fd
            folder = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
            path = f"/proc/self/fd/{folder}/{os.path.basename(path)}"
        channel.connect(path)
    except OSError:
        channel.close()
        return None
    finally:
        if folder is not None:
            os.close(folder)
    return channel.send


def run(args, out_dir):
    mark = _connect(args.get("marks"))
    import torch

    if args.get("build_dir"):
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(args["build_dir"], "torch")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(args["build_dir"], "triton")
    device = torch.device(args.get("device", "cpu"))
    if device.type == "cpu":
        # one thread: intra-op threads waiting on each other on a busy machine are most of the
        # spread of a wall-clock time
        torch.set_num_threads(1)
    granted = args
    if args.get("go"):  # its CUDA context made, no code of the problem or kernel run yet
        torch.zeros(1, device=device)
        granted = go.wait_for_go(str(args["go"]))  # its turn alone on the GPU
    if device.type == "cuda" and granted.get("gpu_memory_fraction"):
        torch.cuda.set_per_process_memory_fraction(float(granted["gpu_memory_fraction"]))

    def load(name):
        return torch.load(os.path.join(args["in_dir"], name), map_location="cpu",
                          weights_only=True)

    # on the device once; each trial copies them there into fresh buffers
    pool = [[v.to(device) if isinstance(v, torch.Tensor) else v for v in load(name)]
            for name in ("inputs_a.pt", "inputs_b.pt")]
    seed = int(args["init_seed"])
    problem = _load("problem", args["problem"])
    if os.path.exists(os.path.join(args["in_dir"], "init.pt")):
        data = load("init.pt")
        init_inputs, state = list(data["init_inputs"]), dict(data["state"])
    else:
        torch.manual_seed(seed)
        init_inputs = problem.get_init_inputs()
        state = problem.Model(*init_inputs).state_dict()
    reference = model_state.build(torch, problem.Model, init_inputs, state, seed, device)
    clock = _Clock(torch, device, mark)
    method = args.get("method", "robust")
    if device.type == "cuda":
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        clock.use_flush(KERNELBENCH_FLUSH_BYTES if method == "kernelbench"
                        else max(FLUSH_L2_MULTIPLE * l2, KERNELBENCH_FLUSH_BYTES))
    info = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "clock_mhz_before": _clock_mhz(torch, device),
            "flush_bytes": (clock.flush_buffer.numel() * 4
                            if clock.flush_buffer is not None else 0),
            "torch": torch.__version__}
    warmup = int(args.get("warmup", 3))
    if method == "robust":
        for _ in range(warmup):
            clock.time(reference, _fresh(clock, torch, pool[0], 1))
        before = [clock.time(reference, _fresh(clock, torch, pool[t % 2], 1))[:2]
                  for t in range(int(args.get("min_trials", 10)))]
        info["reference_before"] = [wall if event is None else event for event, wall in before]
    candidate_class = _load("kernel", args["kernel"]).ModelNew
    # own_init: built as KernelBench builds it, the way the judge found it right
    candidate = model_state.build(torch, candidate_class, init_inputs,
                                  {} if args.get("own_init") else state, seed, device)
    if method == "kernelbench":
        info.update(_kernelbench(clock, torch, reference, candidate, pool[0], warmup,
                                 int(args.get("max_trials", 100)), int(args.get("discard", 1)),
                                 device))
    else:
        info.update(_robust(clock, torch, reference, candidate, pool, warmup, args,
                            lambda t, result: _save_outputs(
                                torch, result, os.path.join(out_dir, f"check{t}.pt"))))
    info["clock_mhz_after"] = _clock_mhz(torch, device)
    info["tampered"] = clock.tampered()
    return info


def _robust(clock, torch, reference, candidate, pool, warmup, args, keep):
    """Warm-up, a trial count from the budget, then alternating trials (see the docstring)."""
    estimate = []
    for model in (reference, candidate):
        for _ in range(warmup):
            clock.time(model, _fresh(clock, torch, pool[0], 1))
        event, wall, _ = clock.time(model, _fresh(clock, torch, pool[0], 1))
        estimate.append(max(event or 0.0, wall))
    low, high = int(args.get("min_trials", 10)), int(args.get("max_trials", 100))
    trials = max(low, min(high, int(float(args.get("budget_s", 2.0)) * 1e3
                                    / max(1e-3, max(estimate)))))
    check = {int(t) for t in args.get("check", [])}
    times = {"reference": [], "candidate": []}
    for t in range(trials):
        factor = 1 if t in check else 1 + (t + 1) * 2.0 ** -12
        order = ("reference", "candidate") if t % 2 == 0 else ("candidate", "reference")
        for name in order:
            model = reference if name == "reference" else candidate
            event, wall, result = clock.time(model, _fresh(clock, torch, pool[t % 2], factor),
                                             f"{t} {name}".encode())
            times[name].append({"event": event, "wall": wall})
            if name == "candidate" and t in check:
                keep(t, result)
            del result
    return {"trials": trials, "warmup": warmup, **times}


def _kernelbench(clock, torch, reference, candidate, inputs, warmup, trials, discard, device):
    """KernelBench's way: the same inputs every trial, the first `discard` trials dropped."""
    inputs = _fresh(clock, torch, inputs, 1)
    times = {}
    for name, model in (("candidate", candidate), ("reference", reference)):
        for _ in range(warmup):
            clock.time(model, inputs)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        measured = [clock.time(model, inputs)[:2] for _ in range(trials + discard)][discard:]
        times[name] = [{"event": event, "wall": wall} for event, wall in measured]
    return {"trials": trials, "warmup": warmup, **times}
