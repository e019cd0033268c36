"""What the entry point (`ModelNew.forward`, or the function a benchmark calls) really runs: the
functions reachable from it and what each call does.

Every call on a forward path is put in one of a few kinds (a PyTorch op, the reference `Model`, a
custom kernel, a helper that is followed further). The fallback and bypass rules are small queries
over this classification, so they agree with each other on what counts as "the reference". What a
called name or attribute holds (`self.op = ext.fn`, modules in containers, `getattr`, loops) is
resolved by `kaudit.callees`.
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from kaudit.callees import Callees, Held, Kind, methods_of
from kaudit.python_scope import dotted_parts
from kaudit.source import FunctionNode, SourceModel, walk_code
from kaudit.torch_ops import TENSOR_COMPUTE_METHODS, is_torch_compute

__all__ = ["REFERENCE_KINDS", "ForwardAnalysis", "Op", "OpKind", "is_reference_model_name",
           "methods_of", "walk_code"]


class OpKind(enum.Enum):
    REFERENCE_OP = "reference-op"  # a PyTorch compute op, nn module call, tensor method or operator
    REFERENCE_MODEL = "reference-model"  # super().forward, Model.forward, a Model instance call
    CUSTOM_KERNEL = "custom-kernel"  # an extension function, a Triton launch, torch.ops.*
    HELPER = "helper"  # a function or method defined in the file, followed further


REFERENCE_KINDS = frozenset({OpKind.REFERENCE_OP, OpKind.REFERENCE_MODEL})
_ARITHMETIC = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
               ast.Mod: "%", ast.Pow: "**"}
# Tensor methods and attributes that hand back a tensor made from the receiver's data.
_TENSOR_RESULT_METHODS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "contiguous", "clone", "to", "float", "double",
    "half", "bfloat16", "cuda", "cpu", "squeeze", "unsqueeze", "flatten", "permute", "transpose",
    "t", "expand", "expand_as", "narrow", "detach", "type_as", "unflatten", "movedim", "repeat",
    "index_select", "gather", "masked_fill", "new_empty", "new_zeros", "new_ones", "new_full",
})
_TENSOR_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag"})
_PARAMETER_ATTRIBUTES = frozenset({"weight", "bias", "running_mean", "running_var"})
# torch.* functions that return no tensor
_NOT_TENSOR = frozenset({"numel", "is_tensor", "is_floating_point", "is_complex", "finfo",
                         "iinfo", "device", "dtype", "Size", "result_type", "promote_types",
                         "can_cast", "get_default_dtype", "no_grad", "enable_grad",
                         "inference_mode", "set_grad_enabled", "manual_seed", "compile"})
_ATEN_NAMESPACES = ("torch.ops.aten.", "torch.ops.prims.")


@dataclass(frozen=True)
class Op:
    kind: OpKind
    node: ast.AST
    description: str
    target: FunctionNode | None = None
    #: for a custom kernel: the extension function, Triton kernel or custom op it runs
    callee: str = ""


def is_reference_model_name(model: SourceModel, expr: ast.AST) -> bool:
    """`Model`, `problem.Model`, or a name imported as the reference (`from ref import Model as
    R`); not the file's own `Model` when that class runs custom kernels (a rewritten model)."""
    return ForwardAnalysis.of(model).is_reference(expr)


class ForwardAnalysis:
    """Forward-path facts for one file; built once per model and shared by the rules."""

    def __init__(self, model: SourceModel) -> None:
        self.model = model
        self.model_new = model.model_new
        self.owner: dict[FunctionNode, ast.ClassDef | None] = {}
        self._ops_cache: dict[tuple[int, int, int], list[Op]] = {}
        self._kinds_cache: dict[FunctionNode, frozenset[OpKind]] = {}
        self._tensor_names: dict[tuple[int, str], bool] = {}
        self._injected: list[FunctionNode] | None = None
        self.extension_names = self._extension_names()
        self.model_is_rewritten = False  # while deciding, the file's `Model` is the reference
        self.forward: FunctionNode | None = None
        if "Model" in model.classes:
            self.callees = Callees(model, self.extension_names, self.is_reference)
            forward = self.callees.methods(model.classes["Model"]).get("forward")
            rewritten = forward is not None and \
                OpKind.CUSTOM_KERNEL in self._kinds_of_function(forward)
            self._ops_cache.clear()
            self._kinds_cache.clear()
            self._tensor_names.clear()
            self.model_is_rewritten = rewritten
        self.callees = Callees(model, self.extension_names, self.is_reference)
        self.forward = self.methods(self.model_new).get("forward") if self.model_new \
            else model.entry_function
        self.reachable: list[FunctionNode] = []
        #: what `self.forward = ...` in a method rebinds forward to (it runs instead)
        self.rebound: list[FunctionNode] = []
        if self.forward is not None and self.model_new is not None:
            for held in self.callees.attribute(self.model_new, "forward"):
                if held.kind is Kind.FUNCTION and isinstance(held.node, (ast.FunctionDef,
                                                                         ast.AsyncFunctionDef)):
                    self.rebound.append(held.node)
        if self.forward is not None:
            self._collect_reachable(self.forward, self.model_new)

    @classmethod
    def of(cls, model: SourceModel) -> ForwardAnalysis:
        return model.memo("forward", lambda: cls(model))

    def is_reference(self, expr: ast.AST) -> bool:
        parts = dotted_parts(expr)
        resolved = self.model.bindings.resolve(expr) or ""
        named = bool(parts) and (parts[-1] == "Model" or resolved.endswith(".Model"))  # type: ignore[index]
        return named and not (parts == ["Model"] and self.model_is_rewritten)

    def methods(self, cls: ast.ClassDef) -> dict[str, FunctionNode]:
        """Methods of `cls`, including those inherited from classes defined in the file."""
        return self.callees.methods(cls)

    # --- reachability ---------------------------------------------------------------------

    def _collect_reachable(self, start: FunctionNode, owner: ast.ClassDef | None) -> None:
        pending = [(start, owner), *((f, self._owner_for(f, owner)) for f in self.rebound)]
        while pending:
            function, cls = pending.pop(0)
            if function in self.owner:
                continue
            enclosing = self.callees.enclosing_function(function)
            if enclosing is not None and enclosing in self.owner:
                continue  # a closure of a function already walked: its body was seen there
            self.owner[function] = cls
            self.reachable.append(function)
            for op in self.ops_in(function.body, cls):
                if op.kind is OpKind.HELPER and op.target is not None:
                    pending.append((op.target, self._owner_for(op.target, cls)))

    def _owner_for(self, target: FunctionNode, caller: ast.ClassDef | None) -> ast.ClassDef | None:
        """The class whose `self` a method runs with: the caller's when the method is inherited."""
        owner = self.class_of(target)
        if owner is not None and caller is not None and \
                any(owner is base for base in self.callees.bases(caller)):
            return caller
        return owner

    def class_of(self, function: FunctionNode) -> ast.ClassDef | None:
        return self.callees.class_of(function)

    # --- classification -------------------------------------------------------------------

    def ops_in(self, nodes: Sequence[ast.AST], cls: ast.ClassDef | None) -> list[Op]:
        """Classified calls and operators directly inside `nodes` (helpers not entered)."""
        key = (id(nodes[0]) if nodes else 0, len(nodes), id(cls))
        if key in self._ops_cache:
            return self._ops_cache[key]
        self._ops_cache[key] = []  # a cycle back here (a lambda calling itself) finds nothing
        ops: list[Op] = []
        covered: set[int] = set()  # operands of an operator already reported
        for node in walk_code(nodes):
            if id(node) in covered:
                continue
            found = self.classify_all(node, cls)
            if found and isinstance(node, (ast.BinOp, ast.UnaryOp, ast.AugAssign)):
                covered.update(_operator_operands(node))
            ops.extend(found)
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
        """The kind of one call or operator, seen from a method of `cls` (the first kind when a
        call may reach several things, such as an `nn.Sequential`)."""
        ops = self.classify_all(node, cls)
        return ops[0] if ops else None

    def classify_all(self, node: ast.AST, cls: ast.ClassDef | None,
                     function: FunctionNode | None = None) -> list[Op]:
        """Every kind of thing one call or operator may run, seen from a method of `cls`
        (`function`: the enclosing function, for nodes made up by the caller)."""
        if isinstance(node, (ast.BinOp, ast.AugAssign, ast.UnaryOp)):
            op = self._operator(node, cls, function)
            return [op] if op is not None else []
        if not isinstance(node, ast.Call):
            return []
        func = node.func
        model = self.model
        if isinstance(func, ast.Subscript):
            kernel = self._triton_kernel(func.value, cls)
            if kernel is not None:
                return [Op(OpKind.CUSTOM_KERNEL, node, f"Triton kernel `{kernel}`",
                           callee=kernel)]
        if isinstance(func, ast.Attribute) and _is_super_call(func.value):
            return self._super_call(node, func.attr, cls)
        parts = dotted_parts(func)
        written = ".".join(parts) if parts else model.code_of(func)
        resolved = model.bindings.resolve(func) if parts else None
        if resolved is not None:
            if resolved.startswith(_ATEN_NAMESPACES):
                return self._aten(node, resolved, written)
            if resolved.startswith("torch.ops."):
                return [Op(OpKind.CUSTOM_KERNEL, node, f"custom op `{written}`", callee=written)]
            if is_torch_compute(resolved):
                alias = "" if written == resolved else f" (written `{written}`)"
                return [Op(OpKind.REFERENCE_OP, node, f"`{resolved}`{alias}")]
            if resolved.startswith("torch.") and not resolved.startswith("torch.hub.load"):
                return []
        if parts and len(parts) == 2 and parts[1] in ("forward", "__call__") and \
                self.is_reference(func.value):  # type: ignore[attr-defined]
            return [Op(OpKind.REFERENCE_MODEL, node, f"`{written}`")]
        if parts and len(parts) == 2 and parts[1] == "apply" and parts[0] in model.classes:
            target = self.methods(model.classes[parts[0]]).get("forward")
            return [] if target is None else [Op(OpKind.HELPER, node, f"`{written}`", target)]
        if parts and len(parts) == 1 and parts[0] in model.classes \
                and not self.is_reference(func):
            return []  # constructing an object; calling it later is classified then
        function = function or self.callees.enclosing_function(node)
        held = self.callees.held_by(func, cls, function)
        ops = self._ops_of_held(node, held, written)
        if ops or held:
            return ops
        if parts and parts[0] in model.bindings.qualified:
            return []  # another module's function (math.sqrt, np.prod, triton.cdiv)
        op = self._tensor_method(node, cls)
        return [op] if op is not None else []

    def _ops_of_held(self, node: ast.Call, held: frozenset[Held], written: str) -> list[Op]:
        ops: dict[tuple[OpKind, str, int], Op] = {}

        def add(op: Op) -> None:
            ops.setdefault((op.kind, op.description, id(op.target)), op)

        for item in sorted(held, key=lambda h: (h.kind.value, h.name)):
            kind = item.kind
            if kind is Kind.EXTENSION_FUNCTION:
                add(Op(OpKind.CUSTOM_KERNEL, node, f"extension function `{written}`",
                       callee=item.name))
            elif kind is Kind.DSL_KERNEL:
                add(Op(OpKind.CUSTOM_KERNEL, node, f"GPU DSL kernel `{written}`",
                       callee=written))
            elif kind is Kind.FUNCTION and isinstance(item.node, (ast.FunctionDef,
                                                                  ast.AsyncFunctionDef)):
                if self.callees.is_dsl_function(item.node):
                    add(Op(OpKind.CUSTOM_KERNEL, node, f"GPU DSL kernel `{written}`",
                           callee=item.node.name))
                elif item.node.name not in self.model.triton_kernels or \
                        self.model.functions.get(item.node.name) is not item.node:
                    add(Op(OpKind.HELPER, node, f"`{written}`", item.node))
            elif kind is Kind.INSTANCE and isinstance(item.node, ast.ClassDef):
                methods = self.methods(item.node)
                target = methods.get("forward") or methods.get("__call__")
                if target is not None:
                    add(Op(OpKind.HELPER, node, f"`{written}`", target))
            elif kind is Kind.TORCH_MODULE:
                add(Op(OpKind.REFERENCE_OP, node, f"`{item.name}` module `{written}`"))
            elif kind is Kind.TORCH_FUNCTION:
                add(Op(OpKind.REFERENCE_OP, node, f"`{item.name}` (written `{written}`)"))
            elif kind is Kind.LIBRARY_MODEL:
                add(Op(OpKind.REFERENCE_OP, node, f"the library model `{written}` "
                                                  f"(`{item.name}`)"))
                for target in self.injected_forwards():
                    add(Op(OpKind.HELPER, node, f"`{target.name}` installed in `{written}`",
                           target))
            elif kind is Kind.REFERENCE_MODEL:
                add(Op(OpKind.REFERENCE_MODEL, node, f"reference `Model` instance `{written}`"))
            elif kind is Kind.REFERENCE_LAYER:
                add(Op(OpKind.REFERENCE_OP, node,
                       f"`{written}`, a layer taken from the reference `Model`"))
        return list(ops.values())

    def _triton_kernel(self, expr: ast.AST, cls: ast.ClassDef | None) -> str | None:
        """The `@triton.jit` function launched as `expr[grid](...)`: by name, or held in an
        attribute or a variable."""
        parts = dotted_parts(expr)
        if parts and parts[-1] in self.model.triton_kernels and len(parts) == 1:
            return parts[-1]
        function = self.callees.enclosing_function(expr)
        for held in self.callees.held_by(expr, cls, function):
            if held.kind is Kind.FUNCTION and isinstance(held.node, ast.FunctionDef) \
                    and held.node.name in self.model.triton_kernels:
                return held.node.name
        if parts and parts[-1] in self.model.triton_kernels:
            return parts[-1]
        return None

    def _super_call(self, node: ast.Call, attribute: str, cls: ast.ClassDef | None) -> list[Op]:
        if attribute not in ("forward", "__call__"):
            return []
        if cls is not None:
            for base in cls.bases:
                parts = dotted_parts(base)
                resolved = self.model.bindings.resolve(base) or ""
                if parts and len(parts) == 1 and parts[0] in self.model.classes \
                        and not self.is_reference(base):
                    target = self.methods(self.model.classes[parts[0]]).get(attribute)
                    return [] if target is None else [Op(OpKind.HELPER, node,
                                                         "`super().forward`", target)]
                if resolved.startswith("torch.nn.") and is_torch_compute(resolved):
                    return [Op(OpKind.REFERENCE_OP, node, f"`super().forward` of `{resolved}`")]
        return [Op(OpKind.REFERENCE_MODEL, node, "`super().forward`")]

    @staticmethod
    def _aten(node: ast.Call, resolved: str, written: str) -> list[Op]:
        """`torch.ops.aten.convolution(...)` and `torch.ops.aten.mm.default(...)` are ATen's own
        operators: PyTorch compute, unless they only allocate or reshape."""
        name = resolved.split(".")[3].strip("_") if resolved.count(".") >= 3 else ""
        if name and is_torch_compute(f"torch.{name}"):
            return [Op(OpKind.REFERENCE_OP, node, f"the ATen operator `{written}`")]
        return []

    def _tensor_method(self, node: ast.Call, cls: ast.ClassDef | None) -> Op | None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in TENSOR_COMPUTE_METHODS:
            return Op(OpKind.REFERENCE_OP, node, f"tensor method `.{func.attr}()`")
        return None

    def _operator(self, node: ast.BinOp | ast.AugAssign | ast.UnaryOp,
                  cls: ast.ClassDef | None, function: FunctionNode | None) -> Op | None:
        """`@` always (only tensors define it here); `+ - * / // % **` and unary `-` when an
        operand is a tensor (a parameter of forward, a tensor method's result, a weight)."""
        code = self.model.code_of(node)
        shown = code if len(code) <= 40 else code[:37] + "..."
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub) and self.is_tensor(node.operand, cls, function):
                return Op(OpKind.REFERENCE_OP, node, f"the unary `-` operator on a tensor "
                                                     f"(`{shown}`)")
            return None
        if isinstance(node.op, ast.MatMult):
            return Op(OpKind.REFERENCE_OP, node, "the `@` operator (torch.matmul)")
        symbol = _ARITHMETIC.get(type(node.op))
        if symbol is None:
            return None
        operands = (node.target, node.value) if isinstance(node, ast.AugAssign) \
            else (node.left, node.right)
        if isinstance(node, ast.BinOp) and _is_scalar(node):
            return None  # `input.dim() + dim`, `x.size(0) - 1`: shape arithmetic on numbers
        if any(self.is_tensor(operand, cls, function) for operand in operands):
            if isinstance(node, ast.AugAssign):
                symbol += "="
            return Op(OpKind.REFERENCE_OP, node, f"the `{symbol}` operator on tensors "
                                                 f"(`{shown}`)")
        return None

    # --- tensors ----------------------------------------------------------------------------

    def is_tensor(self, expr: ast.AST, cls: ast.ClassDef | None,
                  function: FunctionNode | None = None, depth: int = 0) -> bool:
        """Whether an expression surely holds a tensor: forward's inputs, weights, tensor
        methods' and PyTorch ops' results, custom kernels' results, and names bound to them.
        Shapes, sizes and Python numbers are not."""
        if depth > 12:
            return False
        if isinstance(expr, ast.Name):
            return self._tensor_name(expr, cls, function, depth)
        if isinstance(expr, ast.Attribute):
            if expr.attr in _TENSOR_ATTRIBUTES:
                return self.is_tensor(expr.value, cls, function, depth + 1)
            parts = dotted_parts(expr)
            if parts and parts[0] == "self" and cls is not None:
                if len(parts) == 2:
                    return self._tensor_attribute(cls, parts[1])
                return len(parts) == 3 and parts[2] in _PARAMETER_ATTRIBUTES
            return False
        if isinstance(expr, ast.Subscript):
            return self.is_tensor(expr.value, cls, function, depth + 1)
        if isinstance(expr, ast.BinOp):
            return self.is_tensor(expr.left, cls, function, depth + 1) or \
                self.is_tensor(expr.right, cls, function, depth + 1)
        if isinstance(expr, ast.UnaryOp) and not isinstance(expr.op, ast.Not):
            return self.is_tensor(expr.operand, cls, function, depth + 1)
        if isinstance(expr, ast.IfExp):
            return self.is_tensor(expr.body, cls, function, depth + 1) and \
                self.is_tensor(expr.orelse, cls, function, depth + 1)
        if isinstance(expr, ast.Call):
            return self._tensor_call(expr, cls, function, depth)
        return False

    def _tensor_call(self, call: ast.Call, cls: ast.ClassDef | None,
                     function: FunctionNode | None, depth: int) -> bool:
        func = call.func
        resolved = self.model.bindings.resolve(func) or ""
        if resolved.startswith("torch."):
            rest = resolved[len("torch."):]
            if resolved.startswith(("torch.nn.functional.", "torch.linalg.", "torch.fft.",
                                    "torch.special.")):
                return True
            return "." not in rest and rest not in _NOT_TENSOR and not rest[:1].isupper() \
                and not rest.startswith(("is_", "get_", "set_", "_"))
        kinds = {op.kind for op in self.classify_all(call, cls, function)}
        if kinds & {OpKind.CUSTOM_KERNEL, OpKind.REFERENCE_OP}:
            return True
        if isinstance(func, ast.Attribute) and not resolved and \
                (func.attr in _TENSOR_RESULT_METHODS
                 or (func.attr.endswith("_") and not func.attr.startswith("_"))):
            return self.is_tensor(func.value, cls, function, depth + 1)
        return False

    def _tensor_name(self, name: ast.Name, cls: ast.ClassDef | None,
                     function: FunctionNode | None, depth: int) -> bool:
        function = function or self.callees.enclosing_function(name)
        if function is None:
            return False
        key = (id(function), name.id)
        if key in self._tensor_names:
            return self._tensor_names[key]
        # a parameter rebound to itself (`x = x.contiguous()`) keeps the parameter's answer; any
        # other cycle (`y = y * 2` with nothing else) decides nothing
        values = [v for v in self.callees.local_values(function).get(name.id, [])
                  if isinstance(v, ast.expr)]
        # `start = start.item()`: a number from there on, not surely a tensor
        result = _is_tensor_parameter(function, name.id, function is self.forward,
                                      is_method=self.model_new is not None) \
            and not any(_is_scalar(value) for value in values)
        self._tensor_names[key] = result
        if not result:
            result = any(self.is_tensor(value, cls, function, depth + 1) for value in values)
        self._tensor_names[key] = result
        return result

    def _tensor_attribute(self, cls: ast.ClassDef, attribute: str) -> bool:
        """`self.weight = nn.Parameter(...)`, `self.register_buffer("w", ...)`, a tensor made
        by `torch.*`."""
        for owner in self.callees.bases(cls):
            for method, name, value in self.callees.self_stores(owner):
                if name != attribute or not isinstance(value, ast.Call):
                    continue
                resolved = self.model.bindings.resolve(value.func) or ""
                if resolved in ("torch.nn.Parameter", "torch.nn.parameter.Parameter") \
                        or self._tensor_call(value, None, method, 10):
                    return True
        return False

    # --- modules installed into a library model ---------------------------------------------

    def injected_forwards(self) -> list[FunctionNode]:
        """Forwards of classes defined in the file that `ModelNew.__init__` (or a helper it
        calls) installs into another module (`setattr(parent, name, FastGelu())`): they run when
        a library model such as a transformers model is called."""
        if self._injected is None:
            self._injected = []
            init = self.methods(self.model_new).get("__init__") if self.model_new else None
            seen: set[int] = set()
            pending = [init] if init is not None else []
            while pending:
                function = pending.pop()
                if id(function) in seen:
                    continue
                seen.add(id(function))
                installs = False
                built: list[ast.ClassDef] = []
                for node in walk_code(function.body, into_functions=False):
                    if _installs_elsewhere(node):
                        installs = True
                        if isinstance(node, ast.Assign) and any(
                                isinstance(t, ast.Attribute) and t.attr == "forward"
                                for t in node.targets):  # `module.forward = make_forward(w)`
                            for held in self.callees.held_by(node.value, self.model_new,
                                                             function):
                                if held.kind is Kind.FUNCTION and isinstance(
                                        held.node, ast.FunctionDef) and \
                                        held.node not in self._injected:
                                    self._injected.append(held.node)
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        pending.append(node)  # a local helper (`def replace(module): ...`)
                    if isinstance(node, ast.Call):
                        parts = dotted_parts(node.func)
                        classes = [h.node for h in self.callees.held_by(
                            node.func, self.model_new, function) if h.kind is Kind.CLASS]
                        if classes:
                            built.extend(c for c in classes if isinstance(c, ast.ClassDef))
                        elif parts and len(parts) == 1 and parts[0] in self.model.functions:
                            pending.append(self.model.functions[parts[0]])
                        elif parts and len(parts) == 2 and parts[0] == "self" \
                                and self.model_new is not None:
                            method = self.methods(self.model_new).get(parts[1])
                            if method is not None:
                                pending.append(method)
                if installs:
                    for cls in built:
                        target = self.methods(cls).get("forward")
                        if target is not None and target not in self._injected:
                            self._injected.append(target)
        return self._injected

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


def _is_super_call(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "super"


def _operator_operands(node: ast.AST) -> set[int]:
    """Ids of the operators nested in an operator's operands (`a * b + c` is one operation)."""
    found: set[int] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        for child in ast.iter_child_nodes(current):
            if isinstance(child, (ast.BinOp, ast.UnaryOp)):
                found.add(id(child))
                stack.append(child)
    return found


#: methods and functions whose result is a Python number (shapes, counts, `.item()`)
_SCALAR_METHODS = frozenset({"dim", "ndimension", "size", "numel", "nelement", "stride",
                             "element_size", "item", "storage_offset", "get_device"})
_SCALAR_FUNCTIONS = frozenset({"len", "int", "float", "bool"})


def _is_scalar(expr: ast.AST) -> bool:
    """An expression that surely holds a Python number: `x.dim()`, `x.size(0)`, `t.item()`,
    `len(shape)`, `int(n)`, `x.ndim`, and arithmetic of one with names and constants
    (`input.dim() + dim`)."""
    if isinstance(expr, ast.BinOp):
        sides = (expr.left, expr.right)
        return any(_is_scalar(side) for side in sides) and \
            all(_is_scalar(side) or isinstance(side, (ast.Name, ast.Constant)) for side in sides)
    if isinstance(expr, ast.Attribute):
        return expr.attr == "ndim"
    if not isinstance(expr, ast.Call):
        return False
    if isinstance(expr.func, ast.Attribute):
        return expr.func.attr in _SCALAR_METHODS
    return isinstance(expr.func, ast.Name) and expr.func.id in _SCALAR_FUNCTIONS


def _is_tensor_parameter(function: FunctionNode, name: str, is_forward: bool,
                         is_method: bool = True) -> bool:
    """A parameter annotated `Tensor`, or any parameter of `forward` (KernelBench passes tensors)
    other than `self` (when the entry point is a method, not a function a benchmark calls),
    those annotated with anything that names no tensor (`dim: int`) and those with a default
    that is not None."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults):]],
                        args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    for arg in [*positional, *args.kwonlyargs]:
        if arg.arg != name:
            continue
        annotation = dotted_parts(arg.annotation) if arg.annotation is not None else None
        if annotation and annotation[-1] == "Tensor":
            return True
        if arg.annotation is not None and "Tensor" not in ast.unparse(arg.annotation):
            return False  # `dim: int`, `shape: tuple[int, ...]`
        if not is_forward or (is_method and positional and arg is positional[0]):
            return False  # a helper's parameter, or `self`
        default = defaults.get(name)
        return default is None or (isinstance(default, ast.Constant) and default.value is None)
    return False


def _installs_elsewhere(node: ast.AST) -> bool:
    """`setattr(parent, name, m)`, `parent.add_module(...)`, `parent._modules[k] = m`,
    `parent.attn = m`, `self.model.lm_head = m`: a module stored into an object other than
    `self`."""
    if isinstance(node, ast.Call):
        parts = dotted_parts(node.func) or []
        if parts == ["setattr"] and node.args and dotted_parts(node.args[0]) != ["self"]:
            return True
        return len(parts) >= 2 and parts[0] != "self" and parts[-1] in ("add_module",
                                                                       "register_module")
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, (ast.Attribute, ast.Subscript)):
                root, steps = target, 0
                while isinstance(root, (ast.Attribute, ast.Subscript)):
                    root, steps = root.value, steps + 1
                if not (isinstance(root, ast.Name) and root.id == "self") or steps > 1:
                    return True  # `parent.attn = m`, `self.model.lm_head = m`
    return False
