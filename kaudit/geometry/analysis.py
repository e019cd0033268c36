"""Every kernel launch of a file with its grid, block, the launched kernel's facts and the host
context around it: what the KA2xx rules query. `GeometryAnalysis.of(model)` builds it once per
file; `launches(model)` is the iterator the rules share.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kaudit.cpp import CppFunction, CppIndex, KernelLaunch
from kaudit.findings import Finding, Location
from kaudit.geometry.algebra import (
    DimClass,
    Expr,
    classify_dim,
    equal,
    evaluate,
    is_multiple,
    substitute,
    sym,
)
from kaudit.geometry.cpp_host import CppHost, CScope, Node
from kaudit.geometry.kernels import cuda_kernel_facts, triton_kernel_facts
from kaudit.geometry.python_host import PyScope, PythonHost
from kaudit.geometry.vocabulary import AXIS_NAMES, Dims, KernelFacts, Precondition, Store, axes_of
from kaudit.rule import Rule
from kaudit.source import CudaUnit, SourceModel, TritonKernel, TritonLaunch, walk_tree

_CHECK_CALLS = frozenset({"TORCH_CHECK", "AT_ASSERT", "TORCH_INTERNAL_ASSERT", "assert", "AT_CHECK",
                          "CHECK", "TORCH_CHECK_EQ", "AT_ASSERTM", "static_assert", "CHECK_EQ"})
INDIRECT_LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchCooperativeKernel", "cuLaunchKernel",
                               "cudaLaunchKernelEx", "cuLaunchKernelEx"})


@dataclass
class LaunchArguments:
    """What a launch hands its kernel, each part worked out only when a rule asks for it."""

    #: kernel parameter (and blockDim.x, ...) -> value at this launch
    params: Callable[[], dict[str, Expr]]
    #: kernel parameter -> the file-level constant its argument names (`FEATURES`, `#define N`)
    constants: Callable[[], dict[str, str]]
    #: the launch's text plus the definitions of the names it uses
    expanded: Callable[[], str]


@dataclass
class LaunchGeometry:
    """One kernel launch with its grid, block, the launched kernel's facts and the host context."""

    geo: GeometryAnalysis
    lang: str  # "cuda" or "triton"
    kernel_name: str
    location: Location
    text: str  # the launch as written, first line
    kernel: KernelFacts | None
    grid: Dims
    block: Dims | None
    shared: Expr | None
    num_warps: list[tuple[Expr, str]]
    host: Any  # the function holding the launch (tail launches are looked for there)
    host_sizes: bool  # the host derives sizes from tensors around the launch
    arguments: LaunchArguments
    _known: dict[str, Any] = field(default_factory=dict)
    _dims: dict[int, DimClass] = field(default_factory=dict)

    @property
    def python(self) -> bool:
        return self.lang == "triton"

    def _argument(self, part: str) -> Any:
        if part not in self._known:
            self._known[part] = getattr(self.arguments, part)()
        return self._known[part]

    @property
    def params(self) -> dict[str, Expr]:
        return self._argument("params")

    @property
    def constants(self) -> dict[str, str]:
        return self._argument("constants")

    @property
    def expanded(self) -> str:
        return self._argument("expanded")

    def dim(self, axis: int) -> DimClass:
        if axis not in self._dims:
            if self.grid.unknown_reason:
                self._dims[axis] = DimClass("unknown", reason=self.grid.unknown_reason)
            else:
                self._dims[axis] = classify_dim(self.grid.get(axis))
        return self._dims[axis]

    def coverage(self, axis: int, output_only: bool = False) -> list[Expr]:
        """Elements each block (program) covers along `axis`, in host terms: by any index, or
        by the indices it stores to (`output_only`)."""
        if self.kernel is None:
            return []
        found = self.kernel.output_coverage if output_only else self.kernel.coverage
        try:
            return [substitute(c, self.params) for c in found.get(axis, [])]
        except RecursionError:
            return []

    def covered_by_loop(self, axis: int) -> bool:
        return self.kernel is not None and axis in self.kernel.loop_axes

    def coverage_matches(self, axis: int, den: Expr, output_only: bool = False) -> Expr | None:
        """The per-block coverage equal to a grid divisor, when the kernel has one."""
        den_value = evaluate(den)
        for c in self.coverage(axis, output_only):
            if equal(c, den) or (den_value is not None and evaluate(c) == den_value):
                return c
        return None

    def has_precondition(self, den: Expr) -> Precondition | None:
        return self.geo.precondition_for(den)

    def tail_launch(self) -> LaunchGeometry | None:
        """Another launch in the same host function that handles what this one leaves over."""
        for other in self.geo.launches:
            if other is self or other.host is not self.host or self.host is None:
                continue
            if "%" in other.expanded or (self.grid.name and _mentions(other.expanded, self.grid.name)):
                return other
            division = next((self.dim(a).division for a in range(3) if self.dim(a).division), None)
            if division is not None and _mentions(other.expanded, division.num.show()) \
                    and _mentions(other.expanded, division.den.show()):
                return other
        return None

    def handles_tail(self) -> bool:
        """This launch is the tail launch of another one in the same host function."""
        return any(other is not self and other.host is self.host and other.tail_launch() is self
                   for other in self.geo.launches)

    def element_axes(self) -> set[int]:
        """Axes along which the kernel stores per element (the index also depends on the
        thread: `threadIdx` / `tl.arange`), as opposed to one value per block (`out[blockIdx.x]`)."""
        if self.kernel is None:
            return set()
        out: set[int] = set()
        for store in self.kernel.stores:
            axes, per_element = store_axes(self.kernel, store)
            if per_element:
                out |= axes
        return out


def _mentions(text: str, name: str) -> bool:
    return bool(name) and re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", text) is not None


class GeometryAnalysis:
    """Launch geometry facts for one file; built once per model and shared by the KA2xx rules."""

    def __init__(self, model: SourceModel) -> None:
        self.model = model
        self.python = PythonHost(model)
        self.cpp = CppHost(model)
        self._kernel_facts: dict[int, KernelFacts] = {}
        self._preconditions: list[Precondition] | None = None
        self._dynamic_shared_opt_in: bool | None = None
        self.launches: list[LaunchGeometry] = []
        self.indirect: list[tuple[Location, str]] = []
        self._build()

    @classmethod
    def of(cls, model: SourceModel) -> GeometryAnalysis:
        return model.memo("geometry", lambda: cls(model))

    def dynamic_shared_opt_in(self) -> bool:
        """The sources raise a kernel's dynamic shared memory limit (`cudaFuncSetAttribute(...,
        cudaFuncAttributeMaxDynamicSharedMemorySize, ...)`)."""
        if self._dynamic_shared_opt_in is None:
            self._dynamic_shared_opt_in = bool(self.model.cuda_units) and any(
                call.short_name == "cudaFuncSetAttribute"
                and any("MaxDynamicSharedMemorySize" in call.unit.text_of(a) for a in call.args)
                for call in CppIndex.of(self.model).calls)
        return self._dynamic_shared_opt_in

    # --- preconditions -------------------------------------------------------------------------

    def preconditions(self) -> list[Precondition]:
        if self._preconditions is None:
            try:
                self._preconditions = self._python_preconditions() + self._c_preconditions()
            except RecursionError:
                self._preconditions = []
        return self._preconditions

    def precondition_for(self, den: Expr) -> Precondition | None:
        den_value = evaluate(den)
        for check in self.preconditions():
            for divisor in check.divisors:
                value = evaluate(divisor)
                if equal(divisor, den) or is_multiple(divisor, den) or (
                        value is not None and den_value is not None and den_value > 0
                        and value % den_value == 0):
                    return check
        return None

    def _python_preconditions(self) -> list[Precondition]:
        out = []
        for node in self.model.nodes:
            test = None
            if isinstance(node, ast.Assert):
                test = node.test
            elif isinstance(node, ast.If) and any(isinstance(s, ast.Raise) for s in node.body):
                test = node.test
            if test is None:
                continue
            scope = self.python.scope(self.python.enclosing_function(node))
            at = (node.lineno, node.col_offset)
            divisors = [scope.expr(n.right, at) for n in ast.walk(test)
                        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)]
            out.append(Precondition(self.python.code(test), divisors))
        return out

    def _c_preconditions(self) -> list[Precondition]:
        out = []
        if not self.model.cuda_units:
            return out
        index = CppIndex.of(self.model)
        for call in index.calls:
            if call.name in _CHECK_CALLS and call.args and call.function is not None:
                out.append(self._c_precondition(call.args[0], call.unit, call.function))
        for function in index.functions:
            if function.qualifier == "global" or function.body is None:
                continue
            for node in self.cpp.nodes(function.unit, ("if_statement",), function.body):
                consequence = node.child_by_field_name("consequence")
                condition = node.child_by_field_name("condition")
                if consequence is None or condition is None:
                    continue
                text = function.unit.text_of(consequence)
                if any(word in text for word in ("throw", "TORCH_CHECK", "AT_ERROR", "abort",
                                                  "TORCH_INTERNAL_ASSERT")):
                    out.append(self._c_precondition(condition, function.unit, function))
        return out

    def _c_precondition(self, node: Node, unit: CudaUnit, function: CppFunction) -> Precondition:
        scope = self.cpp.scope(unit, function)
        divisors = []
        for inner in walk_tree(node):
            if inner.type == "binary_expression":
                operator = inner.child_by_field_name("operator")
                right = inner.child_by_field_name("right")
                if operator is not None and unit.text_of(operator) == "%" and right is not None:
                    divisors.append(scope.expr(right, inner.start_byte))
        return Precondition(unit.text_of(node), divisors)


    def kernel_facts_cuda(self, function: CppFunction) -> KernelFacts:
        if id(function) not in self._kernel_facts:
            self._kernel_facts[id(function)] = cuda_kernel_facts(self.cpp, function)
        return self._kernel_facts[id(function)]

    def kernel_facts_triton(self, kernel: TritonKernel) -> KernelFacts:
        if id(kernel) not in self._kernel_facts:
            self._kernel_facts[id(kernel)] = triton_kernel_facts(self.python, kernel)
        return self._kernel_facts[id(kernel)]


    # --- building -----------------------------------------------------------------------------

    def _build(self) -> None:
        if self.model.module is None:
            return
        if self.model.cuda_units:
            index = CppIndex.of(self.model)
            for launch in index.launches:
                try:
                    self.launches.append(self._cuda_launch(index, launch))
                except RecursionError:  # pathological nesting: leave this launch alone
                    continue
            for call in index.calls:
                if call.short_name in INDIRECT_LAUNCHES:
                    target = " ".join(call.unit.text_of(call.args[0]).split()) if call.args else "?"
                    self.indirect.append((call.unit.location(call.node),
                                          f"{call.short_name}({target}, ...)"))
        for launch in self.model.triton_launches:
            try:
                geometry = self._triton_launch(launch)
            except RecursionError:
                continue
            if geometry is not None:
                self.launches.append(geometry)

    def _cuda_launch(self, index: CppIndex, launch: KernelLaunch) -> LaunchGeometry:
        unit = launch.unit
        scope = self.cpp.scope(unit, launch.function)
        at = launch.node.start_byte
        config = launch.config
        grid = self.cpp.dims(config[0], scope, at) if config else Dims([], 0, "", unknown_reason="no grid")
        block = self.cpp.dims(config[1], scope, at) if len(config) > 1 else None
        shared = scope.expr(config[2], at) if len(config) > 2 else None
        function = next((f for f in index.functions if f.name == launch.kernel
                         and f.qualifier == "global"), None)
        facts = self.kernel_facts_cuda(function) if function is not None else None

        def params() -> dict[str, Expr]:
            params: dict[str, Expr] = {}
            if facts is not None:
                for name, arg in zip(facts.params, launch.args):
                    params[name] = scope.expr(arg, at)
                callee = launch.node.child_by_field_name("function")
                if callee is not None and callee.type == "template_function":
                    targs = callee.child_by_field_name("arguments")
                    values = [a for a in targs.named_children] if targs is not None else []
                    for name, arg in zip(facts.template_params, values):
                        params[name] = scope.expr(arg.named_children[0] if arg.type == "type_descriptor"
                                                  and arg.named_children else arg, at)
            if block is not None:
                for axis in range(3):
                    params[f"blockDim.{AXIS_NAMES[axis]}"] = block.get(axis)
            for axis in range(3):
                if not grid.unknown_reason:
                    params[f"gridDim.{AXIS_NAMES[axis]}"] = grid.get(axis)
            return params

        def constants() -> dict[str, str]:
            names = facts.params if facts is not None else []
            return {name: constant for name, arg in zip(names, launch.args)
                    if (constant := scope.file_constant(arg, at)) is not None}

        def expanded() -> str:
            pieces = [unit.text_of(c) for c in config] + [unit.text_of(a) for a in launch.args]
            return self._expand_c(" ".join(pieces), launch, scope, at)

        text = " ".join(unit.text_of(launch.node).split())
        host_text = unit.text_of(launch.function.node) if launch.function is not None else ""
        return LaunchGeometry(
            self, "cuda", launch.kernel, unit.location(launch.node), text[:120], facts, grid, block,
            shared, [], launch.function,
            any(w in host_text for w in (".numel()", ".size(", "sizes()", "numel(")),
            LaunchArguments(params, constants, expanded))

    def _expand_c(self, text: str, launch: KernelLaunch, scope: CScope, at: int) -> str:
        out = [text]
        for name in set(_identifiers(text)):
            chosen, _ = scope.select(name, at)
            for definition in chosen:
                if definition.value is not None:
                    out.append(launch.unit.text_of(definition.value))
        return "\n".join(out)


    def _triton_launch(self, launch: TritonLaunch) -> LaunchGeometry | None:
        kernel = self.model.triton_kernels.get(launch.kernel)
        if kernel is None:
            return None
        facts = self.kernel_facts_triton(kernel)
        call = launch.call
        function = self.python.enclosing_function(call)
        scope = self.python.scope(function)
        at = (call.lineno, call.col_offset)
        params: dict[str, Expr] = {}
        for name, arg in zip(facts.params, call.args):
            params[name] = scope.expr(arg, at)
        kwargs = {k.arg: scope.expr(k.value, at) for k in call.keywords if k.arg}
        params.update({k: v for k, v in kwargs.items() if k in facts.params})
        for name in facts.constexpr:
            params.setdefault(name, sym(f"meta.{name}", "meta", name))
        meta_values = {k: v for k, v in params.items()}
        grid = self.python.grid(launch.grid, scope, at, meta_values)
        num_warps: list[tuple[Expr, str]] = []
        if "num_warps" in kwargs:
            num_warps.append((kwargs["num_warps"], "the launch"))
        for decorator in kernel.node.decorator_list:
            for node in ast.walk(decorator):
                if isinstance(node, ast.keyword) and node.arg == "num_warps":
                    num_warps.append((PyScope(self.python, None).expr(node.value, (0, 0)),
                                      f"a `triton.Config` (line {node.value.lineno})"))

        def expanded() -> str:
            pieces = [self.python.code(launch.grid)] + [self.python.code(a) for a in call.args] + \
                [self.python.code(k.value) for k in call.keywords]
            return "\n".join(pieces + self._expand_py(" ".join(pieces), scope, at))

        def constants() -> dict[str, str]:
            named = list(zip(facts.params, call.args)) + [(k.arg, k.value) for k in call.keywords
                                                          if k.arg in facts.params]
            return {name: constant for name, arg in named
                    if (constant := scope.file_constant(arg, at)) is not None}

        text = self.python.code(call).split("\n")[0]
        host_text = self.python.code(function) if function is not None else ""
        return LaunchGeometry(
            self, "triton", launch.kernel, self.model.location(call), text[:120], facts, grid,
            None, None, num_warps, function,
            any(w in host_text for w in (".numel()", ".shape", ".size(")),
            LaunchArguments(lambda: params, constants, expanded))

    def _expand_py(self, text: str, scope: PyScope, at: tuple[int, int]) -> list[str]:
        out = []
        for name in set(_identifiers(text)):
            chosen, _ = scope.select(name, at)
            for definition in chosen:
                if definition.value is not None:
                    out.append(self.python.code(definition.value))
        return out


def _identifiers(text: str) -> list[str]:
    return re.findall(r"(?<![\w.])[A-Za-z_]\w*", text)


def axis_index_name(launch: LaunchGeometry, axis: int) -> str:
    """`blockIdx.y` or `tl.program_id(1)`."""
    return f"tl.program_id({axis})" if launch.python else f"blockIdx.{AXIS_NAMES[axis]}"


def grid_dim_name(launch: LaunchGeometry, axis: int) -> str:
    """`grid`, `grid.y` or `grid[1]` (how a message names one dimension of the launch's grid)."""
    if launch.python:
        return f"grid[{axis}]" if launch.grid.explicit > 1 or axis else "grid"
    return "grid" if launch.grid.explicit <= 1 and axis == 0 else f"grid.{AXIS_NAMES[axis]}"


def store_axes(kernel: KernelFacts, store: Store) -> tuple[set[int], bool]:
    """The block/program axes a store's index depends on, and whether it also depends on the
    thread (`threadIdx`, `tl.arange`), i.e. is an element index rather than a per-block one."""
    if kernel.lang == "cuda":
        return axes_of(store.tokens, "blockIdx"), any(t.startswith("threadIdx.") for t in store.tokens)
    return axes_of(store.tokens, "pid"), any(t.startswith("arange#") for t in store.tokens)


def show_value(e: Expr) -> str:
    """A number when the expression evaluates to one (`256` for `threads`), else its text."""
    value = evaluate(e)
    return str(value) if value is not None else e.show()


class LaunchRule(Rule):
    """Base of the launch-geometry rules: the one loop over a file's launches. A subclass
    implements `check_launch`, called for each launch whose kernel is defined in the analysed
    sources (every launch when `needs_kernel` is False)."""

    needs_kernel: ClassVar[bool] = True

    def check(self, model: SourceModel) -> Iterator[Finding]:
        for launch in GeometryAnalysis.of(model).launches:
            if launch.kernel is not None or not self.needs_kernel:
                yield from self.check_launch(model, launch)

    def check_launch(self, model: SourceModel, launch: LaunchGeometry) -> Iterable[Finding]:
        raise NotImplementedError
