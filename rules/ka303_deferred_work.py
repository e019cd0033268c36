import ast
from collections.abc import Iterable, Iterator

from kaudit.findings import Finding, Level, Precision
from kaudit.forward import ForwardAnalysis, methods_of, walk_code
from kaudit.integrity import first_line, word_set
from kaudit.python_scope import dotted_parts
from kaudit.rule import Rule
from kaudit.source import FunctionNode, SourceModel

DEFERRING_PREFIXES = ("threading.", "_thread.", "concurrent.futures.", "asyncio.",
                      "multiprocessing.", "torch.multiprocessing.")
# names from those modules that run nothing elsewhere: locks, thread-local storage, queries
HARMLESS = frozenset({
    "threading.Lock", "threading.RLock", "threading.local", "threading.get_ident",
    "threading.get_native_id", "threading.current_thread", "threading.main_thread",
    "threading.active_count", "threading.enumerate", "_thread.allocate_lock", "_thread.get_ident",
    "multiprocessing.cpu_count", "torch.multiprocessing.cpu_count",
})
SUBCLASS_FACTORIES = ("_make_subclass", "_make_wrapper_subclass")
TENSOR_BASES = ("torch.Tensor", "torch._C._TensorBase", "torch._C.TensorBase")
TORCH_HOOKS = ("__torch_function__", "__torch_dispatch__")
# words one of which a file must contain to reach the names above (module names are imported)
_MODULE_WORDS = frozenset({"threading", "_thread", "concurrent", "asyncio", "multiprocessing"})
_FACTORY_WORDS = frozenset({*SUBCLASS_FACTORIES, "as_subclass"})


class DeferredWork(Rule):
    """The forward path hands its work to a thread, a process, an event loop or a lazy tensor.

    ## What it does
    On `ModelNew.forward` and the helpers it reaches, reports uses of `threading`,
    `concurrent.futures`, `asyncio`, `multiprocessing` (and `torch.multiprocessing`): calls of
    their functions and classes under any alias, and method calls on an executor, thread or pool
    stored in `self.<attr>` or a module-level name (`self.pool.submit(...)`). Locks, thread-local
    storage and `cpu_count` are not reported. Also reports an `async def` forward, and a forward
    path that builds a tensor subclass defined in the file (a class deriving from `torch.Tensor`
    or defining `__torch_function__`/`__torch_dispatch__`), calls `torch.Tensor._make_subclass` /
    `_make_wrapper_subclass`, or turns its output into such a class with `.as_subclass(...)`.
    One finding per function, at the first use.

    ## Why is this bad?
    `forward` returns before the work is done: a thread or process computes the result while the
    harness's timer has already stopped, and a tensor subclass can compute lazily when the
    harness first reads it (inside `torch.allclose`, outside the timed region).

    ## Example
    ```python
    from concurrent.futures import ThreadPoolExecutor

    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.pool = ThreadPoolExecutor(max_workers=1)

        def forward(self, x):
            out = torch.empty_like(x)
            self.pool.submit(ext.relu_into, x, out)
            return out
    ```
    """

    code = "KA303"
    name = "deferred-work"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("integrity", "timing", "concurrency")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        analysis = ForwardAnalysis.of(model)
        if not analysis.reachable:
            return
        words = word_set(model)
        deferring = bool(_MODULE_WORDS & words)
        holders = self._deferring_holders(model) if deferring else {}
        subclasses = self._tensor_subclasses(model)
        look = deferring or bool(subclasses) or bool(_FACTORY_WORDS & words)
        for function in analysis.reachable:
            if isinstance(function, ast.AsyncFunctionDef):
                yield self.report(
                    model, model.header_location(function),
                    f"`{function.name}` on the forward path is `async def`: calling it returns a "
                    "coroutine and its work runs whenever an event loop gets to it")
                continue
            if not look:
                continue
            uses = list(self._uses(model, function, holders, subclasses))
            if uses:
                node, what = uses[0]
                more = f" (and {len(uses) - 1} more use(s) in `{function.name}`)" \
                    if len(uses) > 1 else ""
                yield self.report(model, node, f"{what}{more}")

    def _uses(self, model: SourceModel, function: FunctionNode, holders: dict[str, str],
              subclasses: dict[str, str]) -> Iterator[tuple[ast.AST, str]]:
        place = f"`{function.name}` (on the forward path)"
        for node in walk_code(function.body):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            resolved = model.bindings.resolve(func) or ""
            if resolved.startswith(DEFERRING_PREFIXES) and resolved not in HARMLESS:
                yield node, (f"{place} calls `{resolved}`: work handed to a thread, process or "
                             "event loop can finish after `forward` returns and the timer stops")
                continue
            parts = dotted_parts(func)
            if parts and len(parts) >= 2:
                holder = ".".join(parts[:-1])
                if holder in holders:
                    yield node, (f"{place} calls `{'.'.join(parts)}` on `{holder}` (made by "
                                 f"`{holders[holder]}`): work handed to it can finish after "
                                 "`forward` returns and the timer stops")
                    continue
            written = ".".join(parts) if parts else ""
            short = parts[-1] if parts else ""
            if short in SUBCLASS_FACTORIES:
                yield node, (f"{place} builds a tensor subclass with `{written}`: its "
                             "operations can run lazily when the harness reads the output")
            elif parts and len(parts) in (1, 2) and parts[0] in subclasses \
                    and (len(parts) == 1 or parts[1] == "__new__"):
                yield node, (f"{place} builds `{parts[0]}`, a tensor class of this file that "
                             f"{subclasses[parts[0]]}: its work can run lazily when the harness "
                             "reads the output, outside the timed region")
            elif short == "as_subclass" and node.args:
                target = dotted_parts(node.args[0])
                if target and target[-1] in subclasses:
                    yield node, (f"{place} turns a tensor into `{target[-1]}` with "
                                 f"`{first_line(model, node, 40)}`, a tensor class of this file "
                                 f"that {subclasses[target[-1]]}: its work can run lazily, "
                                 "outside the timed region")

    @staticmethod
    def _deferring_holders(model: SourceModel) -> dict[str, str]:
        """`self.pool` / `POOL` -> "concurrent.futures.ThreadPoolExecutor" when assigned one."""
        holders: dict[str, str] = {}
        for name, assigned in model.bindings.assignments.items():
            for _op, value in assigned:
                resolved = _deferring_call(model, value)
                if resolved:
                    holders[name] = resolved
        for cls in model.classes.values():
            for node in walk_code(cls.body):
                if isinstance(node, ast.Assign):
                    resolved = _deferring_call(model, node.value)
                    if not resolved:
                        continue
                    for target in node.targets:
                        parts = dotted_parts(target)
                        if parts and len(parts) == 2 and parts[0] == "self":
                            holders[".".join(parts)] = resolved
        return holders

    @staticmethod
    def _tensor_subclasses(model: SourceModel) -> dict[str, str]:
        found: dict[str, str] = {}
        for name, cls in model.classes.items():
            hooks = [h for h in TORCH_HOOKS if h in methods_of(cls)]
            if hooks:
                found[name] = f"defines `{hooks[0]}`"
            elif any(model.bindings.resolve(base) in TENSOR_BASES for base in cls.bases):
                found[name] = "subclasses `torch.Tensor`"
        return found


def _deferring_call(model: SourceModel, value: ast.AST) -> str | None:
    if not isinstance(value, ast.Call):
        return None
    resolved = model.bindings.resolve(value.func) or ""
    if resolved.startswith(DEFERRING_PREFIXES) and resolved not in HARMLESS:
        return resolved
    return None
