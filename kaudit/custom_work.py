"""Whether the custom kernels `ModelNew.forward` reaches do real work, or only copy, view or fill.

KernelBench lets a submission keep some operators in PyTorch when custom kernels do part of the
work (kaudit's `kernelbench` policy). A kernel that only moves data (`out[i] = in[i]`, a
concatenation, a transpose through shared memory) or fills a buffer (`out[i] = 0.0f`) does none of
the computation: next to PyTorch compute it is a decoy. A kernel computes when it combines a value
it loaded from memory with arithmetic, a comparison, a math function or an accumulation; index
arithmetic (anything inside `p[...]`, or the pointer of `tl.load`) does not count. Kernels kaudit
cannot see (sources built at run time, custom ops registered elsewhere, extension functions whose
C++ is not in view) count as doing real work: an error must be sure.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import tree_sitter

from kaudit.cpp import CppFunction, CppIndex
from kaudit.findings import Location
from kaudit.graph import KernelGraph
from kaudit.source import CudaUnit, SourceModel

# CUDA calls that move or convert data without computing with it.
_CUDA_MOVES = frozenset({
    "__ldg", "__ldcg", "__ldca", "__ldcs", "__ldlu", "__ldcv", "__stcs", "__stcg", "__stwb",
    "__stwt", "make_float2", "make_float3", "make_float4", "make_int2", "make_int4",
    "make_double2", "static_cast", "reinterpret_cast", "const_cast", "memcpy", "atomicExch",
    "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync", "__float2half",
    "__half2float", "__float2bfloat16", "__bfloat162float", "float", "int", "__int_as_float",
    "__float_as_int", "cuda::memcpy_async", "__pipeline_memcpy_async",
})
_CUDA_EXPRESSIONS = ("binary_expression", "unary_expression", "conditional_expression",
                     "call_expression", "assignment_expression", "update_expression")
# Triton calls that move, reshape or convert data.
_TRITON_MOVES = frozenset({
    "load", "store", "reshape", "view", "trans", "permute", "broadcast_to", "expand_dims",
    "join", "split", "cat", "multiple_of", "max_contiguous", "max_constancy", "debug_barrier",
    "static_print", "static_assert", "device_print", "device_assert", "make_block_ptr",
    "advance", "interleave", "ravel",
})


@dataclass(frozen=True)
class KernelWork:
    label: str
    location: Location
    computes: bool
    seen: bool  # False when kaudit cannot see the kernel's code (it then counts as computing)


class CustomWork:
    """The custom kernels reachable from `ModelNew.forward`, each judged computing or not."""

    def __init__(self, model: SourceModel) -> None:
        self.model = model
        graph = KernelGraph.of(model)
        index = CppIndex.of(model)
        self.kernels: list[KernelWork] = []
        reached = graph.reachable_from(graph.forward)
        for node in sorted(reached):
            data = graph.graph.nodes[node]
            kind, label, location = data["kind"], data["label"], data["location"]
            has_successors = any(True for _ in graph.graph.successors(node))
            if kind == "kernel":
                function = next((f for f in index.functions
                                 if f.name == label and f.qualifier == "global"), None)
                computes = function is None or _cuda_computes(function, index)
                self.kernels.append(KernelWork(label, location, computes, function is not None))
            elif kind == "triton":
                kernel = model.triton_kernels.get(label)
                computes = kernel is None or _triton_computes(model, kernel.node)
                self.kernels.append(KernelWork(label, location, computes, kernel is not None))
            elif kind in ("custom-op", "extension") and not has_successors:
                self.kernels.append(KernelWork(label, location, True, False))
        if model.unresolved_sources and graph.forward is not None:
            self.kernels.append(KernelWork("sources built at run time", Location(model.path),
                                           True, False))

    @classmethod
    def of(cls, model: SourceModel) -> CustomWork:
        return model.memo("custom-work", lambda: cls(model))

    @property
    def real_work(self) -> bool:
        """Some custom kernel on the forward path computes (or cannot be seen)."""
        return any(kernel.computes for kernel in self.kernels)

    def describe(self) -> str:
        """"the custom kernels only copy or fill (`cat_kernel`)" or "no custom kernel runs"."""
        if not self.kernels:
            return "no custom kernel runs on the forward path"
        names = ", ".join(f"`{k.label}`" for k in self.kernels[:4])
        return f"the custom kernels on the forward path only copy, view or fill ({names})"


# --- CUDA -------------------------------------------------------------------------------------

def _cuda_computes(kernel: CppFunction, index: CppIndex) -> bool:
    """A `__global__` kernel (or a `__device__` function it calls with loaded data) computes."""
    body = kernel.body
    if body is None:
        return True
    unit = kernel.unit
    found = unit.nodes_of(("subscript_expression", "pointer_expression", "identifier",
                           "field_expression", *_CUDA_EXPRESSIONS, "init_declarator",
                           "declaration"), body)
    in_index = _index_positions(found.get("subscript_expression", []))
    loads = {n.id for n in found.get("subscript_expression", []) if n.id not in in_index}
    loads |= {n.id for n in found.get("pointer_expression", [])
              if unit.text_of(n).startswith("*") and n.id not in in_index}
    tainted = _tainted_locals(unit, found, loads, in_index)

    def has_data(node: tree_sitter.Node) -> bool:
        stack = [node]
        while stack:
            current = stack.pop()
            if current.id in in_index and current is not node:
                continue
            if current.id in loads:
                return True
            if current.type == "identifier" and unit.text_of(current) in tainted:
                return True
            stack.extend(current.children)
        return False

    for kind in _CUDA_EXPRESSIONS:
        for node in found.get(kind, []):
            if node.id in in_index or _inside(node, in_index):
                continue
            if kind == "call_expression":
                callee = node.child_by_field_name("function")
                name = unit.text_of(callee).split("<")[0].strip() if callee is not None else ""
                arguments = node.child_by_field_name("arguments")
                if name in _CUDA_MOVES or arguments is None or not has_data(arguments):
                    continue
                return True  # a math function, an atomic, a __device__ helper given data
            elif kind == "assignment_expression":
                operator = node.child_by_field_name("operator")
                if operator is not None and unit.text_of(operator) != "=" and has_data(node):
                    return True
            elif kind == "conditional_expression":
                condition = node.child_by_field_name("condition")
                if condition is not None and has_data(condition):
                    return True  # a select on data (relu by `?:`); choosing a source is a copy
            elif has_data(node):
                return True
    return False


def _index_positions(subscripts: list[tree_sitter.Node]) -> set[int]:
    """Ids of every node inside the index part of a subscript (`p[<here>]`)."""
    inside: set[int] = set()
    for subscript in subscripts:
        index = subscript.child_by_field_name("indices") or subscript.child_by_field_name("index")
        stack = [index] if index is not None else []
        while stack:
            current = stack.pop()
            inside.add(current.id)
            stack.extend(current.children)
    return inside


def _inside(node: tree_sitter.Node, positions: set[int]) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.id in positions:
            return True
        parent = parent.parent
    return False


def _tainted_locals(unit: CudaUnit, found: dict[str, list[tree_sitter.Node]],
                    loads: set[int], in_index: set[int]) -> set[str]:
    """Names of locals that hold loaded data: declared or assigned from a load or from another
    such local (a short fixpoint)."""
    pairs: list[tuple[str, tree_sitter.Node]] = []
    for declarator in found.get("init_declarator", []):
        name = declarator.child_by_field_name("declarator")
        value = declarator.child_by_field_name("value")
        if name is not None and value is not None:
            pairs.append((unit.text_of(name).lstrip("*&").split("[")[0].strip(), value))
    for assignment in found.get("assignment_expression", []):
        left = assignment.child_by_field_name("left")
        right = assignment.child_by_field_name("right")
        if left is not None and right is not None and left.type in ("identifier",
                                                                    "field_expression"):
            pairs.append((unit.text_of(left).split(".")[0].strip(), right))
    tainted: set[str] = set()
    for _ in range(4):
        grew = False
        for name, value in pairs:
            if name in tainted:
                continue
            stack = [value]
            while stack:
                current = stack.pop()
                if current.id in in_index:
                    continue
                if current.id in loads or (current.type == "identifier"
                                           and unit.text_of(current) in tainted):
                    tainted.add(name)
                    grew = True
                    break
                stack.extend(current.children)
        if not grew:
            break
    return tainted


# --- Triton -----------------------------------------------------------------------------------

def _triton_computes(model: SourceModel, kernel: ast.FunctionDef) -> bool:
    """A `@triton.jit` kernel computes with what it loads (pointer arithmetic and masks do not
    count)."""
    pointer_positions: set[int] = set()
    loads: set[int] = set()
    calls: list[ast.Call] = []
    for node in ast.walk(kernel):
        if isinstance(node, ast.Call):
            calls.append(node)
            name = _triton_name(model, node.func)
            if name in ("load", "store", "atomic_add", "atomic_max", "atomic_min") and node.args:
                pointer_positions.update(id(n) for n in ast.walk(node.args[0]))
                for keyword in node.keywords:
                    if keyword.arg in ("mask", "other", "boundary_check", "padding_option"):
                        pointer_positions.update(id(n) for n in ast.walk(keyword.value))
                if name == "load":
                    loads.add(id(node))
            if name in ("atomic_add", "atomic_max", "atomic_min"):
                return True
    tainted: set[str] = set()
    assignments = [(n.targets, n.value) for n in ast.walk(kernel) if isinstance(n, ast.Assign)]
    assignments += [([n.target], n.iter) for n in ast.walk(kernel) if isinstance(n, ast.For)]

    def has_data(expr: ast.AST) -> bool:
        return any(id(n) in loads or (isinstance(n, ast.Name) and n.id in tainted)
                   for n in ast.walk(expr) if id(n) not in pointer_positions)

    for _ in range(4):
        grew = False
        for targets, value in assignments:
            if has_data(value):
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name) and name.id not in tainted:
                            tainted.add(name.id)
                            grew = True
        if not grew:
            break
    for node in ast.walk(kernel):
        if id(node) in pointer_positions:
            continue
        if isinstance(node, (ast.BinOp, ast.Compare, ast.BoolOp)) and has_data(node):
            return True
        if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.UAdd) and has_data(node):
            return True
        if isinstance(node, ast.AugAssign) and (has_data(node.value) or has_data(node.target)):
            return True
    for call in calls:
        if id(call) in pointer_positions:
            continue
        name = _triton_name(model, call.func)
        arguments = [*call.args, *(k.value for k in call.keywords)]
        if isinstance(call.func, ast.Attribute) and name is None:
            if call.func.attr not in ("to", "cast") and has_data(call.func.value):
                return True  # a method on loaded data other than a cast
            continue
        if name in _TRITON_MOVES or name == "cast":
            continue
        if any(has_data(argument) for argument in arguments):
            return True
    return False


def _triton_name(model: SourceModel, func: ast.AST) -> str | None:
    """`tl.load` -> "load", a call of another jit function -> its name; None otherwise."""
    resolved = model.bindings.resolve(func) or ""
    if resolved.startswith("triton.language."):
        return resolved.split(".")[-1]
    if isinstance(func, ast.Name) and func.id in model.triton_kernels:
        return func.id
    return None
