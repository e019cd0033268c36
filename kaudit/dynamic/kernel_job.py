"""The child side of `kaudit scan --dynamic`: two jobs, each run in its own
`kaudit.dynamic.child` process, never in the kaudit process.

`run_reference` imports the problem, builds `Model(*get_init_inputs())` under the init seed and, for
two input seeds, saves the inputs `get_inputs()` gives (`inputs_a.pt`, `inputs_b.pt`, before forward
runs) and the reference outputs (`ref_a.pt`, `ref_b.pt`).

`run_reference` also saves, for each input scale other than 1 (`scales`, KD301), the first seed's
inputs with their floating tensors multiplied by the scale (`inputs_s<k>.pt`), the reference output
on them (`ref_s<k>.pt`) and a float64 copy of the reference model's output (`ref64_s<k>.pt`).

`run_candidate` never sees a reference output: it gets only a folder holding copies of the input
files. It imports the problem (for `Model` and `get_init_inputs`, as a harness does) and the kernel
file, builds `ModelNew` under the same init seed and copies into it the entries of `Model`'s
`state_dict` whose names and shapes match. Then:

- four poisoned runs (`poison0.pt` .. `poison3.pt`): construction and forward on inputs A under
  `kaudit.dynamic.poison` (sentinel-filled allocations with guard zones, KD101-KD103; on CUDA
  also the caching allocator's free blocks, filled through cuda-python); run 3
  repeats run 0's sentinel. On CUDA each run also copies the outputs on the current stream right
  after forward returns, before any device synchronise, and counts elements that differ from the
  outputs after the synchronise (KD403: work left on another stream);
- a plain run without poisoning (`plain.pt`), after which the inputs are saved again
  (`inputs_after.pt`, KD402); the outputs are compared again after `DEFERRED_WAIT` seconds, and
  threads the kernel module started in forward that are still alive are listed (KD404);
- with the same model, a call on inputs B in fresh buffers (`fresh.pt`), then a call on inputs B
  copied into the buffers of the plain run's inputs (`same.pt`), for the stale-output probe;
- a call on each scaled input (`scaled_s<k>.pt`, KD301).

Forward must return a plain tensor or a sequence of them: a tensor subclass is recorded (KD404) and
read as a plain tensor; anything else raises `DeferredOutputError` (KD404).
On CUDA, `gpu_memory_fraction` caps the caching allocator of both jobs
(`torch.cuda.set_per_process_memory_fraction`; memory an extension takes with `cudaMalloc` is
not capped).
"""

from __future__ import annotations

import os
from typing import Any

from kaudit.dynamic.child import import_file
from kaudit.dynamic.child import phase as _phase

#: the last phase a job entered, for a parent whose child timed out or crashed
PHASE_FILE = "phase.txt"
_out_dir: list[str] = []


def phase(name: str):
    """`child.phase`, also recorded in the output folder's PHASE_FILE."""
    if _out_dir:
        with open(os.path.join(_out_dir[0], PHASE_FILE), "w", encoding="utf-8") as handle:
            handle.write(name)
    return _phase(name)


#: seconds forward's outputs are watched after it returned (KD404)
DEFERRED_WAIT = 0.1


def run_reference(args: dict, out_dir: str) -> dict:
    import torch

    from kaudit.dynamic.problem_job import float64_copy, scale_input

    _out_dir[:] = [out_dir]
    device = torch.device(args.get("device", "cpu"))
    _cap_gpu_memory(torch, device, args)
    with phase("problem-import"):
        problem = import_file("kaudit_problem", args["problem"])
    with phase("reference-init"):
        torch.manual_seed(int(args["init_seed"]))
        model = problem.Model(*problem.get_init_inputs()).to(device)
    shapes = {}
    first: list = []
    for name, seed in (("a", args["seeds"][0]), ("b", args["seeds"][1])):
        with phase("inputs"):
            torch.manual_seed(int(seed))
            inputs = [_cpu(v, torch) for v in problem.get_inputs()]
            torch.save(inputs, os.path.join(out_dir, f"inputs_{name}.pt"))
            first = first or inputs
        with phase("reference-forward"):
            outputs = _forward(model, _to(inputs, device, torch), torch, device)
            _save(torch, outputs, out_dir, f"ref_{name}.pt")
            shapes[name] = [list(o.shape) for o in outputs]
    scales: dict[str, Any] = {}
    reference64 = None
    for index, factor in enumerate(args.get("scales", [])):
        key = f"s{index}"
        with phase("scaled-reference"):
            scaled = [scale_input(v, factor, torch) for v in first]
            torch.save(scaled, os.path.join(out_dir, f"inputs_{key}.pt"))
            _save(torch, _forward(model, _to(scaled, device, torch), torch, device), out_dir,
                  f"ref_{key}.pt")
        try:
            if reference64 is None:
                reference64, error = float64_copy(model, torch)
                if error:
                    raise RuntimeError(error)
            wide = [v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                    for v in scaled]
            _save(torch, _forward(reference64, _to(wide, device, torch), torch, device), out_dir,
                  f"ref64_{key}.pt")
            scales[key] = {"scale": factor, "fp64": True}
        except Exception as exc:  # noqa: BLE001 - without float64, conditioning is unknown
            scales[key] = {"scale": factor, "fp64": False,
                           "fp64_error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"shapes": shapes, "scales": scales, "torch": torch.__version__}


def run_candidate(args: dict, out_dir: str) -> dict:
    import threading
    import time

    import torch

    from kaudit.dynamic import sentinels
    from kaudit.dynamic.poison import Poisoner, poison_free_cuda_memory, warm_cuda_cache

    _out_dir[:] = [out_dir]
    # a build folder of this job's own, unless the parent names a shared cache
    build = args.get("extensions_dir") or os.path.join(os.environ.get("TMPDIR", out_dir),
                                                       "torch_extensions")
    os.makedirs(build, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = build
    device = torch.device(args.get("device", "cpu"))
    _cap_gpu_memory(torch, device, args)
    init_seed = int(args["init_seed"])
    inputs_dir = args["inputs_dir"]

    def load_inputs(name: str) -> list:
        return torch.load(os.path.join(inputs_dir, f"inputs_{name}.pt"), map_location="cpu",
                          weights_only=True)

    inputs_a, inputs_b = load_inputs("a"), load_inputs("b")
    with phase("problem-import"):
        problem = import_file("kaudit_problem", args["problem"])
    with phase("reference-init"):
        torch.manual_seed(init_seed)
        state = problem.Model(*problem.get_init_inputs()).state_dict()
    with phase("import"):  # load_inline compiles here
        kernel = import_file("kaudit_kernel", args["kernel"])
        if not isinstance(getattr(kernel, "ModelNew", None), type):
            raise ImportError("the kernel file defines no class ModelNew")

    def build() -> Any:
        torch.manual_seed(init_seed)
        model = kernel.ModelNew(*problem.get_init_inputs())
        own = model.state_dict()
        matched = {k: v for k, v in state.items()
                   if k in own and getattr(own[k], "shape", None) == getattr(v, "shape", None)}
        if matched:
            model.load_state_dict(matched, strict=False)
        return model.to(device), len(matched)

    def save(outputs: list, name: str) -> None:
        _save(torch, outputs, out_dir, name)

    info: dict[str, Any] = {"returned": None, "guard_violations": [], "side_stream": [],
                            "changed_after_return": 0, "lingering_threads": []}
    counters: dict[str, int] = {}
    output_oob: dict[int, list] = {}
    if device.type == "cuda":
        warm_cuda_cache(device)
    for run in range(sentinels.RUNS):
        poisoner = Poisoner(run)
        with phase("init"), poisoner.mode():
            model, info["state_matched"] = build()
        with phase("forward"):
            inputs = _to(inputs_a, device, torch)
            if device.type == "cuda":
                info["free_memory_poisoned"] = poison_free_cuda_memory(run)
            poisoner.phase = "forward"
            with poisoner.mode():
                result = _call(model, inputs, torch)
            # copied on the current stream before any device synchronise (KD403)
            early = [o.clone() for o in _tensors(result, torch, info)] \
                if device.type == "cuda" else None
            outputs = _outputs(result, torch, device, info)
            if early is not None:
                differing = sum(int((sentinels.as_bits(e) != sentinels.as_bits(o)).sum())
                                for e, o in zip(early, outputs))
                info["side_stream"].append(differing)
            violations, masks = poisoner.check_guards(outputs)
            for violation in violations:
                info["guard_violations"].append({**violation, "run": run})
            for index, (before, after) in masks.items():
                union = output_oob.setdefault(index, [before, after])
                union[0], union[1] = union[0] | before, union[1] | after
            save(outputs, f"poison{run}.pt")
            for key, value in poisoner.counters.items():
                counters[key] = counters.get(key, 0) + value
            poisoner.release()
            del model, outputs, inputs, result, early
    info.update(counters)
    for index, masks in output_oob.items():
        torch.save(masks, os.path.join(out_dir, f"oob{index}.pt"))
    guards = Poisoner(0, poison_data=False)
    with phase("init"), guards.mode():
        model, _ = build()
    guards.phase = "forward"
    with phase("forward"), guards.mode():
        first = _to(inputs_a, device, torch)
        threads = set(threading.enumerate())
        outputs = _outputs(_call(model, first, torch), torch, device, info)
        save(outputs, "plain.pt")
        returned = [o.clone() for o in outputs]
        time.sleep(DEFERRED_WAIT)
        if device.type == "cuda":
            torch.cuda.synchronize()
        info["changed_after_return"] = sum(
            int((sentinels.as_bits(r) != sentinels.as_bits(o)).sum())
            for r, o in zip(returned, outputs))
        info["lingering_threads"] = [t.name for t in threading.enumerate()
                                     if t not in threads and t.is_alive() and _started_by(t, kernel)]
        torch.save([_cpu(v, torch) for v in first], os.path.join(out_dir, "inputs_after.pt"))
        save(_forward(model, _to(inputs_b, device, torch), torch, device), "fresh.pt")
        for buffer, value in zip(first, inputs_b):
            if isinstance(buffer, torch.Tensor) and isinstance(value, torch.Tensor) \
                    and buffer.shape == value.shape:
                buffer.copy_(value)
        save(_forward(model, first, torch, device), "same.pt")
    for index in range(len(args.get("scales", []))):
        with phase("scaled-forward"), guards.mode():
            scaled = _to(load_inputs(f"s{index}"), device, torch)
            save(_forward(model, scaled, torch, device), f"scaled_s{index}.pt")
    violations, _ = guards.check_guards([])
    info["guard_violations"] += [{**violation, "run": "unpoisoned"} for violation in violations]
    return info


class DeferredOutputError(TypeError):
    """forward returned something other than tensors (KD404)."""


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


def _started_by(thread: Any, module: Any) -> bool:
    """Whether a thread runs code from the kernel module (its target or its Thread subclass)."""
    target = getattr(thread, "_target", None)
    code_owner = target if target is not None else type(thread)
    return getattr(code_owner, "__module__", None) == module.__name__


def _cap_gpu_memory(torch: Any, device: Any, args: dict) -> None:
    fraction = args.get("gpu_memory_fraction")
    if device.type == "cuda" and fraction:
        torch.cuda.set_per_process_memory_fraction(float(fraction))


def _save(torch: Any, outputs: list, out_dir: str, name: str) -> None:
    torch.save([o.detach().cpu().clone() for o in outputs], os.path.join(out_dir, name))


def _to(values: list, device: Any, torch: Any) -> list:
    return [v.clone().to(device) if isinstance(v, torch.Tensor) else v for v in values]


def _cpu(value: Any, torch: Any) -> Any:
    return value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
