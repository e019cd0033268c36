"""The sizing job: for each problem file, the bytes of its parameters, its inputs and its
outputs, and its forward's floating-point operations, found on torch's meta device (shapes and
dtypes, no memory, no GPU), so that the parent can give a problem's job the share of the GPU,
and a kernel's reference job the temporary disk, it will need before it runs, instead of after
it ran out; and start the longest problems first.

Runs inside a job on the CPU. A problem that cannot be sized (its inputs made from NumPy, a
data-dependent shape, an explicit device) is recorded with its error; its outputs alone may be
unknown (`outputs` None) when only its forward failed on the meta device.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .child import import_file, phase


def size_problems(args: dict, out_dir: str) -> dict:
    import torch

    sizes = {}
    default = torch.get_default_dtype()
    for index, path in enumerate(args["paths"]):
        with phase("size"):
            sizes[path] = _size(torch, f"problem_{index}", path, int(args.get("init_seed", 42)))
        torch.set_default_dtype(default)  # a problem that changed it sizes no other problem
    return {"sizes": sizes}


def _size(torch: Any, name: str, path: str, init_seed: int) -> dict:
    found: dict[str, Any] = {"params": None, "inputs": None, "outputs": None, "twins": None,
                             "init": None, "flops": None, "inputs_changed": None,
                             "error": None}
    try:
        module = import_file(name, path)
        torch.manual_seed(init_seed)
        with torch.device("meta"):
            init_inputs = list(module.get_init_inputs())
            model = module.Model(*init_inputs)
            inputs = list(module.get_inputs())
        found["params"] = _bytes(torch, [*model.parameters(), *model.buffers()])
        found["init"] = _bytes(torch, init_inputs)
        found["inputs"] = _bytes(torch, inputs)
        versions = [v._version for v in inputs if isinstance(v, torch.Tensor)]
        counter = _flop_counter()
        with torch.no_grad(), counter if counter is not None else contextlib.nullcontext():
            result = model(*inputs)
        found["flops"] = int(counter.get_total_flops()) if counter is not None else None
        found["inputs_changed"] = versions != [v._version for v in inputs
                                               if isinstance(v, torch.Tensor)]
        outputs = [v for v in (result if isinstance(result, (list, tuple)) else [result])
                   if isinstance(v, torch.Tensor)]
        found["outputs"] = _bytes(torch, outputs)
        # each output's float64 twin as the reference job saves it (`scaling.twin`)
        found["twins"] = sum(v.numel() * (16 if v.dtype == torch.complex128 else
                                          8 if v.dtype == torch.float64 or v.is_complex() else
                                          4 if v.is_floating_point() else v.element_size())
                             for v in outputs)
    except Exception as exc:  # noqa: BLE001 - an unsized problem runs as before
        found["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return found


def _flop_counter() -> Any:
    """torch's count of forward's floating-point operations (matrix products, convolutions,
    attention; elementwise work counts nothing), from shapes alone: a guess at which problems
    take longest, so that they start first. None where this torch has none."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    return FlopCounterMode(display=False)


def _bytes(torch: Any, values: list) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))
