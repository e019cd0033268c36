"""The sizing job: for each problem file, the bytes of its parameters, its inputs and its
outputs, the most its forward's tensors hold at once (temporaries and outputs), the same of the
problem job's float64 run, and its forward's floating-point operations, found on torch's meta
device (shapes and dtypes, no memory, no GPU), so that the parent can give a problem's job the share of the GPU,
and a kernel's reference job the temporary disk, it will need before it runs, instead of after
it ran out; and start the longest problems first.

Runs inside a job on the CPU. A problem that cannot be sized (its inputs made from NumPy, a
data-dependent shape, an explicit device) is recorded with its error; its outputs alone may be
unknown (`outputs` None) when only its forward failed on the meta device.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import types
import weakref
from typing import Any

from .child import import_file, phase, write_json
from .go import wait_for_go
from .problem_job import float64_copy, to_device

#: the sizes so far, in the job's output folder
SIZES_FILE = "sizes.json"


def size_problems(args: dict, out_dir: str) -> dict:
    import torch

    _compiler_on_demand(torch)

    if args.get("go"):  # started while the parent prepares: a first sizing's cost paid meanwhile
        with phase("warm-up"):
            _warm_up(torch)
        with phase("go"):
            wait_for_go(str(args["go"]))
    sizes: dict[str, dict] = {}
    default = torch.get_default_dtype()
    for index, path in enumerate(args["paths"]):
        with phase("size"):
            sizes[path] = _size(torch, f"problem_{index}", path, int(args.get("init_seed", 42)))
        torch.set_default_dtype(default)  # a problem that changed it sizes no other problem
        # the sizes so far, kept if a later problem hangs or crashes the job
        write_json(os.path.join(out_dir, SIZES_FILE), {"sizes": sizes})
    return {"sizes": sizes}


def _warm_up(torch: Any) -> None:
    """Size a small model, no problem's: what the meta device's first use loads."""
    with torch.device("meta"):
        model, inputs = torch.nn.Linear(2, 2), torch.rand(1, 2)
    counter = _flop_counter()
    with torch.no_grad(), counter if counter is not None else contextlib.nullcontext(), \
            _LiveBytes(torch):
        model(inputs)


def _size(torch: Any, name: str, path: str, init_seed: int) -> dict:
    found: dict[str, Any] = {"params": None, "inputs": None, "outputs": None, "twins": None,
                             "init": None, "flops": None, "forward": None, "params64": None,
                             "inputs64": None, "forward64": None, "inputs_changed": None,
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
        with torch.no_grad(), counter if counter is not None else contextlib.nullcontext(), \
                _LiveBytes(torch) as live:
            result = model(*inputs)
        found["flops"] = int(counter.get_total_flops()) if counter is not None else None
        found["forward"] = live.peak
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
    try:
        found.update(_float64_run(torch, model, inputs))
    except Exception as exc:  # noqa: BLE001 - the problem job's float64 runs are optional too
        found["error"] = f"float64: {type(exc).__name__}: {str(exc)[:300]}"
    return found


def _compiler_on_demand(torch: Any) -> None:
    """Stand a stub in for `torch._dynamo` until something asks it for more than `disable`.
    `torch._disable_dynamo`, which wraps the meta device's Python kernels and every dispatch
    mode's `__torch_dispatch__`, imports torch's compiler at a wrapped function's first call to
    exclude that function from compiling: most of a sizing job's time (1.0 s of 1.2 on two
    cores; 3.5-4.6 s on the H200's host). Nothing compiles here, so the function itself is what
    excluding gives; a problem that compiles asks for more and gets the real compiler."""
    if "torch._dynamo" in sys.modules or not hasattr(torch, "_disable_dynamo"):
        return
    sys.modules["torch._dynamo"] = _CompilerStub("torch._dynamo")


class _CompilerStub(types.ModuleType):
    """`torch._dynamo` while nothing compiles: `disable` gives the function itself; any other
    name loads the real module in its place and is taken from it."""

    @staticmethod
    def disable(fn: Any = None, recursive: bool = True, **_: Any) -> Any:
        return fn if fn is not None else (lambda inner: inner)

    def __getattr__(self, name: str) -> Any:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        import importlib

        return getattr(importlib.import_module(self.__name__), name)


def _float64_run(torch: Any, model: Any, inputs: list) -> dict[str, int]:
    """The bytes of the problem job's float64 run (`problem_job`): of the model's float64 copy,
    of the inputs cast as the job casts them, and the most that forward makes in float64 and
    holds at once (the outputs included), on the meta device."""
    model64, error = float64_copy(model, torch)
    if model64 is None:
        raise RuntimeError(error)
    inputs64 = to_device(inputs, torch.device("meta"), torch.float64, torch)
    with torch.no_grad(), _LiveBytes(torch) as live:
        model64(*inputs64)
    return {"params64": _bytes(torch, [*model64.parameters(), *model64.buffers()]),
            "inputs64": _bytes(torch, inputs64), "forward64": live.peak}


class _LiveBytes:
    """A dispatch mode counting the bytes of the storages forward makes while any tensor holds
    them (views, detached tensors and in-place results share their storage, and keep it alive):
    `peak` is the most alive at once, the outputs included. Storages forward was given (the
    parameters, the inputs) are not counted; what an operator allocates inside its own kernel
    (a workspace, a temporary) is not seen."""

    def __init__(self, torch: Any) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        counter = self
        self.live = self.peak = 0
        #: each storage forward made: [its bytes, the tensors holding it]
        self.storages: dict[int, list[int]] = {}

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                result = func(*args, **(kwargs or {}))
                given = {v.untyped_storage()._cdata for v in tree_leaves((args, kwargs))
                         if isinstance(v, torch.Tensor)}
                for value in tree_leaves(result):
                    if isinstance(value, torch.Tensor):
                        counter.holds(value, given)
                if func is torch.ops.aten.convolution.default:  # its buffer, beside its output
                    counter.peak = max(counter.peak,
                                       counter.live + _unfolded_bytes(torch, args, result))
                return result

        self.mode = Mode()

    def holds(self, tensor: Any, given: set[int]) -> None:
        """`tensor`, a result, holds its storage until it is collected: a new storage is
        counted, a given one not (unless forward made it); one resized in place is counted at
        its new size."""
        storage = tensor.untyped_storage()
        key, size = storage._cdata, storage.nbytes()
        entry = self.storages.get(key)
        if entry is None:
            if key in given:
                return
            entry = self.storages[key] = [0, 0]
        self.live += size - entry[0]
        self.peak = max(self.peak, self.live)
        entry[0] = size
        entry[1] += 1
        weakref.finalize(tensor, self.released, key)

    def released(self, key: int) -> None:
        entry = self.storages[key]
        entry[1] -= 1
        if not entry[1]:
            self.live -= entry[0]
            del self.storages[key]

    def __enter__(self) -> _LiveBytes:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)


def _unfolded_bytes(torch: Any, args: tuple, output: Any) -> int:
    """What torch's own convolution kernels, which the float64 runs use (cuDNN off:
    `problem_job.float64_kernels`), hold besides the output of a float64 convolution: its
    input unfolded, one sample and one group at a time, into (C / groups x kernel) rows over
    the input's positions (transposed) or the output's; plus, when grouped, each group's input
    and output apart. Depthwise convolutions unfold nothing, nor plain 1x1 ones in 1 and 2
    dimensions (undilated, unstrided, unpadded; 3D ones always unfold). On the H200 a 3D
    transposed convolution held 14.7 GiB in float64 where its output takes 2.3: 10 GiB of it
    unfolded."""
    x, weight, _bias, stride, padding, dilation, transposed, _extra, groups = args[:9]
    if x.dtype != torch.float64 or weight.dim() < 3:
        return 0
    depthwise = not transposed and groups == x.shape[1] and weight.shape[1] == 1
    pointwise = not transposed and x.dim() < 5 and all(k == 1 for k in weight.shape[2:]) and \
        all(s == 1 for s in stride) and all(d == 1 for d in dilation) and not any(padding)
    if depthwise or pointwise:
        return 0
    rows = weight.shape[1] * math.prod(weight.shape[2:])
    positions = math.prod((x if transposed else output).shape[2:])
    apart = x.numel() // groups + output.numel() if groups > 1 else 0
    return (rows * positions + apart) * x.element_size()


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
