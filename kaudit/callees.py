"""What a called expression on a forward path may hold, without running anything.

Kernels reach their work through indirection: `self.op = ext.fn` in `__init__`, a handle assigned
inside `try` (and `None` in the `except`), modules kept in `nn.Sequential`/`ModuleList`/`ModuleDict`
(often built by helpers such as `_make_layer` that append to a list), loops and indexing over them,
`getattr(self, f"layer{i}")`, `torch.jit.script(...)` wrappers, attributes inherited from a base
class defined in the file. An expression resolves to the set of things it may hold: an
over-approximation (containers are flattened into their elements), so that a question such as "is a
kernel reached?" is answered yes when some path reaches one.

Every walk here is guarded against cycles (`self.a = self.b; self.b = self.a`, a helper that returns
its own result, a class that is its own base) and memoised per file.
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kaudit.python_scope import dotted_parts
from kaudit.source import FunctionNode, SourceModel, walk_code
from kaudit.torch_ops import NN_CONTAINERS, is_torch_compute, nn_module_computes


class Kind(enum.Enum):
    EXTENSION_MODULE = "extension-module"  # what load_inline/load returned
    EXTENSION_FUNCTION = "extension-function"  # a function of a compiled extension
    FUNCTION = "function"  # a function or method defined in the file (a closure too)
    INSTANCE = "instance"  # an instance of a class defined in the file
    CLASS = "class"  # a class defined in the file, not yet instantiated
    TORCH_MODULE = "torch-module"  # an nn module that computes (nn.Linear, nn.LSTM)
    TORCH_FUNCTION = "torch-function"  # a PyTorch compute function held in a variable
    LIBRARY_MODEL = "library-model"  # a model from transformers, torchvision, timm...
    REFERENCE_MODEL = "reference-model"  # an instance of the reference `Model`
    REFERENCE_LAYER = "reference-layer"  # an attribute taken from a reference `Model` instance
    DSL_KERNEL = "dsl-kernel"  # a kernel of another GPU DSL (CuTe, TileLang, CuPy, Numba)


@dataclass(frozen=True)
class Held:
    kind: Kind
    name: str  # qualified name, extension function name, class or function name
    node: ast.AST | None = None  # the FunctionDef (FUNCTION) or ClassDef (INSTANCE)


# Packages whose models are PyTorch code kaudit does not see (calling one runs PyTorch ops).
LIBRARY_PREFIXES = ("transformers.", "torchvision.models.", "timm.", "diffusers.",
                    "torchaudio.models.", "torch.hub.load", "sentence_transformers.")
# Wrappers that return (a compiled form of) their first argument.
WRAPPERS = frozenset({
    "torch.jit.script", "torch.jit.trace", "torch.jit.trace_module", "torch.jit.freeze",
    "torch.jit.optimize_for_inference", "torch.compile", "functools.partial",
    "torch.cuda.make_graphed_callables", "torch.fx.symbolic_trace",
})
_LOADERS = frozenset({"torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load"})
# Kernels written in other GPU DSLs: compilers whose result is a kernel, and decorators that make
# a function one. kaudit does not read their code: they count as custom kernels it cannot see.
DSL_COMPILERS = frozenset({
    "tilelang.compile", "cutlass.cute.compile", "tvm.build", "cupy.RawKernel", "cupy.RawModule",
    "cupy.ElementwiseKernel", "cupy.ReductionKernel", "numba.cuda.jit",
    "torch.cuda.jiterator._create_jit_fn", "torch.cuda.jiterator._create_multi_output_jit_fn",
})
DSL_DECORATORS = frozenset({
    "cutlass.cute.kernel", "cutlass.cute.jit", "tilelang.jit", "tilelang.language.prim_func",
    "tvm.script.tir.prim_func", "tvm.script.prim_func", "numba.cuda.jit", "cupy.fuse",
})
# Builtins and methods that hand back the elements of their argument or receiver.
_PASS_ELEMENTS = frozenset({"enumerate", "zip", "reversed", "list", "tuple", "iter", "sorted",
                            "dict", "OrderedDict", "collections.OrderedDict", "set", "next",
                            "filter", "map"})
_ELEMENT_METHODS = frozenset({"values", "items", "children", "modules", "named_children",
                              "named_modules", "get", "pop", "copy"})
_MODULE_CALL_ATTRIBUTES = frozenset({"forward", "__call__", "_conv_forward", "_forward"})
_MAX_DEPTH = 24
def methods_of(cls: ast.ClassDef) -> dict[str, FunctionNode]:
    return {s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}


class Callees:
    """Resolves expressions of one file to what they may hold."""

    def __init__(self, model: SourceModel, extension_names: set[str],
                 is_reference: Callable[[ast.AST], bool]) -> None:
        self.model = model
        self.extension_names = extension_names
        self.is_reference = is_reference
        self._attributes: dict[tuple[int, str], frozenset[Held]] = {}
        self._returns: dict[int, frozenset[Held]] = {}
        self._locals: dict[int, dict[str, list[ast.AST]]] = {}
        self._enclosing: dict[int, FunctionNode] | None = None
        self._active: set[tuple[str, int, str]] = set()
        self._held: dict[tuple[int, int, int], frozenset[Held]] = {}
        self._resolving: set[tuple[int, int, int]] = set()
        #: classes and functions defined at module level, also inside `if`/`try` blocks
        self.module_defs: dict[str, list[ast.AST]] = {}
        blocks = [model.module.body] if model.module is not None else []
        while blocks:
            for statement in blocks.pop():
                if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.module_defs.setdefault(statement.name, []).append(statement)
                    continue
                for name in ("body", "orelse", "finalbody"):
                    inner = getattr(statement, name, None)
                    if isinstance(inner, list):
                        blocks.append(inner)
                blocks.extend(handler.body for handler in getattr(statement, "handlers", []))
        self._classes_of: dict[int, ast.ClassDef] = {}
        for cls in model.nodes:  # classes defined inside functions too
            if isinstance(cls, ast.ClassDef):
                for method in methods_of(cls).values():
                    self._classes_of[id(method)] = cls

    # --- classes ----------------------------------------------------------------------------

    def bases(self, cls: ast.ClassDef) -> list[ast.ClassDef]:
        """`cls` and its base classes defined in the file, nearest first (cycles cut)."""
        order: list[ast.ClassDef] = []
        pending = [cls]
        while pending:
            current = pending.pop(0)
            if any(current is seen for seen in order):
                continue
            order.append(current)
            for base in current.bases:
                parts = dotted_parts(base)
                if parts and len(parts) == 1 and parts[0] in self.model.classes \
                        and not self.is_reference(base):
                    pending.append(self.model.classes[parts[0]])
        return order

    def methods(self, cls: ast.ClassDef) -> dict[str, FunctionNode]:
        """Methods of `cls`, with those inherited from base classes defined in the file."""
        merged: dict[str, FunctionNode] = {}
        for owner in reversed(self.bases(cls)):
            merged.update(methods_of(owner))
        return merged

    def class_of(self, function: FunctionNode) -> ast.ClassDef | None:
        return self._classes_of.get(id(function))

    def enclosing_function(self, node: ast.AST) -> FunctionNode | None:
        """The innermost function whose body holds `node`."""
        if self._enclosing is None:
            enclosing: dict[int, FunctionNode] = {}
            for candidate in self.model.nodes:  # outside-in: inner functions overwrite
                if isinstance(candidate, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for inner in ast.walk(candidate):
                        if inner is not candidate:
                            enclosing[id(inner)] = candidate
            self._enclosing = enclosing
        return self._enclosing.get(id(node))

    # --- resolution -------------------------------------------------------------------------

    def held_by(self, expr: ast.AST, cls: ast.ClassDef | None,
                function: FunctionNode | None, depth: int = 0) -> frozenset[Held]:
        """What `expr`, written in `function` (a method of `cls`), may hold. Memoised; an
        expression met again while it is being resolved (`x = x.view(...)`) adds nothing."""
        key = (id(expr), id(cls), id(function))
        known = self._held.get(key)
        if known is not None:
            return known
        if depth > _MAX_DEPTH or key in self._resolving:
            return frozenset()
        self._resolving.add(key)
        try:
            result = self._held_by(expr, cls, function, depth)
        finally:
            self._resolving.discard(key)
        self._held[key] = result
        return result

    def _held_by(self, expr: ast.AST, cls: ast.ClassDef | None,
                 function: FunctionNode | None, depth: int) -> frozenset[Held]:
        found: set[Held] = set()
        if isinstance(expr, ast.Name):
            found |= self._name(expr, cls, function, depth)
        elif isinstance(expr, ast.Attribute):
            found |= self._attribute_of(expr, cls, function, depth)
        elif isinstance(expr, ast.Subscript):
            found |= self.held_by(expr.value, cls, function, depth + 1)  # containers flattened
        elif isinstance(expr, ast.Call):
            found |= self._call(expr, cls, function, depth)
        elif isinstance(expr, ast.IfExp):
            for branch in (expr.body, expr.orelse):
                found |= self.held_by(branch, cls, function, depth + 1)
        elif isinstance(expr, ast.BoolOp):
            for value in expr.values:
                found |= self.held_by(value, cls, function, depth + 1)
        elif isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            for element in expr.elts:
                found |= self.held_by(element, cls, function, depth + 1)
        elif isinstance(expr, ast.Dict):
            for value in expr.values:
                found |= self.held_by(value, cls, function, depth + 1)
        elif isinstance(expr, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            found |= self.held_by(expr.elt, cls, function, depth + 1)
        elif isinstance(expr, ast.DictComp):
            found |= self.held_by(expr.value, cls, function, depth + 1)
        elif isinstance(expr, ast.Starred):
            found |= self.held_by(expr.value, cls, function, depth + 1)
        elif isinstance(expr, ast.NamedExpr):
            found |= self.held_by(expr.value, cls, function, depth + 1)
        return frozenset(found)

    def _name(self, expr: ast.Name, cls, function, depth: int) -> set[Held]:
        name = expr.id
        model = self.model
        if function is not None:
            values = self.local_values(function).get(name)
            if values is not None:
                found: set[Held] = set()
                for value in values:
                    if isinstance(value, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found.add(Held(Kind.FUNCTION, value.name, value))
                    elif isinstance(value, ast.ClassDef):
                        found.add(Held(Kind.CLASS, value.name, value))
                    else:
                        scope = self.enclosing_function(value) or function
                        found |= self.held_by(value, cls, scope, depth + 1)
                return found
            if name in _parameter_names(function):
                return self._parameter(function, name, depth)
            outer = self.enclosing_function(function)
            if outer is not None:  # a closure reads its enclosing function's names
                return self._name(expr, cls, outer, depth + 1)
        if name in self.extension_names:
            return {Held(Kind.EXTENSION_MODULE, name)}
        if name in model.functions:
            return {Held(Kind.FUNCTION, name, model.functions[name])}
        if name in model.classes and not self.is_reference(expr):
            return {Held(Kind.CLASS, name, model.classes[name])}
        nested: set[Held] = set()  # defined inside a module-level `try:` or `if:` (each one)
        for definition in self.module_defs.get(name, []):
            if isinstance(definition, ast.ClassDef) and not self.is_reference(expr):
                nested.add(Held(Kind.CLASS, name, definition))
            elif isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef)):
                nested.add(Held(Kind.FUNCTION, name, definition))
        if nested:
            return nested
        resolved = model.bindings.resolve(expr)
        if resolved is not None and name in model.bindings.qualified:
            return self._qualified(resolved)
        found = set()
        key = ("module", 0, name)
        if key in self._active:
            return found
        self._active.add(key)
        try:
            for _op, value in model.bindings.assignments.get(name, []):
                found |= self.held_by(value, None, None, depth + 1)
        finally:
            self._active.discard(key)
        return found

    def _parameter(self, function: FunctionNode, name: str, depth: int) -> set[Held]:
        """What a parameter may hold: the arguments every call of `function` in the file passes
        in its place (`self._make_layer(BasicBlock, 64)` binds `block` to `BasicBlock`)."""
        found: set[Held] = set()
        for argument, caller, caller_cls in self._arguments_for(function, name):
            found |= self.held_by(argument, caller_cls, caller, depth + 1)
        return found

    def _arguments_for(self, function: FunctionNode, name: str
                       ) -> list[tuple[ast.AST, FunctionNode | None, ast.ClassDef | None]]:
        key = f"arguments:{id(function)}:{name}"

        def build() -> list[tuple[ast.AST, FunctionNode | None, ast.ClassDef | None]]:
            args = function.args
            positional = [a.arg for a in (*args.posonlyargs, *args.args)]
            if self.class_of(function) is not None and positional[:1] in (["self"], ["cls"]):
                positional = positional[1:]
            position = positional.index(name) if name in positional else None
            owner = self.class_of(function)
            constructs = function.name == "__init__" and owner is not None
            found = []
            for node in self.model.nodes:
                if not isinstance(node, ast.Call):
                    continue
                callee = node.func
                called = callee.attr if isinstance(callee, ast.Attribute) else \
                    callee.id if isinstance(callee, ast.Name) else None
                if called is None:
                    continue
                if constructs:  # `Block(...)`, or `block(...)` with `block` holding the class
                    if called != owner.name and not self._constructs(node, owner):
                        continue
                elif called != function.name:
                    continue
                argument = next((k.value for k in node.keywords if k.arg == name), None)
                if argument is None and position is not None and position < len(node.args) \
                        and not any(isinstance(a, ast.Starred) for a in node.args[:position + 1]):
                    argument = node.args[position]
                if argument is not None:
                    caller = self.enclosing_function(node)
                    found.append((argument, caller,
                                  self.class_of(caller) if caller is not None else None))
            return found

        return self.model.memo(key, build)

    def _constructs(self, call: ast.Call, cls: ast.ClassDef) -> bool:
        """`call` builds an instance of `cls` through a name that holds the class."""
        if self.model.bindings.resolve(call.func) is not None:
            return False
        caller = self.enclosing_function(call)
        owner = self.class_of(caller) if caller is not None else None
        return any(h.kind is Kind.CLASS and h.node is cls
                   for h in self.held_by(call.func, owner, caller))

    @staticmethod
    def _qualified(resolved: str) -> set[Held]:
        """A PyTorch compute function held in a name (`act = F.gelu`); not a class."""
        is_class = resolved.startswith("torch.nn.") and \
            not resolved.startswith("torch.nn.functional.")
        if is_torch_compute(resolved) and not is_class:
            return {Held(Kind.TORCH_FUNCTION, resolved)}
        return set()

    def _attribute_of(self, expr: ast.Attribute, cls, function, depth: int) -> set[Held]:
        parts = dotted_parts(expr)
        if parts is not None and ".".join(parts) in self.extension_names:
            return {Held(Kind.EXTENSION_MODULE, ".".join(parts))}  # `Cls._module = load(...)`
        if parts is not None and len(parts) == 2 and parts[0] == "self" and cls is not None:
            found = set(self.attribute(cls, parts[1], depth + 1))
            method = self.methods(cls).get(parts[1])
            if method is not None:
                found.add(Held(Kind.FUNCTION, f"{cls.name}.{parts[1]}", method))
            return found
        if parts is not None and ".".join(parts[:-1]) in self.extension_names:
            return {Held(Kind.EXTENSION_FUNCTION, parts[-1])}
        if parts is not None and parts[0] in self.model.bindings.qualified:
            resolved = self.model.bindings.resolve(expr)
            return self._qualified(resolved) if resolved else set()
        found: set[Held] = set()
        for held in self.held_by(expr.value, cls, function, depth + 1):
            found |= self.member(held, expr.attr, depth + 1)
        return found

    def member(self, held: Held, attr: str, depth: int = 0) -> set[Held]:
        """What `obj.attr` holds when `obj` holds `held`."""
        if held.kind is Kind.EXTENSION_MODULE:
            return {Held(Kind.EXTENSION_FUNCTION, attr)}
        if held.kind is Kind.CLASS and isinstance(held.node, ast.ClassDef):
            # `Fn.apply` of a torch.autograd.Function runs its forward; `Cls.method` is a method
            method = self.methods(held.node).get("forward" if attr == "apply" else attr)
            return {Held(Kind.FUNCTION, f"{held.node.name}.{attr}", method)} if method else set()
        if held.kind is Kind.INSTANCE and isinstance(held.node, ast.ClassDef):
            found = set(self.attribute(held.node, attr, depth + 1))
            method = self.methods(held.node).get(attr)
            if method is not None:
                found.add(Held(Kind.FUNCTION, f"{held.node.name}.{attr}", method))
            return found
        if held.kind is Kind.REFERENCE_MODEL:
            reference = self.model.classes.get("Model")
            if attr in _MODULE_CALL_ATTRIBUTES:
                return {held}
            if reference is not None:
                inner = self.attribute(reference, attr, depth + 1)
                if inner:
                    return set(inner)
            return {Held(Kind.REFERENCE_LAYER, attr)}
        if held.kind is Kind.LIBRARY_MODEL:
            # a library model's submodules are library code too (`base.transformer`, `lm.model`),
            # with the modules `__init__` installed into it
            return {held}
        if held.kind in (Kind.TORCH_MODULE, Kind.REFERENCE_LAYER) and attr in _MODULE_CALL_ATTRIBUTES:
            return {held}
        return set()

    def _call(self, call: ast.Call, cls, function, depth: int) -> set[Held]:
        model = self.model
        func = call.func
        if self.is_reference(func):
            return {Held(Kind.REFERENCE_MODEL, "Model")}
        resolved = model.bindings.resolve(func) or ""
        parts = dotted_parts(func) or []
        arguments = [*call.args, *(k.value for k in call.keywords)]
        if resolved in _LOADERS:
            return {Held(Kind.EXTENSION_MODULE, "extension")}
        if resolved in DSL_COMPILERS or (parts and parts[-1] == "get_function"
                                         and self._is_dsl(func.value, cls, function, depth)):
            return {Held(Kind.DSL_KERNEL, ".".join(parts) or resolved)}
        if resolved in WRAPPERS:
            return set(self.held_by(call.args[0], cls, function, depth + 1)) if call.args else set()
        if resolved.startswith(LIBRARY_PREFIXES):
            return {Held(Kind.LIBRARY_MODEL, resolved)}
        if resolved.startswith("torch.nn."):
            name = resolved[len("torch.nn."):]
            if name in NN_CONTAINERS:
                return self._union(arguments, cls, function, depth)
            return {Held(Kind.TORCH_MODULE, resolved)} if nn_module_computes(name) else set()
        if resolved in _PASS_ELEMENTS or (not resolved and len(parts) == 1
                                          and parts[0] in _PASS_ELEMENTS):
            return self._union(arguments, cls, function, depth)
        if parts == ["getattr"] and len(call.args) >= 2:
            return self._getattr(call, cls, function, depth)
        if isinstance(func, ast.Attribute) and func.attr in _ELEMENT_METHODS:
            return set(self.held_by(func.value, cls, function, depth + 1))
        if len(parts) == 1 and parts[0] in model.classes:
            return {Held(Kind.INSTANCE, parts[0], model.classes[parts[0]])}
        if isinstance(func, ast.Attribute) and func.attr in ("from_pretrained", "from_config"):
            return {Held(Kind.LIBRARY_MODEL, model.code_of(func))}
        found: set[Held] = set()
        for held in self.held_by(func, cls, function, depth + 1):
            if held.kind is Kind.CLASS:
                found.add(Held(Kind.INSTANCE, held.name, held.node))
            if held.kind is Kind.FUNCTION and isinstance(held.node, (ast.FunctionDef,
                                                                     ast.AsyncFunctionDef)):
                owner = self.class_of(held.node)
                scope_cls = cls if owner is not None and cls is not None and \
                    any(owner is base for base in self.bases(cls)) else owner
                found |= self.returns(held.node, scope_cls, depth + 1)
        return found

    def _is_dsl(self, expr: ast.AST, cls, function, depth: int) -> bool:
        return any(h.kind is Kind.DSL_KERNEL for h in self.held_by(expr, cls, function, depth + 1))

    def is_dsl_function(self, function: FunctionNode) -> bool:
        """A function a GPU DSL decorator turns into a kernel (`@cute.kernel`, `@T.prim_func`)."""
        for decorator in function.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if (self.model.bindings.resolve(target) or "") in DSL_DECORATORS:
                return True
        return False

    def _union(self, expressions: Sequence[ast.AST], cls, function, depth: int) -> set[Held]:
        found: set[Held] = set()
        for expr in expressions:
            found |= self.held_by(expr, cls, function, depth + 1)
        return found

    def _getattr(self, call: ast.Call, cls, function, depth: int) -> set[Held]:
        target, name = call.args[0], call.args[1]
        names = self.attribute_names(name, function)
        found: set[Held] = set()
        if dotted_parts(target) == ["self"] and cls is not None:
            for attribute in self.attribute_names_of(cls):
                if any(attribute == n or (n.endswith("*") and attribute.startswith(n[:-1]))
                       for n in names):
                    found |= self.attribute(cls, attribute, depth + 1)
                    method = self.methods(cls).get(attribute)
                    if method is not None:
                        found.add(Held(Kind.FUNCTION, attribute, method))
            return found
        for held in self.held_by(target, cls, function, depth + 1):
            for n in names:
                if not n.endswith("*"):
                    found |= self.member(held, n, depth + 1)
        return found

    def attribute_names(self, expr: ast.AST, function: FunctionNode | None) -> list[str]:
        """The attribute names a `getattr` name argument may be: a literal, an f-string's literal
        prefix (`"layer*"`), or the literal values a local name takes."""
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return [expr.value]
        if isinstance(expr, ast.JoinedStr):
            prefix = ""
            for piece in expr.values:
                if isinstance(piece, ast.Constant) and isinstance(piece.value, str):
                    prefix += piece.value
                else:
                    break
            return [prefix + "*"]
        if isinstance(expr, ast.Name) and function is not None:
            names: list[str] = []
            for value in self.local_values(function).get(expr.id, []):
                if isinstance(value, ast.expr) and value is not expr:
                    for inner in ast.walk(value):
                        if isinstance(inner, (ast.Constant, ast.JoinedStr)) and \
                                (isinstance(inner, ast.JoinedStr) or isinstance(inner.value, str)):
                            names.extend(self.attribute_names(inner, None))
            return names
        return []

    # --- attributes, locals, returns -------------------------------------------------------

    def attribute_names_of(self, cls: ast.ClassDef) -> set[str]:
        names: set[str] = set()
        for owner in self.bases(cls):
            for _method, target, _value in self.self_stores(owner):
                names.add(target)
        return names

    def attribute(self, cls: ast.ClassDef, name: str, depth: int = 0) -> frozenset[Held]:
        """What `self.<name>` may hold in a method of `cls` (every assignment counts)."""
        key = (id(cls), name)
        if key in self._attributes:
            return self._attributes[key]
        guard = ("attribute", id(cls), name)
        if guard in self._active or depth > _MAX_DEPTH:
            return frozenset()
        self._active.add(guard)
        found: set[Held] = set()
        try:
            for owner in self.bases(cls):
                for method, target, value in self.self_stores(owner):
                    if target == name or (target.endswith("*") and name.startswith(target[:-1])):
                        found |= self.held_by(value, cls, method, depth + 1)
        finally:
            self._active.discard(guard)
        result = frozenset(found)
        self._attributes[key] = result
        return result

    def self_stores(self, cls: ast.ClassDef) -> list[tuple[FunctionNode | None, str, ast.AST]]:
        """(method, attribute name, value) for each value a class stores on `self`: assignments,
        `setattr`/`add_module`/`register_module`, and `self.layers.append(...)`-style additions
        to a container attribute. An f-string name is kept as its literal prefix plus `*`."""
        cached = self.model.memo(f"self-stores:{id(cls)}", lambda: self._collect_stores(cls))
        return cached

    def _collect_stores(self, cls: ast.ClassDef) -> list[tuple[FunctionNode | None, str, ast.AST]]:
        stores: list[tuple[FunctionNode | None, str, ast.AST]] = []
        for statement in cls.body:
            if isinstance(statement, ast.Assign):  # class-level `act = nn.ReLU()`
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        stores.append((None, target.id, statement.value))
        for method in methods_of(cls).values():
            for node in walk_code(method.body, into_functions=False):
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if node.value is None:
                        continue
                    for target in targets:
                        for element in _target_elements(target):
                            name = _self_attribute(element)
                            if name is not None:
                                stores.append((method, name, node.value))
                elif isinstance(node, ast.Call):
                    stored = self._call_store(node, method)
                    if stored is not None:
                        stores.append((method, *stored))
        return stores

    def _call_store(self, call: ast.Call, method: FunctionNode) -> tuple[str, ast.AST] | None:
        func = call.func
        parts = dotted_parts(func) or []
        if parts == ["setattr"] and len(call.args) >= 3 and dotted_parts(call.args[0]) == ["self"]:
            names = self.attribute_names(call.args[1], method)
            return (names[0], call.args[2]) if len(names) == 1 else None
        if len(parts) == 2 and parts[0] == "self" and parts[1] in ("add_module",
                                                                    "register_module",
                                                                    "register_buffer",
                                                                    "register_parameter") \
                and len(call.args) >= 2:
            names = self.attribute_names(call.args[0], method)
            return (names[0], call.args[1]) if len(names) == 1 else None
        if len(parts) == 3 and parts[0] == "self" and parts[2] in ("append", "extend", "insert",
                                                                    "update", "add_module") \
                and call.args:
            return parts[1], call.args[-1]
        return None

    def local_values(self, function: FunctionNode) -> dict[str, list[ast.AST]]:
        """Local name -> what is stored in it anywhere in `function`: assigned values (whole, for
        tuple unpacking), loop iterables (their elements), values appended to it, `with ... as`
        values, and nested `def`s. Flow-insensitive, like the bindings."""
        key = id(function)
        if key in self._locals:
            return self._locals[key]
        values: dict[str, list[ast.AST]] = {}
        self._locals[key] = values

        def bind(target: ast.AST, value: ast.AST) -> None:
            for element in _target_elements(target):
                if isinstance(element, ast.Name):
                    values.setdefault(element.id, []).append(value)

        for node in walk_code(function.body, into_functions=False):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    bind(target, node.value)
                    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                        values.setdefault(target.value.id, []).append(node.value)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                bind(node.target, node.value)
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                bind(node.target, node.iter)
            elif isinstance(node, ast.comprehension):
                bind(node.target, node.iter)
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                bind(node.optional_vars, node.context_expr)
            elif isinstance(node, ast.NamedExpr):
                bind(node.target, node.value)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                    and node is not function:
                values.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.args \
                    and node.func.attr in ("append", "extend", "insert", "add_module", "update"):
                values.setdefault(node.func.value.id, []).append(node.args[-1])
        return values

    def returns(self, function: FunctionNode, cls: ast.ClassDef | None,
                depth: int = 0) -> frozenset[Held]:
        """What calling `function` may return (a helper that builds the layers, a builder that
        returns the compiled extension)."""
        key = id(function)
        if key in self._returns:
            return self._returns[key]
        guard = ("returns", key, "")
        if guard in self._active or depth > _MAX_DEPTH:
            return frozenset()
        self._active.add(guard)
        found: set[Held] = set()
        try:
            for node in walk_code(function.body, into_functions=False):
                if isinstance(node, ast.Return) and node.value is not None:
                    found |= self.held_by(node.value, cls, function, depth + 1)
        finally:
            self._active.discard(guard)
        result = frozenset(found)
        self._returns[key] = result
        return result


def _parameter_names(function: FunctionNode) -> set[str]:
    args = function.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}


def _target_elements(target: ast.AST) -> list[ast.AST]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [e for element in target.elts for e in _target_elements(element)]
    if isinstance(target, ast.Starred):
        return _target_elements(target.value)
    return [target]


def _self_attribute(target: ast.AST) -> str | None:
    """`self.x` -> "x"; `self.layers[i]` -> "layers" (an element stored into a container)."""
    if isinstance(target, ast.Subscript):
        target = target.value
    parts = dotted_parts(target)
    return parts[1] if parts and len(parts) == 2 and parts[0] == "self" else None
