"""Tamper checks inside the candidate job: what the harness relies on, recorded before the kernel
is imported and compared after every call.

`Watch(torch)` records the identity (and, for Python functions, the code, defaults and globals
binding) of: the harness's own module-level functions and classes, as `sys.modules` holds them;
`torch.save`/`torch.load` and the serialisation and pickling functions behind them; the tensor
methods and torch functions the harness calls; `threading.Thread.start` and the profile/trace
hooks; the builtins it uses; `__import__`. `changes()` lists what differs now, and what is wrong
with PyTorch's mode stacks (a dispatch or function mode left pushed by the kernel sees, and can
rewrite, every operation the harness makes). A kernel that rebinds any of these (in
`sys.modules`, through `setattr`, by replacing a function's `__code__`) is reported as KD405, even
when the harness, which calls the references it captured first, was not fooled. torch rebinds a
few of its own functions when a submodule loads (`torch._dynamo` wraps `torch.manual_seed`): a
replacement defined in torch's own files that wraps (`__wrapped__`) the recorded object is
accepted, and recorded in its place.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle
import sys
import threading
import types
from typing import Any

TENSOR_METHODS = ("clone", "detach", "cpu", "to", "copy_", "view", "contiguous", "reshape",
                  "numel", "element_size", "untyped_storage", "data_ptr", "equal", "ne", "eq",
                  "sum", "any", "all", "abs", "max", "double", "float", "is_floating_point",
                  "fill_", "as_subclass", "nonzero", "expand", "__eq__", "__ne__", "__getitem__",
                  "__setitem__", "__torch_function__", "__reduce_ex__", "storage_offset",
                  "stride", "size", "dim", "tolist", "item", "is_contiguous")
TORCH_FUNCTIONS = ("save", "load", "equal", "isin", "empty", "empty_like", "zeros", "cat",
                   "manual_seed", "no_grad", "as_strided", "tensor")
CUDA_FUNCTIONS = ("synchronize", "set_per_process_memory_fraction", "memory_snapshot")
BUILTINS = ("__import__", "open", "isinstance", "len", "getattr", "setattr", "hasattr", "iter",
            "next", "list", "dict", "tuple", "type", "id", "sorted", "zip", "range", "min", "max",
            "sum", "int", "float", "str", "any", "all", "enumerate", "print", "super")
OTHER = ((json, ("dumps", "dump", "loads")), (os, ("replace", "open", "write", "fsync", "_exit",
                                                   "lseek", "ftruncate", "makedirs")),
         (pickle, ("Pickler", "Unpickler", "dump", "dumps", "load")),
         (threading, ("Thread", "Timer", "enumerate", "setprofile", "settrace")))


def _fingerprint(value: Any) -> tuple:
    """What identifies a callable: the object, and for Python functions their code and defaults."""
    function = getattr(value, "__func__", value)
    if isinstance(function, types.FunctionType):
        return (id(function), id(function.__code__), id(function.__defaults__),
                id(function.__kwdefaults__), id(function.__globals__))
    return (id(value),)


class Watch:
    """`allowed`: names (as listed by `changes`) and the harness's own replacements they may hold
    (the poisoning's wrapper of `Thread.start`, left in place while a thread it started runs)."""

    def __init__(self, torch: Any, package: str, allowed: dict[str, tuple] | None = None) -> None:
        self.torch, self.package = torch, package
        self.allowed = {name: {id(v) for v in values} for name, values in (allowed or {}).items()}
        self.library = os.path.dirname(torch.__file__) + os.sep
        # (where, fingerprint, the object itself: kept, so that its id cannot be reused)
        self.recorded = [(where, _fingerprint(value), value)
                         for where in self._targets() for value in [self._resolve(where)]]

    def _targets(self) -> list[tuple[str, Any, str]]:
        torch = self.torch
        targets = [(f"torch.{n}", torch, n) for n in TORCH_FUNCTIONS]
        targets += [(f"torch.Tensor.{n}", torch.Tensor, n) for n in TENSOR_METHODS]
        targets += [(f"torch.cuda.{n}", torch.cuda, n) for n in CUDA_FUNCTIONS]
        serialization = sys.modules.get("torch.serialization")
        if serialization is not None:
            targets += [(f"torch.serialization.{n}", serialization, n)
                        for n in ("save", "load", "_save", "_open_zipfile_writer",
                                  "_open_file_like", "DEFAULT_PROTOCOL")]
        targets += [(f"builtins.{n}", builtins, n) for n in BUILTINS]
        targets += [(f"{module.__name__}.{n}", module, n) for module, names in OTHER
                    for n in names]
        targets += [("threading.Thread.start", threading.Thread, "start"),
                    ("threading.Thread.run", threading.Thread, "run"),
                    ("torch.nn.Module.__call__", torch.nn.Module, "__call__")]
        for name, module in sorted(sys.modules.items()):
            if name == self.package or name.startswith(self.package + "."):
                targets.append((f"sys.modules[{name!r}]", sys.modules, name))
                for attribute, value in sorted(vars(module).items()):
                    if isinstance(value, (types.FunctionType, type)) and \
                            getattr(value, "__module__", None) == name:
                        targets.append((f"{name}.{attribute}", module, attribute))
        return targets

    def _torch_wrapper(self, now: Any, original: Any) -> bool:
        """torch's own wrapper around the recorded object (see the module docstring)."""
        code = getattr(getattr(now, "__func__", now), "__code__", None)
        if code is None or not code.co_filename.startswith(self.library):
            return False
        inner = getattr(now, "__wrapped__", None)
        for _ in range(8):
            if inner is original:
                return True
            inner = getattr(inner, "__wrapped__", None)
        return False

    @staticmethod
    def _resolve(where: tuple[str, Any, str]) -> Any:
        _, owner, name = where
        if owner is sys.modules:
            return sys.modules.get(name)
        return getattr(owner, name, None)

    def changes(self) -> list[str]:
        """What differs from the record, and what is wrong with the mode stacks and hooks."""
        found = []
        for index, (where, fingerprint, original) in enumerate(self.recorded):
            now = self._resolve(where)
            if _fingerprint(now) == fingerprint:
                continue
            if self._torch_wrapper(now, original):
                self.recorded[index] = (where, _fingerprint(now), now)
                continue
            if id(now) in self.allowed.get(where[0], ()):
                continue
            found.append(where[0])
        torch = self.torch
        if torch._C._len_torch_dispatch_stack() != 0:
            found.append("the dispatch mode stack (a mode left pushed)")
        if torch._C._len_torch_function_stack() != 0:
            found.append("the torch function mode stack (a mode left pushed)")
        if sys.getprofile() is not None or sys.gettrace() is not None:
            found.append("sys.setprofile/settrace hooks")
        if threading.gettrace() is not None:
            found.append("threading.settrace hook")
        return found
