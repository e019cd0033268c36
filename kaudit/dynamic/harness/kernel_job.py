"""The jobs of `scan --dynamic` (each in its own process, never in the parent).

`run_reference` imports the problem, builds `Model(*get_init_inputs())` under the init seed and, for
two input seeds, saves the inputs `get_inputs()` gives (`inputs_a.pt`, `inputs_b.pt`, before forward
runs) and the reference outputs (`ref_a.pt`, `ref_b.pt`). It also saves what the candidate needs to
build its model without importing the problem (`init.pt`: the init inputs and Model's
`state_dict`; `sizes` rebinds module-level sizes of the problem first, for KD302), and, for each
input scale other than 1 (`scales`, KD301), the float64 copy of the reference model's output on
the first seed's inputs with their floating tensors multiplied by the scale (`ref64_s<k>.pt`, in
float32 for outputs of lower precision: `scaling.twin`); of the native model's output there, only
its distance from that one (`scaling.distance`), its dtypes and bytes are reported, not the
tensors (half the bytes a scale writes). The scaled inputs are not saved: the candidate makes
them from `inputs_a.pt` the same way (an elementwise product, exact to the bit), so a kernel's
shared inputs are two sets, not four (a level-1 set reaches gigabytes).

`run_candidate` never sees a reference output nor, when `init.pt` could be handed over, the problem
file: it gets copies of the inputs and of `init.pt` in its `in` folder. It records what it relies on
(`guard.Watch`) and captures `torch.save` before importing the kernel file (compiling its
extensions into its own `build` folder), builds `ModelNew` under the init seed, loads the entries
of Model's `state_dict` whose names and shapes match, and runs a schedule of `calls` calls on one
model, in an order drawn from `schedule_seed`:

- first a call on inputs A (`plain.pt`); its outputs are compared again after a random delay of
  0.25-0.75 s (KD404);
- then, shuffled: more calls on inputs A, each compared with the first (the one that differs most
  is `a_worst.pt`, judged against the reference), a call on inputs B in fresh buffers
  (`fresh.pt`), one on inputs B copied into the first call's buffers (`same.pt`, KD401), and one
  on each scaled input (`scaled_s<k>.pt`, KD301);
- four poisoned runs at random places among them, each a new model built and called once under
  `poison` (keyed patterns in fresh allocations and guard zones, KD101-KD103): `poison0.pt` ..
  `poison3.pt`; run 3 repeats run 0's pattern. On CUDA each also copies the outputs on the current
  stream right after forward returns, before any device synchronise, and counts elements that
  differ from the outputs after the synchronise (KD403).

An answer bit-identical to the first one saved for the same inputs (A: `plain.pt`; B: the
first of `fresh.pt` and `same.pt`) is not written again: `same_as` names that file (an honest
kernel's poisoned runs give the bits of its first call, and outputs reach gigabytes).

When ModelNew's own initialisation under the init seed set some entry of the copied state
otherwise (`own_init_differs`), a last model is built without the copy, as KernelBench builds it,
and called on inputs B, then A (`own_b.pt`, `own_a.pt`).

After every call: the inputs are compared with their originals (the first call that changed them
saves them as `inputs_after.pt`, KD402); threads started during the call and still running when it
returned are listed (KD404); and `guard.Watch` lists what was rebound (KD405).

Forward must return a plain tensor or a sequence of them: a tensor subclass is recorded (KD404) and
read as a plain tensor; anything else raises `DeferredOutputError` (KD404). On CUDA,
`gpu_memory_fraction` caps the caching allocator of both jobs
(`torch.cuda.set_per_process_memory_fraction`; memory an extension takes with `cudaMalloc` is
not capped).
"""

from __future__ import annotations

import contextlib
import operator
import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from . import model_state
from .child import import_file
from .child import phase as _phase

#: the last phase a job entered, for a parent whose child timed out or crashed
PHASE_FILE = "phase.txt"
#: seconds forward's outputs are watched after it returned (KD404): a random delay in this range
DEFERRED_WAIT = (0.25, 0.75)
_out_dir: list[str] = []


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """`child.phase`, also recorded in the output folder's PHASE_FILE."""
    if _out_dir:
        with open(os.path.join(_out_dir[0], PHASE_FILE), "w", encoding="utf-8") as handle:
            handle.write(name)
    with _phase(name):
        yield


def run_reference(args: dict, out_dir: str) -> dict:
    import torch

    from .problem_job import float64_copy, float64_kernels, make_inputs
    from .scaling import distance, scale_input, twin
    from .sentinels import as_bits

    _out_dir[:] = [out_dir]
    device = torch.device(args.get("device", "cpu"))
    _ready_cuda(torch, device, args)
    with phase("problem-import"):
        problem = import_file("problem", args["problem"])
        for name, value in (args.get("sizes") or {}).items():  # a shape sweep (KD302)
            setattr(problem, name, value)
    with phase("reference-init"):
        torch.manual_seed(int(args["init_seed"]))
        init_inputs = problem.get_init_inputs()
        model = problem.Model(*init_inputs)
        handed_over = _hand_over(torch, init_inputs, model, out_dir)
        model = model.to(device)
    shapes = {}
    first: list = []
    mutates = False  # the problem's own forward modifies its inputs (KD402 is then a warning)
    for name, seed in (("a", args["seeds"][0]), ("b", args["seeds"][1])):
        with phase("inputs"):  # made on the device (fast for gigabytes), saved from the CPU
            inputs = [_cpu(v, torch) for v in make_inputs(problem, int(seed), device, torch)]
        with phase("inputs-save"):
            torch.save(inputs, os.path.join(out_dir, f"inputs_{name}.pt"))
            first = first or inputs
        with phase("reference-forward"):
            given = _to(inputs, device, torch)
            outputs = _forward(model, given, torch, device)
        if name == "a":
            with phase("reference-fp64"):
                noise, reference64 = _reference_noise(torch, model, inputs, outputs, device)
        with phase("reference-save"):
            _save(torch, outputs, out_dir, f"ref_{name}.pt")
            after = [_cpu(v, torch) for v in given]
            if _changed(after, inputs, torch, as_bits):
                # what the problem's own forward leaves in its inputs (an `out=` buffer): a
                # kernel that leaves the same is doing what was asked (KD402)
                mutates = True
                torch.save(after, os.path.join(out_dir, f"ref_inputs_after_{name}.pt"))
            shapes[name] = [list(o.shape) for o in outputs]
    scales: dict[str, Any] = {}
    for index, factor in enumerate(args.get("scales", [])):
        key = f"s{index}"
        with phase("scaled-reference"):
            scaled = [scale_input(v, factor, torch) for v in first]
            native = _forward(model, _to(scaled, device, torch), torch, device)
            scales[key] = {"scale": factor, "fp64": False,
                           "dtypes": [str(o.dtype).removeprefix("torch.") for o in native],
                           "bytes": sum(o.numel() * o.element_size() for o in native)}
        try:
            if reference64 is None:
                reference64, error = float64_copy(model, torch)
                if error:
                    raise RuntimeError(error)
            wide = [v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                    for v in scaled]
            with float64_kernels(torch):
                exact = _forward(reference64, _to(wide, device, torch), torch, device)
            # the native outputs stay here: the judge needs only how far they are from the
            # float64 ones, and those as `twin` keeps them (half the bytes for float32 outputs)
            scales[key]["errors"] = [list(distance(t, o)) if t.shape == o.shape else None
                                     for t, o in zip(exact, native)]
            _save(torch, [twin(t, o, torch) for t, o in zip(exact, native)], out_dir,
                  f"ref64_{key}.pt")
            scales[key]["fp64"] = True
        except Exception as exc:  # noqa: BLE001 - without float64, conditioning is unknown
            scales[key]["fp64_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        del native
    return {"shapes": shapes, "scales": scales, "torch": torch.__version__,
            "init_handed_over": handed_over, "mutates_inputs": mutates, "noise": noise}


def _reference_noise(torch: Any, model: Any, inputs: list, outputs: list,
                     device: Any) -> tuple[list | None, Any]:
    """Per output on inputs A, its relative L2 distance from the float64 model's output on the
    same inputs (None where that cannot be told), and the float64 model (None if it could not
    be made). Near 1, the output is rounding noise: the exact answer is zero (a GroupNorm's
    mean), and no output can be judged right or wrong against it."""
    from .problem_job import float64_copy, float64_kernels
    from .scaling import distance

    try:
        reference64, error = float64_copy(model, torch)
        if error:
            return None, None
        wide = [v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                for v in inputs]
        with float64_kernels(torch):
            exact = _forward(reference64, _to(wide, device, torch), torch, device)
    except Exception:  # noqa: BLE001 - without float64, the noise is unknown
        return None, None
    # an exact answer of zero and a native one that is not: all noise (inf)
    return [distance(true, native)[0] if native.is_floating_point() and native.shape == true.shape
            else None for native, true in zip(outputs, exact)], reference64


def _hand_over(torch: Any, init_inputs: Any, model: Any, out_dir: str) -> bool:
    """Save the init inputs and Model's state for the candidate (`init.pt`), if they load back
    with `weights_only=True`; False when they do not (the candidate imports the problem)."""
    path = os.path.join(out_dir, "init.pt")
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    try:
        torch.save({"init_inputs": list(init_inputs), "state": state}, path)
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - objects weights_only refuses
        if os.path.exists(path):
            os.unlink(path)
        return False
    return True


class DeferredOutputError(TypeError):
    """forward returned something other than tensors (KD404)."""


def run_candidate(args: dict, out_dir: str) -> dict:
    import torch

    from . import guard, sentinels
    from .poison import THREAD_START, Poisoner, poison_free_cuda_memory, warm_cuda_cache
    from .counting import count_where
    from .scaling import scale_input

    # captured before any code of the kernel runs: what saves the outputs, and a record of
    # everything the harness relies on
    watch = guard.Watch(torch, __package__, {"threading.Thread.start": (THREAD_START,)})
    real_save, as_bits = torch.save, sentinels.as_bits

    anchors: dict[str, tuple[str, list]] = {}  # input set -> its first saved answer

    def save(outputs: list, name: str, inputs: str | None = None) -> None:
        """`inputs`: the input set `outputs` answer ("a", "b"); an answer bit-identical to the
        first one saved for that set is not written again but named in `same_as` (an honest
        kernel's poisoned and repeated runs give the same bits, and outputs reach gigabytes)."""
        cpu = [o.detach().cpu().clone() for o in outputs]
        anchor = anchors.get(inputs) if inputs else None
        if anchor is not None and _identical(torch, cpu, anchor[1]):
            info["same_as"][name] = anchor[0]
            return
        if inputs and anchor is None:
            anchors[inputs] = (name, cpu)
        real_save(cpu, os.path.join(out_dir, name))

    _out_dir[:] = [out_dir]
    use_build_folder(args, out_dir)
    device = torch.device(args.get("device", "cpu"))
    _ready_cuda(torch, device, args)
    key = str(args["poison_key"])
    inputs_dir = args["in_dir"]

    def load_inputs(name: str) -> list:
        return torch.load(os.path.join(inputs_dir, f"inputs_{name}.pt"), map_location="cpu",
                          weights_only=True)

    with phase("load"):  # before the kernel is imported, as every input
        inputs_a, inputs_b = load_inputs("a"), load_inputs("b")
        scaled_sets = {f"s{index}": [scale_input(v, factor, torch) for v in inputs_a]
                       for index, factor in enumerate(args.get("scales", []))}
        init_inputs, state = _init_state(torch, args)
    init_seed = int(args["init_seed"])
    with phase("import"):  # load_inline compiles here
        kernel = import_file("kernel", args["kernel"])
        if not isinstance(getattr(kernel, "ModelNew", None), type):
            raise ImportError("the kernel file defines no class ModelNew")

    def build_model() -> Any:
        torch.manual_seed(init_seed)
        model = kernel.ModelNew(*init_inputs)
        own = model.state_dict()
        matched = model_state.matching(state, own)
        if info["own_init_differs"] is None:  # before the copy: what ModelNew sets otherwise
            info["own_init_differs"] = [
                k for k, v in matched.items() if isinstance(v, torch.Tensor)
                and not _identical(torch, [own[k].detach().cpu()], [v])]
        model_state.copy_into(torch, model, matched)
        return model.to(device), len(matched)

    def own_initialisation() -> None:
        """ModelNew as KernelBench builds it (the init seed, no weights copied in), called on
        inputs B, then A (`own_b.pt`, `own_a.pt`): the judge's fallback when Model's weights make
        the kernel wrong and its own make it right (an `__init__` that folds a constant into a
        parameter). A fresh model, B first: an answer kept from an earlier call is wrong on A."""
        with phase("own-init"):
            torch.manual_seed(init_seed)
            model = kernel.ModelNew(*init_inputs).to(device)
        with phase("own-forward"):
            for kind in ("b", "a"):
                result = _call(model, _to(originals[kind], device, torch), torch)
                save(_outputs(result, torch, device, info), f"own_{kind}.pt", kind)

    info: dict[str, Any] = {"returned": None, "guard_violations": [], "side_stream": [],
                            "changed_after_return": 0, "lingering_threads": [], "tampered": [],
                            "mutated": None, "worst_call": None, "differing_calls": 0,
                            "own_init_differs": None, "same_as": {}}
    counters: dict[str, int] = {}
    output_oob: dict[int, list] = {}
    scale_keys = list(scaled_sets)
    with phase("load"):
        originals = {"a": inputs_a, "b": inputs_b, **scaled_sets}
        on_device = {name: _to(values, device, torch) for name, values in originals.items()}
    steps = _schedule(random.Random(int(args["schedule_seed"])), int(args["calls"]), scale_keys)
    rng = random.Random(int(args["schedule_seed"]) + 1)
    number = 0
    state_of: dict[str, Any] = {}

    def after_call(kind: str, inputs: list, threads: list[str]) -> None:
        """What is checked after every call: inputs, threads, tampering."""
        nonlocal number
        number += 1
        for name in threads:
            if name not in info["lingering_threads"]:
                info["lingering_threads"].append(name)
        if info["mutated"] is None and _changed(inputs, on_device[kind], torch, as_bits):
            info["mutated"] = {"call": number, "inputs": kind}
            real_save([_cpu(v, torch) for v in inputs], os.path.join(out_dir, "inputs_after.pt"))
        for what in watch.changes():
            if what not in info["tampered"]:
                info["tampered"].append(what)

    if device.type == "cuda":
        warm_cuda_cache(device)
    for step in steps:
        if step[0] == "poison":
            run = step[1]
            poisoner = Poisoner(run, key)
            sentinels.warm_tiles(run, key, device)
            with phase("init"), poisoner.mode():
                model, info["state_matched"] = build_model()
            with phase("forward"):
                inputs = _to(originals["a"], device, torch)
                if device.type == "cuda":
                    info["free_memory_poisoned"] = poison_free_cuda_memory(run, key)
                poisoner.phase = "forward"
                with _Threads(torch) as threads, poisoner.mode():
                    result = _call(model, inputs, torch)
                # copied on the current stream before any device synchronise (KD403)
                early = [o.clone() for o in _tensors(result, torch, info)] \
                    if device.type == "cuda" else None
                outputs = _outputs(result, torch, device, info)
                if early is not None:
                    differing = sum(count_where(operator.ne, as_bits(e), as_bits(o))
                                    for e, o in zip(early, outputs))
                    info["side_stream"].append(differing)
                violations, masks = poisoner.check_guards(outputs)
                for violation in violations:
                    info["guard_violations"].append({**violation, "run": run})
                for index, (before, after) in masks.items():
                    union = output_oob.setdefault(index, [before, after])
                    union[0], union[1] = union[0] | before, union[1] | after
                save(outputs, f"poison{run}.pt", "a")
                after_call("a", inputs, threads.running)
                for name, value in poisoner.counters.items():
                    counters[name] = counters.get(name, 0) + value
                poisoner.release()
                del model, outputs, inputs, result, early
            continue
        if "model" not in state_of:
            guards = state_of["guards"] = Poisoner(0, key, poison_data=False)
            sentinels.warm_tiles(0, key, device)
            with phase("init"), guards.mode():
                state_of["model"], _ = build_model()
            guards.phase = "forward"
        model, guards, kind = state_of["model"], state_of["guards"], step[0]
        phase_name = "scaled-forward" if kind.startswith("s") else "forward"
        with phase(phase_name):
            with guards.mode():
                if kind == "same":  # inputs B in the first call's buffers (stale output, KD401)
                    inputs = state_of["first_inputs"]
                    for buffer, value in zip(inputs, on_device["b"]):
                        if isinstance(buffer, torch.Tensor) and isinstance(value, torch.Tensor) \
                                and buffer.shape == value.shape:
                            buffer.copy_(value)
                    source = "b"
                else:
                    source = "b" if kind == "fresh" else kind
                    inputs = _to(originals[source], device, torch)
                with _Threads(torch) as threads:
                    result = _call(model, inputs, torch)
                outputs = _outputs(result, torch, device, info)
            if "plain" not in state_of:  # the first call: plain.pt, and the deferred-work watch
                state_of["plain"] = [o.clone() for o in outputs]
                state_of["first_inputs"] = inputs
                save(outputs, "plain.pt", "a")
                info["deferred_wait"] = round(rng.uniform(*DEFERRED_WAIT), 3)
                time.sleep(info["deferred_wait"])
                if device.type == "cuda":
                    torch.cuda.synchronize()
                info["changed_after_return"] = sum(
                    count_where(operator.ne, as_bits(r), as_bits(o))
                    for r, o in zip(state_of["plain"], outputs))
            elif kind == "a":
                _compare_with_first(torch, as_bits, outputs, state_of, info, number + 1, save)
            elif kind in ("fresh", "same"):
                save(outputs, f"{kind}.pt", "b")
            else:
                save(outputs, f"scaled_{kind}.pt")
            after_call(source, inputs, threads.running)
    info["calls"] = number
    if info["own_init_differs"]:
        own_initialisation()
    info.update(counters)
    for index, masks in output_oob.items():
        real_save(masks, os.path.join(out_dir, f"oob{index}.pt"))
    guards = state_of.get("guards")
    if guards is not None:
        violations, _ = guards.check_guards([])
        info["guard_violations"] += [{**v, "run": "unpoisoned"} for v in violations]
    if device.type == "cuda":
        info["gpu_peak_bytes"] = int(torch.cuda.max_memory_reserved(device))
    return info


def use_build_folder(args: dict, out_dir: str) -> None:
    """Extensions and Triton kernels compile into the kernel's build folder (`build_dir`, shared
    with the other jobs of the same kernel text), else into one of this job's own."""
    build = args.get("build_dir") or os.path.join(os.path.dirname(out_dir), "build")
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(build, "torch")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(build, "triton")
    for folder in (os.environ["TORCH_EXTENSIONS_DIR"], os.environ["TRITON_CACHE_DIR"]):
        os.makedirs(folder, exist_ok=True)


def _schedule(rng: random.Random, calls: int, scale_keys: list[str]) -> list[tuple]:
    """The calls on the plain model (first inputs A; then, shuffled, more A calls, fresh and
    same-buffer B calls and the scaled ones) with the poisoned runs at random places."""
    others = ["fresh", "same", *scale_keys]
    rest = others + ["a"] * max(1, calls - 1 - len(others))
    rng.shuffle(rest)
    steps: list[tuple] = [("a",), *((kind,) for kind in rest)]
    # run 0 first and its repeat, run 3, last of the poisoned runs: an output that changes with
    # the number of calls made cannot pass for one that depends on memory (KD102 needs the two
    # to agree)
    middle = [1, 2]
    rng.shuffle(middle)
    places = sorted(rng.sample(range(1, len(steps) + 4), 4))
    for place, run in zip(places, [0, *middle, 3]):
        steps.insert(place, ("poison", run))
    return steps


def _init_state(torch: Any, args: dict) -> tuple[list, dict]:
    """The init inputs and Model's state: handed over in `init.pt`, else from the problem."""
    path = os.path.join(args["in_dir"], "init.pt")
    if os.path.exists(path):
        data = torch.load(path, map_location="cpu", weights_only=True)
        return list(data["init_inputs"]), dict(data["state"])
    with phase("problem-import"):
        problem = import_file("problem", args["problem"])
    with phase("reference-init"):
        torch.manual_seed(int(args["init_seed"]))
        init_inputs = problem.get_init_inputs()
        return init_inputs, problem.Model(*init_inputs).state_dict()


def _identical(torch: Any, outputs: list, others: list) -> bool:
    """Whether two answers hold the same tensors, bit for bit (NaN payloads, both halves of a
    complex number and all)."""
    return len(outputs) == len(others) and all(
        o.shape == t.shape and o.dtype == t.dtype
        and torch.equal(o.reshape(-1).contiguous().view(torch.uint8),
                        t.reshape(-1).contiguous().view(torch.uint8))
        for o, t in zip(outputs, others))


def _changed(inputs: list, originals: list, torch: Any, as_bits: Any) -> bool:
    for now, before in zip(inputs, originals):
        if isinstance(now, torch.Tensor) and isinstance(before, torch.Tensor):
            if now.shape != before.shape or now.dtype != before.dtype or \
                    not torch.equal(as_bits(now), as_bits(before)):
                return True
    return False


def _compare_with_first(torch: Any, as_bits: Any, outputs: list, state_of: dict, info: dict,
                        call: int, save: Any) -> None:
    """An A call whose outputs differ from the first call's: the one differing most is kept."""
    first = state_of["plain"]
    if len(outputs) == len(first) and all(
            o.shape == f.shape and o.dtype == f.dtype and torch.equal(as_bits(o), as_bits(f))
            for o, f in zip(outputs, first)):
        return
    info["differing_calls"] += 1
    distance = _distance(torch, outputs, first)
    if distance >= state_of.get("worst", -1.0):
        state_of["worst"] = distance
        info["worst_call"] = call
        save(outputs, "a_worst.pt")


def _distance(torch: Any, outputs: list, first: list) -> float:
    if len(outputs) != len(first):
        return float("inf")
    worst = 0.0
    for o, f in zip(outputs, first):
        if o.shape != f.shape or o.dtype != f.dtype:
            return float("inf")
        if o.is_floating_point():
            difference = (o.double() - f.double()).abs()
            value = float(difference.max()) if difference.numel() else 0.0
            worst = max(worst, value if value == value else float("inf"))
        elif not torch.equal(o, f):
            worst = float("inf")
    return worst


class _Threads:
    """The Python threads started during a call and still running when it returned, less those
    of torch and triton and idle thread-pool workers: names in `running`."""

    def __init__(self, torch: Any) -> None:
        self.libraries = tuple(os.path.dirname(m.__file__) + os.sep
                               for m in (torch, sys.modules.get("triton")) if m is not None)
        self.started: list[threading.Thread] = []
        self.running: list[str] = []

    def __enter__(self) -> _Threads:
        self.before = set(sys._current_frames())

        def seen(*_: object) -> None:
            self.started.append(threading.current_thread())
            sys.setprofile(None)

        threading.setprofile(seen)
        return self

    def __exit__(self, *exc: object) -> None:
        threading.setprofile(None)
        frames = sys._current_frames()
        alive = {t.ident: t for t in self.started if t.is_alive()}
        for ident in set(frames) - self.before - {threading.get_ident()}:
            alive.setdefault(ident, None)
        for ident, thread in alive.items():
            frame = frames.get(ident)
            if frame is not None and self._exempt(frame):
                continue
            name = thread.name if thread is not None else f"thread {ident}"
            kind = type(thread).__name__ if thread is not None else "_thread"
            self.running.append(f"{name} ({kind})")

    def _exempt(self, frame: Any) -> bool:
        files = []
        while frame is not None:
            files.append((frame.f_code.co_filename, frame.f_code.co_name))
            frame = frame.f_back
        if files and files[0][1] == "_worker" and files[0][0].endswith(
                os.path.join("concurrent", "futures", "thread.py")):
            return True  # an idle pool worker, waiting for work
        own = [f for f, _ in files if not f.endswith(os.sep + "threading.py")]
        return bool(own) and own[-1].startswith(self.libraries)


def _call(model: Any, inputs: list, torch: Any) -> Any:
    with torch.no_grad():
        return model(*inputs)


def _tensors(result: Any, torch: Any, info: dict) -> list:
    """forward's result as a list of plain tensors; a tensor subclass is recorded in
    `info["returned"]` and read as a plain tensor."""
    items = list(result) if isinstance(result, (list, tuple)) and result else [result]
    if not all(isinstance(r, torch.Tensor) for r in items):
        kinds = sorted({type(r).__name__ for r in items})
        raise DeferredOutputError(f"forward returned {type(result).__name__}"
                                  + (f" holding {', '.join(kinds)}" if items != [result] else "")
                                  + ", not a tensor or a sequence of tensors")
    subclasses = sorted({type(r).__name__ for r in items if type(r) is not torch.Tensor})
    if subclasses:
        info["returned"] = ", ".join(subclasses)
    return [r if type(r) is torch.Tensor else r.as_subclass(torch.Tensor) for r in items]


def _outputs(result: Any, torch: Any, device: Any, info: dict) -> list:
    tensors = _tensors(result, torch, info)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return tensors


def _forward(model: Any, inputs: list, torch: Any, device: Any) -> list:
    return _outputs(_call(model, inputs, torch), torch, device, {})


def _ready_cuda(torch: Any, device: Any, args: dict) -> None:
    """The job's share of the GPU, and the BLAS libraries' handles made: a benchmark's process
    has them from the reference it ran first, and a kernel that captures a CUDA graph at its
    first call would otherwise make them inside the capture, which fails (likely what a CUDA-L1
    kernel met on the H200, KD501)."""
    if device.type != "cuda":
        return
    fraction = args.get("gpu_memory_fraction")
    if fraction:
        torch.cuda.set_per_process_memory_fraction(float(fraction))
    square = torch.ones(8, 8, device=device)
    (square @ square).sum().item()  # cuBLAS
    torch.nn.functional.linear(square, square, square[0]).sum().item()  # cuBLASLt (a bias)


def _save(torch: Any, outputs: list, out_dir: str, name: str) -> None:
    torch.save([o.detach().cpu().clone() for o in outputs], os.path.join(out_dir, name))


def _to(values: list, device: Any, torch: Any) -> list:
    return [v.clone().to(device) if isinstance(v, torch.Tensor) else v for v in values]


def _cpu(value: Any, torch: Any) -> Any:
    return value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
