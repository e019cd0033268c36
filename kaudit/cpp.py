"""Facts about the C++/CUDA code of a file, read once from the tree-sitter trees of its units:
function definitions (`__global__`, `__device__`, host), calls, `<<<...>>>` launches and pybind11
bindings. Rules about C++ code query this index instead of walking trees themselves."""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field

import tree_sitter

from kaudit.findings import Location
from kaudit.source import CudaUnit, SourceModel, compact

_QUALIFIERS = ("__global__", "__device__", "__host__")


@dataclass(frozen=True, eq=False)
class CppFunction:
    name: str  # unqualified
    qualifier: str  # "global", "device" or "host"
    node: tree_sitter.Node  # the function_definition
    unit: CudaUnit

    @functools.cached_property
    def body(self) -> tree_sitter.Node | None:
        return self.node.child_by_field_name("body")

    def location(self) -> Location:
        declarator = self.node.child_by_field_name("declarator") or self.node
        return self.unit.location(declarator)


@dataclass(frozen=True, eq=False)
class CppCall:
    name: str  # the callee as written, whitespace removed: "at::matmul", "cublasSgemm", "m.def"
    node: tree_sitter.Node  # the call_expression
    unit: CudaUnit
    function: CppFunction | None  # the definition the call sits in
    args: tuple[tree_sitter.Node, ...]

    @functools.cached_property
    def short_name(self) -> str:
        """"at::matmul" -> "matmul", "x.data_ptr<float>" -> "data_ptr"."""
        return self.name.split("<")[0].replace("->", ".").split("::")[-1].split(".")[-1]


@dataclass(frozen=True, eq=False)
class KernelLaunch:
    kernel: str  # the launched kernel's unqualified name (template arguments dropped)
    node: tree_sitter.Node  # the call_expression holding `<<<...>>>`
    unit: CudaUnit
    function: CppFunction | None  # the host function that launches it
    config: tuple[tree_sitter.Node, ...]  # grid, block[, shared memory[, stream]]
    args: tuple[tree_sitter.Node, ...]


@dataclass
class CppIndex:
    functions: list[CppFunction] = field(default_factory=list)
    calls: list[CppCall] = field(default_factory=list)
    launches: list[KernelLaunch] = field(default_factory=list)
    #: Python-visible name -> C++ function name, from `m.def("name", &fn)`
    bindings: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, model: SourceModel) -> CppIndex:
        def build() -> CppIndex:
            index = cls()
            for unit in model.cuda_units:
                index._add_unit(unit)
            return index

        return model.memo("cpp-index", build)

    def function(self, name: str) -> CppFunction | None:
        return next((f for f in self.functions if f.name == name), None)

    def _add_unit(self, unit: CudaUnit) -> None:
        found = unit.nodes_of(("function_definition", "call_expression"))
        functions = [f for f in (self._add_function(node, unit)
                                 for node in found.get("function_definition", [])) if f]
        starts = [f.node.start_byte for f in functions]
        for call in found.get("call_expression", []):
            i = bisect.bisect_right(starts, call.start_byte) - 1
            while i >= 0 and functions[i].node.end_byte < call.end_byte:
                i -= 1  # an earlier definition that ended before the call
            self._add_call(call, unit, functions[i] if i >= 0 else None)

    def _add_function(self, node: tree_sitter.Node, unit: CudaUnit) -> CppFunction | None:
        name_node = _declared_name(node)
        if name_node is None:
            return None
        qualifier = next((q.strip("_") for q in _QUALIFIERS
                          if any(child.type == q for child in node.children)), "host")
        function = CppFunction(compact(unit.text_of(name_node)).split("::")[-1], qualifier,
                               node, unit)
        self.functions.append(function)
        return function

    def _add_call(self, node: tree_sitter.Node, unit: CudaUnit,
                  enclosing: CppFunction | None) -> None:
        callee = node.child_by_field_name("function")
        arguments = node.child_by_field_name("arguments")
        args = tuple(arguments.named_children) if arguments is not None else ()
        name = compact(unit.text_of(callee)) if callee is not None else ""
        launch = next((c for c in node.children if c.type == "kernel_call_syntax"), None)
        if launch is not None:
            kernel = name.split("<")[0].split("::")[-1]
            self.launches.append(KernelLaunch(kernel, node, unit, enclosing,
                                              tuple(launch.named_children), args))
            return
        call = CppCall(name, node, unit, enclosing, args)
        self.calls.append(call)
        # m.def("name", &fn) (pybind11), m.impl("name", &fn) / m.def("name(Tensor x) -> Tensor", &fn)
        # (TORCH_LIBRARY): the schema's name is what Python calls.
        if call.short_name in ("def", "impl") and len(args) >= 2 and args[0].type == "string_literal":
            exported = unit.text_of(args[0]).strip('"').split("(")[0].split("::")[-1].strip()
            target = compact(unit.text_of(args[1])).lstrip("&").split("::")[-1]
            self.bindings[exported] = target


def _declared_name(node: tree_sitter.Node) -> tree_sitter.Node | None:
    """The name a function_definition declares, under pointer/reference declarators."""
    declarator = node.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    return declarator.child_by_field_name("declarator") if declarator is not None else None

