"""Which call produced the tensor `ModelNew.forward` returns (intra-procedural, helpers followed).

A kernel file can launch its custom kernel and still return PyTorch's answer: the custom result is
overwritten, cancelled (`c + (torch.matmul(a, b) - c)`), or the returned buffer is a fresh
allocation no kernel writes, or a tensor stored in `__init__` and returned every call. This module
traces each `return` back to its producers. A buffer's producers are what is written into it:
a kernel it is handed to, `buf[...] = value`, `buf.copy_(value)`, `torch.op(..., out=buf)`.
"""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass

from kaudit.forward import REFERENCE_KINDS, ForwardAnalysis, Op, OpKind
from kaudit.python_scope import dotted_parts
from kaudit.source import FunctionNode, walk_code

# Methods that return (a view or copy of) their receiver's data: the producer is the receiver's.
PASS_THROUGH_METHODS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "contiguous", "clone", "to", "float", "double",
    "cuda", "cpu", "squeeze", "unsqueeze", "flatten", "permute", "transpose", "t", "expand",
    "expand_as", "narrow", "detach", "type_as", "unflatten", "movedim",
})
ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones",
                         "ones_like", "full", "full_like", "new_empty", "new_zeros", "new_ones",
                         "new_full"})
# Made once and kept: a tensor stored on the model from these never depends on forward's inputs.
_CONSTANTS = ALLOCATIONS | {"tensor", "as_tensor", "arange", "linspace", "rand", "randn",
                            "randint", "rand_like", "randn_like", "eye"}
# Methods that hand a tensor's memory to other code, which may write it.
_POINTERS = frozenset({"data_ptr", "untyped_storage", "storage", "__dlpack__",
                       "__cuda_array_interface__"})
# In-place methods that only fill (their result does not depend on any other tensor).
_FILLS = frozenset({"zero_", "fill_", "normal_", "uniform_", "random_"})
_MAX_DEPTH = 8


class Source(enum.Enum):
    CUSTOM = "custom kernel"
    DERIVED = "PyTorch op on a custom kernel's output"
    REFERENCE = "PyTorch"
    INPUT = "an input or parameter of the model"
    UNWRITTEN = "an allocation no kernel writes"
    STORED = "a tensor stored on the model that forward never writes"
    UNKNOWN = "unknown"


BYPASSING = (Source.REFERENCE, Source.UNWRITTEN, Source.STORED)


@dataclass(frozen=True)
class Producer:
    source: Source
    node: ast.AST
    description: str
    #: for a custom kernel: what it runs (an extension function, a Triton kernel)
    callee: str = ""


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
        return tuple(p for p in self.producers if p.source in BYPASSING)


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
        #: helpers being traced: a helper reached again (recursion) adds nothing
        self._active: set[int] = set()
        # memoised per file: a helper's flows, a name's producers at a line, a function's facts
        self._flows: dict[int, list[ReturnFlow]] = {}
        self._names: dict[tuple[int, str, int], list[Producer]] = {}
        self._facts: dict[int, _FunctionFacts] = {}

    def flows(self, function: FunctionNode, depth: int = 0) -> list[ReturnFlow]:
        key = id(function)
        if key in self._flows:
            return self._flows[key]
        if key in self._active:
            return []
        self._active.add(key)
        try:
            found = [ReturnFlow(node, tuple(self._producers(node.value, function, depth)))
                     for node in self._facts_of(function).returns]
        finally:
            self._active.discard(key)
        self._flows[key] = found
        return found

    def _facts_of(self, function: FunctionNode) -> _FunctionFacts:
        if id(function) not in self._facts:
            self._facts[id(function)] = _FunctionFacts(function)
        return self._facts[id(function)]

    def _producers(self, expr: ast.AST, function: FunctionNode, depth: int) -> list[Producer]:
        if depth > _MAX_DEPTH:
            return [Producer(Source.UNKNOWN, expr, "too deep")]
        if isinstance(expr, (ast.Tuple, ast.List)):
            return [p for element in expr.elts for p in self._producers(element, function, depth + 1)]
        if isinstance(expr, ast.Name):
            return self._name_producers(expr, expr.id, function, depth)
        if isinstance(expr, ast.Attribute) and dotted_parts(expr.value) == ["self"]:
            return self._name_producers(expr, f"self.{expr.attr}", function, depth)
        if isinstance(expr, ast.Subscript):
            return self._producers(expr.value, function, depth + 1)
        if isinstance(expr, ast.IfExp):
            return self._producers(expr.body, function, depth + 1) + \
                self._producers(expr.orelse, function, depth + 1)
        if isinstance(expr, ast.BinOp) and not isinstance(expr.op, ast.MatMult):
            return self._operator_producers(expr, function, depth)
        if isinstance(expr, ast.Constant):
            return []
        if isinstance(expr, (ast.Call, ast.BinOp)):
            return self._call_producers(expr, function, depth)
        return [Producer(Source.UNKNOWN, expr, self.model.code_of(expr))]

    def _operator_producers(self, expr: ast.BinOp, function: FunctionNode,
                            depth: int) -> list[Producer]:
        """Terms of a sum (a term added and subtracted again cancels out) or both operands; an
        operator on tensors computes in PyTorch unless a kernel's output is among them."""
        if isinstance(expr.op, (ast.Add, ast.Sub)):
            producers = self._additive_producers(expr, function, depth)
        else:
            producers = self._producers(expr.left, function, depth + 1) + \
                self._producers(expr.right, function, depth + 1)
        op = self._classify(expr, function)
        if op is None or op.kind not in REFERENCE_KINDS or not producers:
            return producers
        sources = {p.source for p in producers}
        if sources & {Source.CUSTOM, Source.DERIVED}:
            return [Producer(Source.DERIVED, expr, op.description)]
        if Source.UNKNOWN in sources or sources & {Source.UNWRITTEN, Source.STORED}:
            return producers
        return [Producer(Source.REFERENCE, expr, op.description)]

    def _classify(self, expr: ast.AST, function: FunctionNode) -> Op | None:
        owner = self.analysis.owner.get(function)
        ops = self.analysis.classify_all(expr, owner, function)
        custom = [op for op in ops if op.kind is OpKind.CUSTOM_KERNEL]
        return (custom or ops or [None])[0]

    def _call_producers(self, expr: ast.Call | ast.BinOp, function: FunctionNode,
                        depth: int) -> list[Producer]:
        owner = self.analysis.owner.get(function)
        ops = self.analysis.classify_all(expr, owner, function)
        producers: list[Producer] = []
        for op in ops:
            producers.extend(self._op_producers(op, expr, function, depth))
        if ops:
            return producers
        assert isinstance(expr, ast.Call)
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr in PASS_THROUGH_METHODS:
            return self._producers(func.value, function, depth + 1)
        if self._is_allocation(func):
            return [Producer(Source.UNWRITTEN, expr, f"`{self.model.code_of(expr)}`")]
        return [Producer(Source.UNKNOWN, expr, self.model.code_of(expr))]

    def _op_producers(self, op: Op, expr: ast.AST, function: FunctionNode,
                      depth: int) -> list[Producer]:
        if op.kind in REFERENCE_KINDS:
            # A PyTorch op applied to the kernel's output still depends on the kernel (KA101
            # reports the op); one applied to inputs alone bypasses it.
            inputs = [p for operand in self._operands(expr)
                      for p in self._producers(operand, function, depth + 1)]
            if any(p.source in (Source.CUSTOM, Source.DERIVED) for p in inputs):
                return [Producer(Source.DERIVED, expr, op.description)]
            if any(p.source is Source.UNKNOWN for p in inputs):
                return [Producer(Source.UNKNOWN, expr, op.description)]
            return [Producer(Source.REFERENCE, expr, op.description)]
        if op.kind is OpKind.CUSTOM_KERNEL:
            return [Producer(Source.CUSTOM, expr, op.description, op.callee)]
        if op.kind is OpKind.HELPER and op.target is not None:
            flows = self.flows(op.target, depth + 1) if depth < _MAX_DEPTH else []
            found = [p for flow in flows for p in flow.producers]
            return found or [Producer(Source.UNKNOWN, expr, op.description)]
        return [Producer(Source.UNKNOWN, expr, op.description)]

    # --- names, attributes and what is written into them ----------------------------------

    def _name_producers(self, expr: ast.Name | ast.Attribute, key: str, function: FunctionNode,
                        depth: int) -> list[Producer]:
        memo = (id(function), key, expr.lineno)
        if memo not in self._names:
            self._names[memo] = [Producer(Source.UNKNOWN, expr, key)]  # a cycle decides nothing
            self._names[memo] = self._trace_name(expr, key, function, depth)
        return self._names[memo]

    def _trace_name(self, expr: ast.Name | ast.Attribute, key: str, function: FunctionNode,
                    depth: int) -> list[Producer]:
        reaching = self._facts_of(function).reaching(key, expr.lineno)
        if not reaching:
            if key.startswith("self."):
                return self._stored_producers(expr, key, function, depth)
            is_input = function is self.analysis.forward and key in _parameters(function)
            return [Producer(Source.INPUT if is_input else Source.UNKNOWN, expr, key)]
        producers = [p for _line, value in reaching
                     for p in self._producers(value, function, depth + 1)]
        since = min(line for line, _value in reaching)
        return self._with_writes(expr, key, function, producers, since, depth)

    def _with_writes(self, expr: ast.AST, key: str, function: FunctionNode,
                     producers: list[Producer], since: int, depth: int) -> list[Producer]:
        """A buffer's value is what is written into it: a kernel it is handed to (an output
        parameter or an in-place kernel), `buf[...] = v`, `buf.copy_(v)`, `op(..., out=buf)`."""
        allocated = any(p.source in (Source.UNWRITTEN, Source.STORED) for p in producers)
        writes = self._writes(function, key, since, expr.lineno, depth, allocated)
        shown = f"`{key}`"
        if any(w.source in (Source.CUSTOM, Source.DERIVED) for w in writes):
            return [Producer(Source.CUSTOM, expr, f"{shown}, written by a custom kernel")]
        if not writes:
            return producers
        if any(p.source in (Source.UNWRITTEN, Source.STORED) for p in producers):
            return [p for p in producers if p.source not in (Source.UNWRITTEN, Source.STORED)] \
                + writes
        return producers + writes

    def _writes(self, function: FunctionNode, key: str, since: int, before: int,
                depth: int, allocated: bool = True) -> list[Producer]:
        """Producers of what `function` writes into `key` (or a view of it) between two lines.
        A fresh allocation (`allocated`) counts as written by any kernel or helper it is handed
        to, and as written by something unknown when it goes to code kaudit does not know
        (`from_dlpack(out)`, `out.data_ptr()`, a compiled callable); a computed value counts as
        rewritten only by a kernel called for its side effect (`ext.relu_(y)`)."""
        owner = self.analysis.owner.get(function)
        facts = self._facts_of(function)
        keys = facts.views_of(key)
        found: list[Producer] = []
        for node in facts.nodes:
            if not since <= getattr(node, "lineno", since) <= before:
                continue
            if isinstance(node, (ast.Assign, ast.AugAssign)):  # `buf[...] = v`, `buf[...] += v`
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Subscript) and _mentions(target.value, keys):
                        found.extend(self._producers(node.value, function, depth + 1))
                continue
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and _mentions(func.value, keys):
                if allocated and func.attr in _POINTERS:
                    found.append(Producer(Source.UNKNOWN, node, f"`{key}` handed over by pointer"))
                elif func.attr == "copy_" and node.args:
                    found.extend(self._producers(node.args[0], function, depth + 1))
                elif func.attr.endswith("_") and func.attr not in _FILLS \
                        and not func.attr.startswith("_"):
                    found.extend(self._op_producers(
                        Op(OpKind.REFERENCE_OP, node, f"`.{func.attr}()`"), node, function,
                        depth + 1))
                continue
            out = next((k.value for k in node.keywords if k.arg == "out"), None)
            arguments = [*node.args, *(k.value for k in node.keywords if k.arg != "out")]
            if out is not None and _mentions(out, keys):
                for op in self.analysis.classify_all(node, owner, function):
                    found.extend(self._op_producers(op, node, function, depth + 1))
                continue
            if any(_mentions(argument, keys) for argument in arguments):
                ops = self.analysis.classify_all(node, owner, function)
                if any(op.kind in (OpKind.CUSTOM_KERNEL, OpKind.HELPER) for op in ops) \
                        and (allocated or id(node) in facts.discarded):
                    found.append(Producer(Source.CUSTOM, node, f"`{key}`, written by a kernel"))
                elif allocated and not ops and not (self.model.bindings.resolve(func) or
                                                    "").startswith("torch."):
                    found.append(Producer(Source.UNKNOWN, node, f"`{key}` handed to "
                                                                f"`{self.model.code_of(func)}`"))
        return found

    def _stored_producers(self, expr: ast.AST, key: str, function: FunctionNode,
                          depth: int) -> list[Producer]:
        """`self.x` that forward does not assign: a weight or buffer (an input of the model),
        unless every value the class stores there is made once (`torch.ones(...)` in
        `__init__`) and nothing on the forward path writes it."""
        cls = self.analysis.owner.get(function)
        attribute = key[len("self."):]
        stored = self._stored_values(cls, attribute) if cls is not None else []
        if stored and all(self._is_constant(value) for value in stored):
            written = [p for reached in self.analysis.reachable
                       for p in self._writes(reached, key, 0, 10**9, depth)]
            if written:
                return self._with_writes(expr, key, function, [], 0, depth)
            first = stored[0]
            return [Producer(Source.STORED, expr,
                             f"`{key}`, made once (line {self.model.line_of(first)}: "
                             f"`{self.model.code_of(first)[:50]}`)")]
        if any(key in self._facts_of(reached).assignments for reached in self.analysis.reachable):
            # set by a helper on the forward path (`self._run_kernel(x)` updating `self.hidden`)
            return [Producer(Source.UNKNOWN, expr, f"`{key}`, set on the forward path")]
        return [Producer(Source.INPUT, expr, self.model.code_of(expr))]

    def _stored_values(self, cls: ast.ClassDef, attribute: str) -> list[ast.AST]:
        values: list[ast.AST] = []
        for owner in self.analysis.callees.bases(cls):
            for method in owner.body:
                if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in walk_code(method.body, into_functions=False):
                    if isinstance(node, ast.Assign) and any(
                            _key_of(t) == f"self.{attribute}" for t in node.targets):
                        values.append(node.value)
                    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                            and node.func.attr == "register_buffer" and len(node.args) >= 2 \
                            and isinstance(node.args[0], ast.Constant) \
                            and node.args[0].value == attribute:
                        values.append(node.args[1])
        return values

    def _is_constant(self, value: ast.AST) -> bool:
        if not isinstance(value, ast.Call):
            return False
        resolved = self.model.bindings.resolve(value.func) or ""
        return resolved.startswith("torch.") and resolved[len("torch."):] in _CONSTANTS

    def _operands(self, expr: ast.AST) -> list[ast.AST]:
        """What an op reads: both sides of an operator; a call's arguments, and its receiver
        when it is a tensor method (`x.sum()`), not a module (`torch.sum(x)`)."""
        if isinstance(expr, ast.BinOp):
            return [expr.left, expr.right]
        if isinstance(expr, ast.UnaryOp):
            return [expr.operand]
        if isinstance(expr, ast.AugAssign):
            return [expr.target, expr.value]
        assert isinstance(expr, ast.Call)
        func = expr.func
        is_method = isinstance(func, ast.Attribute) and self.model.bindings.resolve(func) is None
        receiver = [func.value] if is_method else []  # type: ignore[attr-defined]
        return [*receiver, *expr.args, *(k.value for k in expr.keywords if k.arg != "out")]

    def _is_allocation(self, func: ast.AST) -> bool:
        resolved = self.model.bindings.resolve(func) or ""
        if resolved.startswith("torch.") and resolved[len("torch."):] in ALLOCATIONS:
            return True
        return isinstance(func, ast.Attribute) and func.attr.startswith("new_") \
            and func.attr in ALLOCATIONS

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


def _key_of(expr: ast.AST) -> str | None:
    """`x` -> "x", `self.buf` -> "self.buf"; None for anything else."""
    parts = dotted_parts(expr)
    if parts and (len(parts) == 1 or (len(parts) == 2 and parts[0] == "self")):
        return ".".join(parts)
    return None


def _mentions(expr: ast.AST, keys: set[str]) -> bool:
    """The expression is one of `keys`, or a view of one (`out.view(-1)`, `out[0]`), or a list
    holding one (`args=[a, b, out]`)."""
    if isinstance(expr, (ast.List, ast.Tuple)):
        return any(_mentions(element, keys) for element in expr.elts)
    while True:
        if _key_of(expr) in keys:
            return True
        if isinstance(expr, ast.Subscript):
            expr = expr.value
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                and expr.func.attr in PASS_THROUGH_METHODS:
            expr = expr.func.value
        else:
            return False


_VIEW_METHODS = PASS_THROUGH_METHODS | {"chunk", "split", "unbind", "select", "tensor_split"}


class _FunctionFacts:
    """One walk over a function body, kept for every question the tracer asks about it."""

    def __init__(self, function: FunctionNode) -> None:
        self.nodes = list(walk_code(function.body, into_functions=False))
        self.returns = [n for n in self.nodes if isinstance(n, ast.Return) and n.value is not None]
        top_level = {id(statement) for statement in function.body}
        #: key -> (line, at top level, value) of each assignment, in source order
        self.assignments: dict[str, list[tuple[int, bool, ast.AST]]] = {}
        #: calls whose result is dropped (a statement of their own, or assigned to `_`)
        self.discarded: set[int] = set()
        self._pairs: list[tuple[ast.AST, ast.AST]] = []  # (target, value) for view aliases
        self._views: dict[str, set[str]] = {}
        for node in self.nodes:
            value, targets = None, []
            if isinstance(node, ast.Assign):
                value, targets = node.value, node.targets
                self._pairs.extend((target, node.value) for target in node.targets)
                if isinstance(node.value, ast.Call) and all(
                        isinstance(t, ast.Name) and t.id == "_" for t in node.targets):
                    self.discarded.add(id(node.value))
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                value, targets = node.value, [node.target]
            elif isinstance(node, ast.AugAssign):
                value = ast.copy_location(ast.BinOp(
                    left=ast.copy_location(_load_of(node.target), node.target), op=node.op,
                    right=node.value), node)
                targets = [node.target]
            elif isinstance(node, ast.NamedExpr):
                value, targets = node.value, [node.target]
            elif isinstance(node, (ast.For, ast.comprehension)):
                self._pairs.append((node.target, node.iter))
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                self.discarded.add(id(node.value))
            if value is None:
                continue
            for key in {k for target in targets for k in _bound_keys(target)}:
                self.assignments.setdefault(key, []).append(
                    (node.lineno, id(node) in top_level, value))

    def reaching(self, key: str, before_line: int) -> list[tuple[int, ast.AST]]:
        """Values that may reach a use of `key` (a name or `self.attr`) on `before_line`: the
        last assignment in the function's top-level body above it, and every nested (branch,
        loop) assignment after that one. An over-approximation, which only makes the data-flow
        rules quieter."""
        assignments = sorted((a for a in self.assignments.get(key, []) if a[0] < before_line),
                             key=lambda a: a[0])
        last_top = max((i for i, a in enumerate(assignments) if a[1]), default=0)
        return [(a[0], a[2]) for a in assignments[last_top:]]

    def views_of(self, key: str) -> set[str]:
        """`key` and the local names bound to views of it (`ys = y[0]`, `for ys in
        y.chunk(2)`, `for s, ys in zip(streams, y.chunk(2))`)."""
        if key not in self._views:
            keys = {key}
            for _ in range(3):
                for target, value in self._pairs:
                    if _is_view(value, keys):
                        keys.update(_bound_keys(target))
            self._views[key] = keys
        return self._views[key]


def _is_view(expr: ast.AST, keys: set[str]) -> bool:
    if _key_of(expr) in keys:
        return True
    if isinstance(expr, ast.Subscript):
        return _is_view(expr.value, keys)
    if isinstance(expr, ast.IfExp):  # `y.view(-1) if flat else y.reshape(n, -1)`
        return _is_view(expr.body, keys) or _is_view(expr.orelse, keys)
    if isinstance(expr, ast.Attribute) and expr.attr in ("T", "mT", "H", "mH", "real", "imag"):
        return _is_view(expr.value, keys)
    if isinstance(expr, ast.Call):
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr in _VIEW_METHODS:
            return _is_view(func.value, keys)
        if isinstance(func, ast.Name) and func.id in ("zip", "enumerate", "reversed", "list"):
            return any(_is_view(argument, keys) for argument in expr.args)
    return False


def _bound_keys(target: ast.AST) -> list[str]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [key for element in target.elts for key in _bound_keys(element)]
    key = _key_of(target)
    return [key] if key is not None else []


def _load_of(target: ast.expr) -> ast.expr:
    """A fresh expression reading what an augmented assignment's target holds."""
    if isinstance(target, ast.Attribute):
        return ast.Attribute(value=target.value, attr=target.attr, ctx=ast.Load())
    if isinstance(target, ast.Name):
        return ast.Name(id=target.id, ctx=ast.Load())
    return target


def _parameters(function: FunctionNode) -> set[str]:
    args = function.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} | \
        {a.arg for a in (args.vararg, args.kwarg) if a is not None}

