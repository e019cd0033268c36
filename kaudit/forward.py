"""What `ModelNew.forward` really runs: the functions reachable from it and what each call does.

Every call on a forward path is put in one of a few kinds (a PyTorch op, the reference `Model`, a
custom kernel, a helper that is followed further). The fallback and bypass rules are small queries
over this classification, so they agree with each other on what counts as "the reference".
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kaudit.python_scope import dotted_parts
from kaudit.source import FunctionNode, SourceModel, child_nodes
from kaudit.torch_ops import (
    NN_CONTAINERS,
    TENSOR_COMPUTE_METHODS,
    is_torch_compute,
    nn_module_computes,
)


class OpKind(enum.Enum):
    REFERENCE_OP = "reference-op"  # a PyTorch compute op, nn module call, tensor method or `@`
    REFERENCE_MODEL = "reference-model"  # super().forward, Model.forward, a Model instance call
    CUSTOM_KERNEL = "custom-kernel"  # an extension function, a Triton launch, torch.ops.*
    HELPER = "helper"  # a function or method defined in the file, followed further


REFERENCE_KINDS = frozenset({OpKind.REFERENCE_OP, OpKind.REFERENCE_MODEL})


@dataclass(frozen=True)
class Op:
    kind: OpKind
    node: ast.AST
    description: str
    target: FunctionNode | None = None


def is_reference_model_name(model: SourceModel, expr: ast.AST) -> bool:
    """`Model`, `problem.Model`, or a name imported as the reference (`from ref import Model as R`)."""
    parts = dotted_parts(expr)
    resolved = model.bindings.resolve(expr) or ""
    return bool(parts) and (parts[-1] == "Model" or resolved.endswith(".Model"))


def methods_of(cls: ast.ClassDef) -> dict[str, FunctionNode]:
    return {s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}


def walk_code(nodes: Sequence[ast.AST], *, into_functions: bool = True) -> Iterator[ast.AST]:
    """Every node under `nodes` in source order (expression contexts left out), not entering
    nested class bodies (their code runs elsewhere), nor nested functions and lambdas when
    `into_functions` is False. The rules walk the same function bodies many times, so the
    last walks are kept (with `nodes` itself, so that its id cannot be reused meanwhile)."""
    key = (id(nodes), into_functions)
    cached = _WALKS.get(key)
    if cached is None:
        if len(_WALKS) >= _WALKS_KEPT:
            _WALKS.clear()
        stop = ast.ClassDef if into_functions else _NESTED_SCOPES
        found: list[ast.AST] = []
        stack = list(reversed(nodes))
        while stack:
            node = stack.pop()
            found.append(node)
            if not isinstance(node, stop):
                stack.extend(reversed(child_nodes(node)))
        cached = _WALKS[key] = (nodes, found)
    return iter(cached[1])


_NESTED_SCOPES = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_WALKS: dict[tuple[int, bool], tuple[Sequence[ast.AST], list[ast.AST]]] = {}
_WALKS_KEPT = 512


class ForwardAnalysis:
    """Forward-path facts for one file; built once per model and shared by the rules."""

    def __init__(self, model: SourceModel) -> None:
        self.model = model
        self.model_new = model.model_new
        self.owner: dict[FunctionNode, ast.ClassDef | None] = {}
        self._ops_cache: dict[tuple[int, int, int], list[Op]] = {}
        self._kinds_cache: dict[FunctionNode, frozenset[OpKind]] = {}
        self._attrs_cache: dict[ast.ClassDef, dict[str, ast.expr]] = {}
        self.extension_names = self._extension_names()
        self.forward = methods_of(self.model_new).get("forward") if self.model_new else None
        self.reachable: list[FunctionNode] = []
        if self.forward is not None:
            self._collect_reachable(self.forward, self.model_new)

    @classmethod
    def of(cls, model: SourceModel) -> ForwardAnalysis:
        return model.memo("forward", lambda: cls(model))

    # --- reachability ---------------------------------------------------------------------

    def _collect_reachable(self, start: FunctionNode, owner: ast.ClassDef | None) -> None:
        pending = [(start, owner)]
        while pending:
            function, cls = pending.pop(0)
            if function in self.owner:
                continue
            self.owner[function] = cls
            self.reachable.append(function)
            for op in self.ops_in(function.body, cls):
                if op.kind is OpKind.HELPER and op.target is not None:
                    pending.append((op.target, self.class_of(op.target)))

    def class_of(self, function: FunctionNode) -> ast.ClassDef | None:
        for cls in self.model.classes.values():
            if function in cls.body:
                return cls
        return None

    # --- classification -------------------------------------------------------------------

    def ops_in(self, nodes: Sequence[ast.AST], cls: ast.ClassDef | None) -> list[Op]:
        """Classified calls and `@` operations directly inside `nodes` (helpers not entered)."""
        key = (id(nodes[0]) if nodes else 0, len(nodes), id(cls))
        if key in self._ops_cache:
            return self._ops_cache[key]
        ops = []
        for node in walk_code(nodes):
            op = self.classify(node, cls)
            if op is not None:
                ops.append(op)
        self._ops_cache[key] = ops
        return ops

    def function_ops(self, function: FunctionNode) -> list[Op]:
        return self.ops_in(function.body, self.owner.get(function, self.class_of(function)))

    def kinds_reached(self, nodes: Sequence[ast.AST], cls: ast.ClassDef | None) -> set[OpKind]:
        """Kinds of op that running `nodes` can reach, following helpers transitively."""
        kinds: set[OpKind] = set()
        for op in self.ops_in(nodes, cls):
            kinds.add(op.kind)
            if op.kind is OpKind.HELPER and op.target is not None:
                kinds |= self._kinds_of_function(op.target)
        return kinds

    def reference_ops_reached(self, nodes: Sequence[ast.AST], cls: ast.ClassDef | None) -> list[Op]:
        """Reference ops `nodes` run, directly or through a helper (for evidence in messages)."""
        return [op for op in self.ops_in(nodes, cls)
                if op.kind in REFERENCE_KINDS or (op.kind is OpKind.HELPER and op.target is not None
                                                  and self._kinds_of_function(op.target) & REFERENCE_KINDS)]

    def _kinds_of_function(self, function: FunctionNode) -> frozenset[OpKind]:
        if function not in self._kinds_cache:
            kinds: set[OpKind] = set()
            seen: set[FunctionNode] = set()
            pending = [function]
            while pending:
                current = pending.pop()
                if current in seen:
                    continue
                seen.add(current)
                for op in self.ops_in(current.body, self.class_of(current)):
                    kinds.add(op.kind)
                    if op.kind is OpKind.HELPER and op.target is not None:
                        pending.append(op.target)
            self._kinds_cache[function] = frozenset(kinds)
        return self._kinds_cache[function]

    def classify(self, node: ast.AST, cls: ast.ClassDef | None) -> Op | None:
        """The kind of one call or `@` operation, seen from a method of `cls`."""
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
            return Op(OpKind.REFERENCE_OP, node, "the `@` operator (torch.matmul)")
        if not isinstance(node, ast.Call):
            return None
        func = node.func
        model = self.model
        if isinstance(func, ast.Subscript):
            kernel = dotted_parts(func.value)
            if kernel and kernel[-1] in model.triton_kernels:
                return Op(OpKind.CUSTOM_KERNEL, node, f"Triton kernel `{kernel[-1]}`")
            return None
        if isinstance(func, ast.Call) and is_reference_model_name(model, func.func):
            return Op(OpKind.REFERENCE_MODEL, node, "a freshly built reference `Model`")
        if isinstance(func, ast.Attribute) and _is_super_call(func.value):
            if func.attr in ("forward", "__call__"):
                return Op(OpKind.REFERENCE_MODEL, node, "`super().forward`")
            return None
        parts = dotted_parts(func)
        if parts is None:
            return self._tensor_method(node)
        written = ".".join(parts)
        resolved = model.bindings.resolve(func)
        if resolved is not None:
            if resolved.startswith("torch.ops."):
                return Op(OpKind.CUSTOM_KERNEL, node, f"custom op `{written}`")
            if is_torch_compute(resolved):
                alias = "" if written == resolved else f" (written `{written}`)"
                return Op(OpKind.REFERENCE_OP, node, f"`{resolved}`{alias}")
            if resolved.startswith("torch."):
                return None
        if len(parts) == 2 and parts[1] in ("forward", "__call__") and \
                is_reference_model_name(model, func.value):  # type: ignore[attr-defined]
            return Op(OpKind.REFERENCE_MODEL, node, f"`{written}`")
        if parts[0] == "self" and cls is not None:
            return self._self_call(node, parts, cls)
        if len(parts) > 1 and ".".join(parts[:-1]) in self.extension_names:
            return Op(OpKind.CUSTOM_KERNEL, node, f"extension function `{written}`")
        if len(parts) == 1 and parts[0] in model.functions:
            if parts[0] in model.triton_kernels:
                return None
            return Op(OpKind.HELPER, node, f"`{written}`", model.functions[parts[0]])
        if len(parts) == 2 and parts[1] == "apply" and parts[0] in model.classes:
            target = methods_of(model.classes[parts[0]]).get("forward")
            return None if target is None else Op(OpKind.HELPER, node, f"`{written}`", target)
        if len(parts) == 1 and parts[0] in model.classes:
            return None  # constructing an object; calling it later is classified then
        if parts[0] in model.bindings.qualified:
            return None  # another module's function (math.sqrt, np.prod, triton.cdiv)
        return self._tensor_method(node)

    def _self_call(self, node: ast.Call, parts: list[str], cls: ast.ClassDef) -> Op | None:
        written = ".".join(parts)
        methods = methods_of(cls)
        if len(parts) == 2 and parts[1] in methods:
            return Op(OpKind.HELPER, node, f"`{written}`", methods[parts[1]])
        value = self._self_attributes(cls).get(parts[1]) if len(parts) >= 2 else None
        if value is None:
            return self._tensor_method(node)
        if self._is_extension_value(value):
            return Op(OpKind.CUSTOM_KERNEL, node, f"extension function `{written}`")
        calls_module = len(parts) == 2 or (len(parts) == 3 and parts[2] in ("forward", "__call__"))
        if calls_module and isinstance(value, ast.Call):
            if is_reference_model_name(self.model, value.func):
                return Op(OpKind.REFERENCE_MODEL, node, f"reference `Model` instance `self.{parts[1]}`")
            module_name = self._computing_nn_module(value)
            if module_name:
                return Op(OpKind.REFERENCE_OP, node, f"`{module_name}` module `self.{parts[1]}`")
            local = dotted_parts(value.func)
            if local and len(local) == 1 and local[0] in self.model.classes:
                target = methods_of(self.model.classes[local[0]]).get("forward")
                if target is not None:
                    return Op(OpKind.HELPER, node, f"`{written}`", target)
        return self._tensor_method(node)

    @staticmethod
    def _tensor_method(node: ast.Call) -> Op | None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in TENSOR_COMPUTE_METHODS:
            return Op(OpKind.REFERENCE_OP, node, f"tensor method `.{func.attr}()`")
        return None

    def _computing_nn_module(self, value: ast.Call) -> str | None:
        """`nn.Linear(...)` -> "torch.nn.Linear"; a Sequential holding one counts too."""
        resolved = self.model.bindings.resolve(value.func) or ""
        if not resolved.startswith("torch.nn."):
            return None
        class_name = resolved[len("torch.nn."):]
        if class_name in NN_CONTAINERS:
            for inner in value.args:
                inner_name = self._computing_nn_module(inner) if isinstance(inner, ast.Call) else None
                if inner_name:
                    return f"{resolved} of {inner_name}"
            return None
        return resolved if nn_module_computes(class_name) else None

    def _self_attributes(self, cls: ast.ClassDef) -> dict[str, ast.expr]:
        """`self.X = value` assignments anywhere in the class's methods (last one wins)."""
        if cls not in self._attrs_cache:
            attrs: dict[str, ast.expr] = {}
            for node in walk_code(cls.body):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        parts = dotted_parts(target)
                        if parts and len(parts) == 2 and parts[0] == "self":
                            attrs[parts[1]] = node.value
            self._attrs_cache[cls] = attrs
        return self._attrs_cache[cls]

    # --- extensions -----------------------------------------------------------------------

    def _extension_names(self) -> set[str]:
        """Names and `self.attr`s that hold a compiled extension module."""
        names = {name for ext in self.model.extensions for name in ext.bound_to}
        lines = [ext.call.lineno for ext in self.model.extensions]
        builders = {name for name, function in self.model.functions.items()
                    if any(function.lineno <= line <= (function.end_lineno or 0) for line in lines)}
        for name, assigned in self.model.bindings.assignments.items():
            for _op, value in assigned:
                if isinstance(value, ast.Call) and (dotted_parts(value.func) or [""])[-1] in builders:
                    names.add(name)
        return names

    def _is_extension_value(self, value: ast.expr) -> bool:
        parts = dotted_parts(value)
        if parts is not None:
            return ".".join(parts) in self.extension_names
        return isinstance(value, ast.Call) and any(value is ext.call for ext in self.model.extensions)


def _is_super_call(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "super"
