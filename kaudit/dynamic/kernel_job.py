"""The child side of `kaudit scan --dynamic`: two jobs, each run in its own
`kaudit.dynamic.child` process, never in the kaudit process.

`run_reference` imports the problem, builds `Model(*get_init_inputs())` under the init seed and, for
two input seeds, saves the inputs `get_inputs()` gives (`inputs_a.pt`, `inputs_b.pt`, before forward
runs) and the reference outputs (`ref_a.pt`, `ref_b.pt`).

`run_candidate` never sees a reference output: it gets only a folder holding copies of the input
files. It imports the problem (for `Model` and `get_init_inputs`, as a harness does) and the kernel
file, builds `ModelNew` under the same init seed and copies into it the entries of `Model`'s
`state_dict` whose names and shapes match. Then:

- four poisoned runs (`poison0.pt` .. `poison3.pt`): construction and forward on inputs A inside a
  `TorchDispatchMode` that fills every tensor returned by an allocation op (`empty`, `empty_like`,
  `empty_strided`, `new_empty`, `new_empty_strided`, `empty_permuted`, any overload) with the run's
  sentinel (`kaudit.dynamic.sentinels`); run 3 repeats run 0's sentinel;
- a plain run without poisoning (`plain.pt`), after which the inputs are saved again
  (`inputs_after.pt`) for the input-mutation probe;
- with the same model, a call on inputs B in fresh buffers (`fresh.pt`), then a call on inputs B
  copied into the buffers of the plain run's inputs (`same.pt`), for the stale-output probe.

What the poisoning reaches: every allocation that goes through the PyTorch dispatcher while the
mode is active on the calling thread: `torch.empty*` from Python, and `at::empty*` /
`torch::empty*` called from C++ extensions (`load_inline`) on that thread, on CPU and CUDA. What it
does not reach: memory a kernel obtains without the dispatcher (`malloc`, `new[]`, `cudaMalloc`,
`cudaMallocAsync`, a Triton or CUDA kernel's scratch space), outputs allocated inside an ATen
operator's own implementation (they are written by that operator), allocations on other threads
(the mode is thread-local) and tensors created before the mode was entered (module-level buffers
allocated at import time).
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

ALLOCATION_OPS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                  "empty_permuted")


def run_reference(args: dict, out_dir: str) -> dict:
    import torch

    _out_dir[:] = [out_dir]
    device = torch.device(args.get("device", "cpu"))
    with phase("problem-import"):
        problem = import_file("kaudit_problem", args["problem"])
    with phase("reference-init"):
        torch.manual_seed(int(args["init_seed"]))
        model = problem.Model(*problem.get_init_inputs()).to(device)
    shapes = {}
    for name, seed in (("a", args["seeds"][0]), ("b", args["seeds"][1])):
        with phase("inputs"):
            torch.manual_seed(int(seed))
            inputs = list(problem.get_inputs())
            torch.save([_cpu(v, torch) for v in inputs], os.path.join(out_dir, f"inputs_{name}.pt"))
        with phase("reference-forward"):
            outputs = _forward(model, _to(inputs, device, torch), torch, device)
            torch.save([o.detach().cpu() for o in outputs], os.path.join(out_dir, f"ref_{name}.pt"))
            shapes[name] = [list(o.shape) for o in outputs]
    return {"shapes": shapes, "torch": torch.__version__}


def run_candidate(args: dict, out_dir: str) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from kaudit.dynamic import sentinels

    _out_dir[:] = [out_dir]
    # a build folder of this job's own, unless the parent names a shared cache
    build = args.get("extensions_dir") or os.path.join(os.environ.get("TMPDIR", out_dir),
                                                       "torch_extensions")
    os.makedirs(build, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = build
    device = torch.device(args.get("device", "cpu"))
    init_seed = int(args["init_seed"])
    inputs_dir = args["inputs_dir"]
    inputs_a, inputs_b = (torch.load(os.path.join(inputs_dir, f"inputs_{name}.pt"),
                                     map_location="cpu", weights_only=True) for name in "ab")
    with phase("problem-import"):
        problem = import_file("kaudit_problem", args["problem"])
    with phase("reference-init"):
        torch.manual_seed(init_seed)
        state = problem.Model(*problem.get_init_inputs()).state_dict()
    with phase("import"):  # load_inline compiles here
        kernel = import_file("kaudit_kernel", args["kernel"])
        if not isinstance(getattr(kernel, "ModelNew", None), type):
            raise ImportError("the kernel file defines no class ModelNew")

    allocation_ops = {getattr(torch.ops.aten, name) for name in ALLOCATION_OPS
                      if hasattr(torch.ops.aten, name)}
    counters = {"allocations": 0, "poisoned": 0, "poisoned_bytes": 0}

    class Poison(TorchDispatchMode):
        def __init__(self, run: int) -> None:
            super().__init__()
            self.run = run

        def __torch_dispatch__(self, func, types, args_=(), kwargs=None):
            result = func(*args_, **(kwargs or {}))
            if func.overloadpacket in allocation_ops and isinstance(result, torch.Tensor):
                counters["allocations"] += 1
                if sentinels.fill(result, self.run):
                    counters["poisoned"] += 1
                    counters["poisoned_bytes"] += result.numel() * result.element_size()
            return result

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
        torch.save([o.detach().cpu().clone() for o in outputs], os.path.join(out_dir, name))

    info: dict[str, Any] = {}
    for run in range(sentinels.RUNS):
        with phase("init"), Poison(run):
            model, info["state_matched"] = build()
        with phase("forward"):
            inputs = _to(inputs_a, device, torch)
            with Poison(run):
                outputs = _forward(model, inputs, torch, device)
            save(outputs, f"poison{run}.pt")
            del model, outputs, inputs
    info.update(counters)
    with phase("init"):
        model, _ = build()
    with phase("forward"):
        first = _to(inputs_a, device, torch)
        save(_forward(model, first, torch, device), "plain.pt")
        torch.save([_cpu(v, torch) for v in first], os.path.join(out_dir, "inputs_after.pt"))
        save(_forward(model, _to(inputs_b, device, torch), torch, device), "fresh.pt")
        for buffer, value in zip(first, inputs_b):
            if isinstance(buffer, torch.Tensor) and isinstance(value, torch.Tensor) \
                    and buffer.shape == value.shape:
                buffer.copy_(value)
        save(_forward(model, first, torch, device), "same.pt")
    return info


class OutputTypeError(TypeError):
    """forward returned something other than tensors."""


def _forward(model: Any, inputs: list, torch: Any, device: Any) -> list:
    with torch.no_grad():
        result = model(*inputs)
    if device.type == "cuda":
        torch.cuda.synchronize()
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (list, tuple)) and result and \
            all(isinstance(r, torch.Tensor) for r in result):
        return list(result)
    raise OutputTypeError(f"forward returned {type(result).__name__}, not a tensor "
                          "or a sequence of tensors")


def _to(values: list, device: Any, torch: Any) -> list:
    return [v.clone().to(device) if isinstance(v, torch.Tensor) else v for v in values]


def _cpu(value: Any, torch: Any) -> Any:
    return value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value


