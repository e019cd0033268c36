"""What `ModelNew.forward` really runs: the functions reachable from it and what each call does.

Every call on a forward path is put in one of a few kinds (a PyTorch op, the reference `Model`, a
custom kernel, a helper that is followed further). The fallback and bypass rules are small queries
over this classification, so they agree with each other on what counts as "the reference".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import libcst as cst

from kaudit.python_scope import dotted_parts
from kaudit.source import SourceModel
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
    node: cst.CSTNode
    description: str
    target: cst.FunctionDef | None = None


def is_reference_model_name(model: SourceModel, expr: cst.BaseExpression) -> bool:
    parts = dotted_parts(expr)
    resolved = model.bindings.resolve(expr) or ""
    return bool(parts) and (parts[-1] == "Model" or resolved.endswith(".Model"))


class ForwardAnalysis:
    """Forward-path facts for one file; built once per model and shared by the rules."""

    def __init__(self, model: SourceModel) -> None:
        self.model = model
        self.model_new = model.model_new
        self.owner: dict[cst.FunctionDef, cst.ClassDef | None] = {}
        self._kinds_cache: dict[cst.FunctionDef, frozenset[OpKind]] = {}
        self._ops_cache: dict[tuple[cst.CSTNode, cst.ClassDef | None], list[Op]] = {}
        self._attrs_cache: dict[cst.ClassDef, dict[str, cst.BaseExpression]] = {}
        self.extension_names = self._extension_names()
        self.forward = self._method(self.model_new, "forward") if self.model_new else None
        self.reachable: list[cst.FunctionDef] = []
        if self.forward is not None:
            self._collect_reachable(self.forward, self.model_new)

    @classmethod
    def of(cls, model: SourceModel) -> ForwardAnalysis:
        cached = getattr(model, "_forward_analysis", None)
        if cached is None:
            cached = cls(model)
            model._forward_analysis = cached  # type: ignore[attr-defined]
        return cached

    # --- reachability ---------------------------------------------------------------------

    def _collect_reachable(self, start: cst.FunctionDef, owner: cst.ClassDef | None) -> None:
        pending = [(start, owner)]
        while pending:
            function, cls = pending.pop(0)
            if function in self.owner:
                continue
            self.owner[function] = cls
            self.reachable.append(function)
            for op in self.ops_in(function, cls):
                if op.kind is OpKind.HELPER and op.target is not None:
                    pending.append((op.target, self._class_of(op.target)))

    def _class_of(self, function: cst.FunctionDef) -> cst.ClassDef | None:
        for cls in self.model.classes.values():
            if function in _methods(cls).values():
                return cls
        return None

    # --- classification -------------------------------------------------------------------

    def ops_in(self, node: cst.CSTNode, cls: cst.ClassDef | None = None) -> list[Op]:
        """The classified calls and `@` operations directly inside `node` (helpers not entered)."""
        if cls is None and isinstance(node, cst.FunctionDef):
            cls = self.owner.get(node)
        key = (node, cls)
        if key in self._ops_cache:
            return self._ops_cache[key]
        collector = _OpCollector()
        if isinstance(node, cst.FunctionDef):
            node.body.visit(collector)
        else:
            node.visit(collector)
        ops = []
        for found in collector.nodes:
            op = self._classify(found, cls)
            if op is not None:
                ops.append(op)
        self._ops_cache[key] = ops
        return ops

    def kinds_reached(self, node: cst.CSTNode, cls: cst.ClassDef | None) -> set[OpKind]:
        """Kinds of op that running `node` can reach, following helpers transitively."""
        kinds: set[OpKind] = set()
        for op in self.ops_in(node, cls):
            kinds.add(op.kind)
            if op.kind is OpKind.HELPER and op.target is not None:
                kinds |= self._kinds_of_function(op.target)
        return kinds

    def reference_ops_reached(self, node: cst.CSTNode, cls: cst.ClassDef | None) -> list[Op]:
        """Reference ops `node` runs, directly or through helpers (for evidence in messages)."""
        found: list[Op] = []
        for op in self.ops_in(node, cls):
            if op.kind in REFERENCE_KINDS:
                found.append(op)
            elif op.kind is OpKind.HELPER and op.target is not None \
                    and self._kinds_of_function(op.target) & REFERENCE_KINDS:
                found.append(op)
        return found

    def _kinds_of_function(self, function: cst.FunctionDef) -> frozenset[OpKind]:
        if function in self._kinds_cache:
            return self._kinds_cache[function]
        kinds: set[OpKind] = set()
        seen: set[cst.FunctionDef] = set()
        pending = [function]
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            for op in self.ops_in(current, self._class_of(current)):
                kinds.add(op.kind)
                if op.kind is OpKind.HELPER and op.target is not None:
                    pending.append(op.target)
        self._kinds_cache[function] = frozenset(kinds)
        return self._kinds_cache[function]

    def _classify(self, node: cst.CSTNode, cls: cst.ClassDef | None) -> Op | None:
        if isinstance(node, (cst.BinaryOperation, cst.AugAssign)):
            return Op(OpKind.REFERENCE_OP, node, "the `@` operator (torch.matmul)")
        assert isinstance(node, cst.Call)
        func = node.func
        model = self.model
        if isinstance(func, cst.Subscript):
            kernel = dotted_parts(func.value)
            if kernel and kernel[-1] in model.triton_kernels:
                return Op(OpKind.CUSTOM_KERNEL, node, f"Triton kernel `{kernel[-1]}`")
            return None
        if isinstance(func, cst.Call) and is_reference_model_name(model, func.func):
            return Op(OpKind.REFERENCE_MODEL, node, "a freshly built reference `Model`")
        if isinstance(func, cst.Attribute) and _is_super_call(func.value):
            if func.attr.value in ("forward", "__call__"):
                return Op(OpKind.REFERENCE_MODEL, node, "`super().forward`")
            return None
        parts = dotted_parts(func)
        if parts is None:
            return self._tensor_method(node, func)
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
        if self._is_extension(parts[:-1]):
            return Op(OpKind.CUSTOM_KERNEL, node, f"extension function `{written}`")
        if len(parts) == 1 and parts[0] in model.functions:
            target = model.functions[parts[0]]
            if parts[0] in model.triton_kernels:
                return None
            return Op(OpKind.HELPER, node, f"`{written}`", target)
        if len(parts) == 2 and parts[1] == "apply" and parts[0] in model.classes:
            target = _methods(model.classes[parts[0]]).get("forward")
            if target is not None:
                return Op(OpKind.HELPER, node, f"`{written}`", target)
        if len(parts) == 1 and parts[0] in model.classes:
            return None  # constructing an object; calling it later is classified then
        if parts[0] in model.bindings.qualified:
            return None  # another module's function (math.sqrt, np.prod, triton.cdiv)
        return self._tensor_method(node, func)

    def _self_call(self, node: cst.Call, parts: list[str], cls: cst.ClassDef) -> Op | None:
        written = ".".join(parts)
        methods = _methods(cls)
        if cls not in self._attrs_cache:
            self._attrs_cache[cls] = _self_attributes(cls)
        attrs = self._attrs_cache[cls]
        if len(parts) == 2 and parts[1] in methods:
            return Op(OpKind.HELPER, node, f"`{written}`", methods[parts[1]])
        if len(parts) >= 2 and parts[1] in attrs:
            value = attrs[parts[1]]
            calls_module = len(parts) == 2 or (len(parts) == 3 and parts[2] in ("forward", "__call__"))
            if self._is_extension_value(value):
                return Op(OpKind.CUSTOM_KERNEL, node, f"extension function `{written}`")
            if calls_module and isinstance(value, cst.Call):
                if is_reference_model_name(self.model, value.func):
                    return Op(OpKind.REFERENCE_MODEL, node,
                              f"reference `Model` instance `self.{parts[1]}`")
                module_name = self._computing_nn_module(value)
                if module_name:
                    return Op(OpKind.REFERENCE_OP, node,
                              f"`{module_name}` module `self.{parts[1]}`")
                local = dotted_parts(value.func)
                if local and len(local) == 1 and local[0] in self.model.classes:
                    target = _methods(self.model.classes[local[0]]).get("forward")
                    if target is not None:
                        return Op(OpKind.HELPER, node, f"`{written}`", target)
        return self._tensor_method(node, node.func)

    def _tensor_method(self, node: cst.Call, func: cst.BaseExpression) -> Op | None:
        if isinstance(func, cst.Attribute) and func.attr.value in TENSOR_COMPUTE_METHODS:
            return Op(OpKind.REFERENCE_OP, node, f"tensor method `.{func.attr.value}()`")
        return None

    def _computing_nn_module(self, value: cst.Call) -> str | None:
        """`nn.Linear(...)` -> "torch.nn.Linear"; a Sequential holding one counts too."""
        resolved = self.model.bindings.resolve(value.func) or ""
        if not resolved.startswith("torch.nn."):
            return None
        class_name = resolved[len("torch.nn."):]
        if class_name in NN_CONTAINERS:
            for arg in value.args:
                inner = arg.value
                if isinstance(inner, cst.Call) and self._computing_nn_module(inner):
                    return f"{resolved} of {self._computing_nn_module(inner)}"
            return None
        return resolved if nn_module_computes(class_name) else None

    # --- extensions -----------------------------------------------------------------------

    def _extension_names(self) -> set[str]:
        """Names and `self.attr`s that hold a compiled extension module."""
        names = {name for ext in self.model.extensions for name in ext.bound_to}
        builders = {name for name, fn in self.model.functions.items()
                    if any(_contains(fn, ext.call) for ext in self.model.extensions)}
        for name, assigned in self.model.bindings.assignments.items():
            for _op, value in assigned:
                if isinstance(value, cst.Call) and dotted_parts(value.func) in ([b] for b in builders):
                    names.add(name)
        return names

    def _is_extension(self, parts: list[str]) -> bool:
        return bool(parts) and ".".join(parts) in self.extension_names

    def _is_extension_value(self, value: cst.BaseExpression) -> bool:
        parts = dotted_parts(value)
        if parts is not None:
            return self._is_extension(parts)
        return isinstance(value, cst.Call) and any(value is ext.call for ext in self.model.extensions)

    def _method(self, cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
        return _methods(cls).get(name)


def _is_super_call(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "super"


def _contains(tree: cst.CSTNode, target: cst.CSTNode) -> bool:
    found = False

    class Finder(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nonlocal found
            if node is target:
                found = True
            return not found

    tree.visit(Finder())
    return found


def _methods(cls: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    return {stmt.name.value: stmt for stmt in cls.body.body if isinstance(stmt, cst.FunctionDef)}


def _self_attributes(cls: cst.ClassDef) -> dict[str, cst.BaseExpression]:
    """`self.X = value` assignments anywhere in the class's methods (last one wins)."""
    attrs: dict[str, cst.BaseExpression] = {}

    class Collect(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                parts = dotted_parts(target.target)
                if parts and len(parts) == 2 and parts[0] == "self":
                    attrs[parts[1]] = node.value

    cls.body.visit(Collect())
    return attrs


class _OpCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.nodes: list[cst.CSTNode] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Call(self, node: cst.Call) -> None:
        self.nodes.append(node)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if isinstance(node.operator, cst.MatrixMultiply):
            self.nodes.append(node)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.operator, cst.MatrixMultiplyAssign):
            self.nodes.append(node)
