"""Which call produced the tensor `ModelNew.forward` returns (intra-procedural, helpers followed).

A kernel file can launch its custom kernel and still return PyTorch's answer: the custom result is
overwritten, cancelled (`c + (torch.matmul(a, b) - c)`), or the returned buffer is a fresh
allocation no kernel writes. This module traces each `return` back to its producers.
"""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass

from kaudit.forward import REFERENCE_KINDS, ForwardAnalysis, OpKind, walk_code
from kaudit.python_scope import dotted_parts
from kaudit.source import FunctionNode

# Methods that return (a view or copy of) their receiver's data: the producer is the receiver's.
PASS_THROUGH_METHODS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "contiguous", "clone", "to", "float", "double",
    "cuda", "cpu", "squeeze", "unsqueeze", "flatten", "permute", "transpose", "t", "expand",
    "expand_as", "narrow", "detach", "type_as", "unflatten", "movedim",
})
_ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones",
                          "ones_like", "full", "full_like", "new_empty", "new_zeros", "new_ones",
                          "new_full"})
_MAX_DEPTH = 4


class Source(enum.Enum):
    CUSTOM = "custom kernel"
    DERIVED = "PyTorch op on a custom kernel's output"
    REFERENCE = "PyTorch"
    INPUT = "an input or parameter of the model"
    UNWRITTEN = "an allocation no kernel writes"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Producer:
    source: Source
    node: ast.AST
    description: str


@dataclass(frozen=True)
class ReturnFlow:
    statement: ast.Return
    producers: tuple[Producer, ...]

    @property
    def from_custom_kernel(self) -> bool:
        return any(p.source in (Source.CUSTOM, Source.DERIVED) for p in self.producers)

    @property
    def bypassing(self) -> tuple[Producer, ...]:
        """Producers that show the output does not come from a custom kernel (empty if it does)."""
        if self.from_custom_kernel or any(p.source is Source.UNKNOWN for p in self.producers):
            return ()
        return tuple(p for p in self.producers if p.source in (Source.REFERENCE, Source.UNWRITTEN))


def forward_flows(analysis: ForwardAnalysis) -> list[ReturnFlow]:
    """The flows of `ModelNew.forward`'s returns, traced once per file (the graph and KA105 share
    them)."""
    forward = analysis.forward
    if forward is None:
        return []
    return analysis.model.memo("forward-returns", lambda: ReturnTracer(analysis).flows(forward))


class ReturnTracer:
    def __init__(self, analysis: ForwardAnalysis) -> None:
        self.analysis = analysis
        self.model = analysis.model
        self._assignments: dict[FunctionNode, dict[str, list[Assignment]]] = {}
        self._traced: dict[tuple[int, int, int], list[Producer]] = {}
        self._written: dict[tuple[FunctionNode, str], bool] = {}
        self._flows: dict[FunctionNode, list[ReturnFlow]] = {}

    def flows(self, function: FunctionNode) -> list[ReturnFlow]:
        """The flows of a function's returns, traced once; a helper that reaches itself again
        (recursion) has no flows there, so what it returns is unknown."""
        if function not in self._flows:
            self._flows[function] = []
            self._flows[function] = [
                ReturnFlow(node, tuple(self._producers(node.value, function, 0)))
                for node in walk_code(function.body)
                if isinstance(node, ast.Return) and node.value is not None]
        return self._flows[function]

    def _producers(self, expr: ast.AST, function: FunctionNode, depth: int) -> list[Producer]:
        """What `expr` may come from; traced once per expression and depth (a value used many
        times is not traced again for each use)."""
        key = (id(expr), id(function), depth)
        if key not in self._traced:
            self._traced[key] = self._trace(expr, function, depth)
        return self._traced[key]

    def _trace(self, expr: ast.AST, function: FunctionNode, depth: int) -> list[Producer]:
        if depth > _MAX_DEPTH:
            return [Producer(Source.UNKNOWN, expr, "too deep")]
        if isinstance(expr, (ast.Tuple, ast.List)):
            return [p for element in expr.elts for p in self._producers(element, function, depth + 1)]
        if isinstance(expr, ast.Name):
            return self._name_producers(expr, function, depth)
        if isinstance(expr, ast.Attribute) and dotted_parts(expr.value) == ["self"]:
            return [Producer(Source.INPUT, expr, self.model.code_of(expr))]  # weights, buffers
        if isinstance(expr, ast.Subscript):
            return self._producers(expr.value, function, depth + 1)
        if isinstance(expr, ast.IfExp):
            return self._producers(expr.body, function, depth + 1) + \
                self._producers(expr.orelse, function, depth + 1)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
            return self._additive_producers(expr, function, depth)
        if isinstance(expr, ast.BinOp) and not isinstance(expr.op, ast.MatMult):
            return self._producers(expr.left, function, depth + 1) + \
                self._producers(expr.right, function, depth + 1)
        if isinstance(expr, ast.Constant):
            return []
        if isinstance(expr, (ast.Call, ast.BinOp)):
            return self._call_producers(expr, function, depth)
        return [Producer(Source.UNKNOWN, expr, self.model.code_of(expr))]

    def _call_producers(self, expr: ast.Call | ast.BinOp, function: FunctionNode,
                        depth: int) -> list[Producer]:
        owner = self.analysis.owner.get(function)
        op = self.analysis.classify(expr, owner)
        if op is not None and op.kind in REFERENCE_KINDS:
            # A PyTorch op applied to the kernel's output still depends on the kernel (KA101
            # reports the op); one applied to inputs alone bypasses it.
            inputs = [p for operand in self._operands(expr)
                      for p in self._producers(operand, function, depth + 1)]
            if any(p.source in (Source.CUSTOM, Source.DERIVED) for p in inputs):
                return [Producer(Source.DERIVED, expr, op.description)]
            if any(p.source is Source.UNKNOWN for p in inputs):
                return [Producer(Source.UNKNOWN, expr, op.description)]
            return [Producer(Source.REFERENCE, expr, op.description)]
        if op is not None and op.kind is OpKind.CUSTOM_KERNEL:
            return [Producer(Source.CUSTOM, expr, op.description)]
        if op is not None and op.kind is OpKind.HELPER and op.target is not None:
            flows = self.flows(op.target) if depth < _MAX_DEPTH else []
            found = [p for flow in flows for p in flow.producers]
            return found or [Producer(Source.UNKNOWN, expr, op.description)]
        assert isinstance(expr, ast.Call)
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr in PASS_THROUGH_METHODS:
            return self._producers(func.value, function, depth + 1)
        if self._is_allocation(func):
            return [Producer(Source.UNWRITTEN, expr, f"`{self.model.code_of(expr)}`")]
        return [Producer(Source.UNKNOWN, expr, self.model.code_of(expr))]

    def _name_producers(self, name: ast.Name, function: FunctionNode, depth: int) -> list[Producer]:
        if function not in self._assignments:  # one walk per function, not one per name
            self._assignments[function] = _assignments(function)
        values = _reaching_assignments(self._assignments[function], name.id, name.lineno)
        if not values:
            is_input = function is self.analysis.forward and name.id in _parameters(function)
            return [Producer(Source.INPUT if is_input else Source.UNKNOWN, name, name.id)]
        producers = [p for value in values for p in self._producers(value, function, depth + 1)]
        if any(p.source is Source.UNWRITTEN for p in producers) and \
                self._written_by_kernel(function, name.id):
            return [Producer(Source.CUSTOM, name, f"`{name.id}`, written by a custom kernel")]
        return producers

    def _written_by_kernel(self, function: FunctionNode, name: str) -> bool:
        """True when `name` is handed to a custom kernel (out-parameter style) or mutated in place."""
        if (function, name) not in self._written:
            self._written[function, name] = self._find_kernel_write(function, name)
        return self._written[function, name]

    def _find_kernel_write(self, function: FunctionNode, name: str) -> bool:
        owner = self.analysis.owner.get(function)
        for node in walk_code(function.body):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                    and func.value.id == name:
                return True  # `out.copy_(...)`, `out.fill_(...)`: not ours to judge here
            op = self.analysis.classify(node, owner)
            if op is None or op.kind not in (OpKind.CUSTOM_KERNEL, OpKind.HELPER):
                continue
            arguments = [*node.args, *(k.value for k in node.keywords)]
            if any(isinstance(n, ast.Name) and n.id == name
                   for argument in arguments for n in ast.walk(argument)):
                return True
        return False

    def _operands(self, expr: ast.AST) -> list[ast.AST]:
        """What an op reads: both sides of `@`; a call's arguments, and its receiver when it is a
        tensor method (`x.sum()`), not a module (`torch.sum(x)`)."""
        if isinstance(expr, ast.BinOp):
            return [expr.left, expr.right]
        assert isinstance(expr, ast.Call)
        func = expr.func
        is_method = isinstance(func, ast.Attribute) and self.model.bindings.resolve(func) is None
        receiver = [func.value] if is_method else []  # type: ignore[attr-defined]
        return [*receiver, *expr.args, *(keyword.value for keyword in expr.keywords)]

    def _is_allocation(self, func: ast.AST) -> bool:
        resolved = self.model.bindings.resolve(func) or ""
        if resolved.startswith("torch.") and resolved[len("torch."):] in _ALLOCATIONS:
            return True
        return isinstance(func, ast.Attribute) and func.attr.startswith("new_") \
            and func.attr in _ALLOCATIONS

    def _additive_producers(self, expr: ast.BinOp, function: FunctionNode,
                            depth: int) -> list[Producer]:
        """Terms of a sum; a term added and subtracted again (`c + (x - c)`) cancels out."""
        terms: list[tuple[int, ast.AST]] = []
        _flatten_sum(expr, 1, terms)
        remaining: list[tuple[int, ast.AST]] = []
        for sign, term in terms:
            text = ast.dump(term)
            twin = next((t for t in remaining if t[0] == -sign and ast.dump(t[1]) == text), None)
            if twin is not None:
                remaining.remove(twin)
            else:
                remaining.append((sign, term))
        return [p for _sign, term in remaining for p in self._producers(term, function, depth + 1)]


def _flatten_sum(expr: ast.AST, sign: int, out: list[tuple[int, ast.AST]]) -> None:
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
        _flatten_sum(expr.left, sign, out)
        _flatten_sum(expr.right, sign if isinstance(expr.op, ast.Add) else -sign, out)
    else:
        out.append((sign, expr))


#: (line, whether the statement is at the function's top level, the value assigned)
Assignment = tuple[int, bool, ast.AST]


def _assignments(function: FunctionNode) -> dict[str, list[Assignment]]:
    """Every assignment in a function, by the name it binds, in walk order."""
    out: dict[str, list[Assignment]] = {}
    top_level = {id(statement) for statement in function.body}
    for node in walk_code(function.body):
        if isinstance(node, ast.Assign):
            bound = [(name, node.value) for target in node.targets for name in _bound_names(target)]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            bound = [(name, node.value) for name in _bound_names(node.target)]
        elif isinstance(node, ast.AugAssign):
            bound = [(name, ast.copy_location(ast.BinOp(
                left=ast.copy_location(ast.Name(id=name), node), op=node.op, right=node.value), node))
                for name in _bound_names(node.target)]
        elif isinstance(node, ast.NamedExpr):
            bound = [(node.target.id, node.value)]
        else:
            continue
        for name, value in dict(bound).items():  # a name bound twice by one statement counts once
            out.setdefault(name, []).append((node.lineno, id(node) in top_level, value))
    return out


def _reaching_assignments(assignments_by_name: dict[str, list[Assignment]], name: str,
                          before_line: int) -> list[ast.AST]:
    """Values that may reach a use of `name` on `before_line`: the last assignment in the
    function's top-level body above it, and every nested (branch, loop) assignment after that one.
    An over-approximation, which only makes the data-flow rules quieter."""
    assignments = [a for a in assignments_by_name.get(name, ()) if a[0] < before_line]
    assignments.sort(key=lambda a: a[0])
    last_top = max((i for i, a in enumerate(assignments) if a[1]), default=0)
    return [a[2] for a in assignments[last_top:]]


def _parameters(function: FunctionNode) -> set[str]:
    args = function.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} | \
        {a.arg for a in (args.vararg, args.kwarg) if a is not None}


def _bound_names(target: ast.AST) -> list[str]:
    """The names an assignment target binds (through tuples and lists)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _bound_names(element)]
    return []

