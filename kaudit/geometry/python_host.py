"""The Python side: names in host functions (the code around Triton launches and the sizes
handed to extensions) resolved to symbolic expressions, module constants, `self.` attributes set
once in a method, one-line helpers inlined, and Triton launch grids (tuples, lambdas over `meta`,
grid functions).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from kaudit.geometry.algebra import (
    Expr,
    binary,
    const,
    evaluate,
    op,
    rounding,
    sym,
    symbols,
    unknown,
    unknown_in,
    with_text,
)
from kaudit.geometry.vocabulary import CEIL_DIV_NAMES, Dims
from kaudit.python_scope import dotted_parts
from kaudit.source import SourceModel

_CONDITIONAL_STMTS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.Match)
_PY_BINOPS: dict[type, str] = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.FloorDiv: "fdiv",
                               ast.Div: "truediv", ast.Mod: "mod", ast.LShift: "shl", ast.RShift: "shr"}
_PY_CMPOPS: dict[type, str] = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
                               ast.NotEq: "!="}


class PythonHost:
    """The module-level Python facts of one file that every Python scope consults."""

    def __init__(self, model: SourceModel) -> None:
        self.model = model
        self.walrus = ":=" in model.text
        self._module_values: dict[str, ast.expr] | None = None
        self._problem_names: set[str] | None = None
        self._module_memo: dict[str, Expr] = {}
        self._inline_depth = 0
        self._functions: list[ast.AST] | None = None
        self._scopes: dict[int, PyScope] = {}

    def code(self, node: ast.AST) -> str:
        try:
            return self.model.code_of(node)
        except (AttributeError, IndexError):
            return ast.unparse(node) if isinstance(node, ast.AST) else ""

    def module_value(self, name: str, text: str) -> Expr:
        if self._module_values is None:
            self._module_values = {}
            counts: dict[str, int] = {}
            module = self.model.module
            for statement in module.body if module is not None else []:
                targets = statement.targets if isinstance(statement, ast.Assign) else \
                    [statement.target] if isinstance(statement, ast.AnnAssign) and statement.value else []
                for target in targets:
                    if isinstance(target, ast.Name):
                        counts[target.id] = counts.get(target.id, 0) + 1
                        self._module_values[target.id] = statement.value  # type: ignore[assignment]
            for key, count in counts.items():
                if count > 1:
                    del self._module_values[key]
        if name not in self._module_values:
            return unknown(f"`{name}` is not bound where kaudit can see it", text)
        if name not in self._module_memo:
            self._module_memo[name] = unknown(f"`{name}` is defined in terms of itself", name)
            value = PyScope(self, None).expr(self._module_values[name], (0, 0))
            if name in self.problem_names():
                value = sym(name, "problem", name, evaluate(value))
            self._module_memo[name] = value
        return with_text(self._module_memo[name], text)

    def problem_names(self) -> set[str]:
        """Module constants the problem's `get_inputs`/`get_init_inputs` build inputs from."""
        if self._problem_names is None:
            self._problem_names = set()
            for name in ("get_inputs", "get_init_inputs"):
                function = self.model.functions.get(name)
                if function is not None:
                    self._problem_names |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name)}
        return self._problem_names

    def self_attribute(self, function: ast.AST | None, attr: str, text: str) -> Expr:
        line = getattr(function, "lineno", 0)
        for cls in self.model.classes.values():
            if not cls.lineno <= line <= (cls.end_lineno or 0):
                continue
            found = []
            for method in cls.body:
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for node in ast.walk(method):
                        if isinstance(node, ast.Assign) and any(
                                dotted_parts(t) == ["self", attr] for t in node.targets):
                            found.append((method, node))
            if len(found) == 1:
                method, node = found[0]
                value = PyScope(self, method).expr(node.value, (node.lineno, node.col_offset))
                if not unknown_in(value) and all(s.kind != "param" for s in symbols(value)):
                    return with_text(value, text)
        return sym(f"self.{attr}", "param", text)

    def inline_python(self, function: ast.FunctionDef, call: ast.Call, caller: PyScope,
                      at: tuple[int, int]) -> Expr | None:
        body = [s for s in function.body if not (isinstance(s, ast.Expr)
                                                 and isinstance(s.value, ast.Constant))]
        if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None \
                or self._inline_depth > 4:
            return None
        names = [a.arg for a in function.args.posonlyargs + function.args.args]
        bound = {n: caller.expr(a, at) for n, a in zip(names, call.args)}
        bound.update({k.arg: caller.expr(k.value, at) for k in call.keywords if k.arg})
        self._inline_depth += 1
        try:
            return PyScope(self, function, bound=bound).expr(body[0].value,
                                                             (body[0].lineno, body[0].col_offset))
        finally:
            self._inline_depth -= 1


    def enclosing_function(self, node: ast.AST) -> ast.AST | None:
        if self._functions is None:
            self._functions = []
            module = self.model.module
            pending: list[ast.AST] = list(module.body) if module is not None else []
            while pending:  # statements only: functions are defined by statements
                statement = pending.pop()
                if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self._functions.append(statement)
                for name in ("body", "orelse", "finalbody", "handlers"):
                    block = getattr(statement, name, None)
                    if isinstance(block, list):
                        pending.extend(block)
        position = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        best = None
        for function in self._functions:
            if (function.lineno, function.col_offset) <= position <= (
                    function.end_lineno or 0, function.end_col_offset or 0):
                if best is None or function.lineno >= best.lineno:
                    best = function
        return best

    def scope(self, function: ast.AST | None) -> PyScope:
        key = id(function)
        if key not in self._scopes:
            self._scopes[key] = PyScope(self, function)
        return self._scopes[key]

    # --- Triton launch grids -------------------------------------------------------------------

    def grid(self, node: ast.AST, scope: PyScope, at: tuple[int, int],
                meta_values: dict[str, Expr], depth: int = 0) -> Dims:
        text = " ".join(self.code(node).split())
        if depth > 5:
            return Dims([], 0, text, unknown_reason="the grid is built too indirectly")
        if isinstance(node, (ast.Tuple, ast.List)):
            exprs = [scope.expr(e, at) for e in node.elts]
            return Dims(exprs, len(exprs), text)
        if isinstance(node, ast.Lambda):
            names = [a.arg for a in node.args.posonlyargs + node.args.args]
            inner = PyScope(self, node, parent=scope, meta=names[0] if names else None,
                            meta_values=meta_values)
            return self.grid(node.body, inner, at, meta_values, depth + 1)
        if isinstance(node, ast.Name):
            chosen, reason = scope.select(node.id, at)
            if reason:
                return Dims([], 0, text, node.id, reason)
            if chosen:
                first = chosen[0]
                if len(chosen) > 1 or first.value is None or first.index is not None:
                    return Dims([], 0, text, node.id, f"`{node.id}` is reassigned")
                dims = self.grid(first.value, scope, first.position, meta_values, depth + 1)
                return Dims(dims.exprs, dims.explicit, text, node.id, dims.unknown_reason,
                            dims.definition or dims.text)
            function = self._local_function(scope.function, node.id) or self.model.functions.get(node.id)
            if function is not None:
                return self._function_grid(function, scope, at, meta_values, text, depth)
            if node.id in scope._params:
                return Dims([], 0, text, node.id, f"the grid `{node.id}` is a parameter")
            return Dims([], 0, text, node.id, f"`{node.id}` is not bound in this function")
        if isinstance(node, ast.Call):
            parts = dotted_parts(node.func) or []
            function = self.model.functions.get(parts[0]) if len(parts) == 1 else None
            if function is not None and function.name not in self.model.triton_kernels:
                body = [s for s in function.body if isinstance(s, ast.Return)]
                if len(function.body) == 1 and body and body[0].value is not None:
                    names = [a.arg for a in function.args.args]
                    bound = {n: scope.expr(a, at) for n, a in zip(names, node.args)}
                    inner = PyScope(self, function, bound=bound)
                    return self.grid(body[0].value, inner, (body[0].lineno, body[0].col_offset),
                                        meta_values, depth + 1)
            return Dims([], 0, text, unknown_reason="it comes from a function kaudit does not follow")
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Dims([const(node.value, text)], 1, text)
        if isinstance(node, ast.Attribute):
            return Dims([], 0, text, unknown_reason="it is an attribute set outside this function")
        return Dims([], 0, text, unknown_reason="it is not a tuple or a lambda kaudit follows")

    def _local_function(self, function: ast.AST | None, name: str) -> ast.FunctionDef | None:
        body = getattr(function, "body", None)
        for statement in body if isinstance(body, list) else []:
            if isinstance(statement, ast.FunctionDef) and statement.name == name:
                return statement
        return None

    def _function_grid(self, function: ast.FunctionDef, scope: PyScope, at: tuple[int, int],
                       meta_values: dict[str, Expr], text: str, depth: int) -> Dims:
        returns = [s for s in function.body if isinstance(s, ast.Return)]
        if len(returns) != 1 or returns[0].value is None:
            return Dims([], 0, text, text, f"the grid function `{function.name}` is not a single return")
        names = [a.arg for a in function.args.args]
        inner = PyScope(self, function, parent=scope, meta=names[0] if names else None,
                        meta_values=meta_values)
        dims = self.grid(returns[0].value, inner, at, meta_values, depth + 1)
        return Dims(dims.exprs, dims.explicit, text, text, dims.unknown_reason)


@dataclass
class PyDef:
    position: tuple[int, int]
    value: ast.expr | None
    index: int | None  # element of a tuple unpacking
    operator: str  # "=", "+", "-", "*", ...
    containers: tuple[ast.AST, ...]  # conditional statements around the definition


class PyScope:
    """Names of one Python function (or lambda), resolved to expressions at a position."""

    def __init__(self, host: PythonHost, function: ast.AST | None, *,
                 parent: PyScope | None = None, bound: dict[str, Expr] | None = None,
                 meta: str | None = None, meta_values: dict[str, Expr] | None = None) -> None:
        self.host = host
        self.function = function
        self.parent = parent
        self.bound = bound or {}
        self.meta = meta
        self.meta_values = meta_values or {}
        self._defs: dict[str, list[PyDef]] | None = None
        self._params = _param_names(function)
        self._depth = 0

    # --- definitions ------------------------------------------------------------------------

    def defs(self) -> dict[str, list[PyDef]]:
        if self._defs is None:
            self._defs = {}
            body = getattr(self.function, "body", None)
            if isinstance(body, list):
                self._collect(body, ())
        return self._defs

    def _collect(self, statements: list[ast.stmt], containers: tuple[ast.AST, ...]) -> None:
        for statement in statements:
            position = (statement.lineno, statement.col_offset)
            if isinstance(statement, ast.Assign):
                for target in statement.targets:
                    self._add_target(target, statement.value, "=", position, containers)
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                self._add_target(statement.target, statement.value, "=", position, containers)
            elif isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
                name = _PY_BINOPS.get(type(statement.op), "?")
                self.defs_add(statement.target.id, PyDef(position, statement.value, None, name,
                                                         containers))
            for name_field in ("test", "value", "iter") if self.host.walrus else ():
                part = getattr(statement, name_field, None)
                if isinstance(part, ast.AST):
                    for inner in ast.walk(part):
                        if isinstance(inner, ast.NamedExpr) and isinstance(inner.target, ast.Name):
                            self.defs_add(inner.target.id, PyDef(position, inner.value, None, "=",
                                                                 containers))
            if isinstance(statement, (ast.For, ast.AsyncFor)):
                for target in ast.walk(statement.target):
                    if isinstance(target, ast.Name):
                        self.defs_add(target.id, PyDef(position, None, None, "=",
                                                       containers + (statement,)))
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(statement, ast.If):
                self._collect(statement.body, containers + (statement,))
                self._collect(statement.orelse, containers + (_Else(statement),))
                continue
            conditional = isinstance(statement, _CONDITIONAL_STMTS)
            for name in ("body", "orelse", "finalbody"):
                block = getattr(statement, name, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    self._collect(block, containers + (statement,) if conditional else containers)
            for handler in getattr(statement, "handlers", []) or []:
                self._collect(handler.body, containers + (handler,))
            for case in getattr(statement, "cases", []) or []:
                self._collect(case.body, containers + (statement,))

    def defs_add(self, name: str, definition: PyDef) -> None:
        assert self._defs is not None
        self._defs.setdefault(name, []).append(definition)

    def _add_target(self, target: ast.expr, value: ast.expr, operator: str,
                    position: tuple[int, int], containers: tuple[ast.AST, ...]) -> None:
        if isinstance(target, ast.Name):
            self.defs_add(target.id, PyDef(position, value, None, operator, containers))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for i, element in enumerate(target.elts):
                if isinstance(element, ast.Name):
                    self.defs_add(element.id, PyDef(position, value, i, operator, containers))

    def select(self, name: str, at: tuple[int, int]) -> tuple[list[PyDef], str]:
        """The definitions of `name` that decide its value at `at`: the last unconditional `=`
        and what follows it; ([], reason) when a conditional assignment makes it undecidable."""
        found = [d for d in self.defs().get(name, []) if d.position < at]
        if not found:
            return [], ""
        base = None
        for i in range(len(found) - 1, -1, -1):
            d = found[i]
            if d.operator == "=" and _encloses_all(d.containers, at):
                base = i
                break
        if base is None:
            return [], f"`{name}` is assigned only conditionally"
        return found[base:], ""

    def file_constant(self, node: ast.AST, at: tuple[int, int], depth: int = 0) -> str | None:
        """The module-level integer constant an expression names (`FEATURES`, or a local set
        once from it), if any."""
        if not isinstance(node, ast.Name) or depth > 3 or node.id in self.bound:
            return None
        chosen, reason = self.select(node.id, at)
        if reason:
            return None
        if chosen:
            first = chosen[0]
            if len(chosen) == 1 and first.index is None and first.value is not None:
                return self.file_constant(first.value, first.position, depth + 1)
            return None
        if node.id in self._params:
            return None
        if self.parent is not None:
            return self.parent.file_constant(node, at, depth)
        return node.id if evaluate(self.host.module_value(node.id, node.id)) is not None else None

    # --- expressions ------------------------------------------------------------------------

    def resolve(self, name: str, at: tuple[int, int], text: str = "") -> Expr:
        if name in self.bound:
            return self.bound[name]
        chosen, reason = self.select(name, at)
        if reason:
            return unknown(reason, text or name)
        if chosen:
            return with_text(self._fold(name, chosen, at), text or name)
        if name in self._params:
            return sym(name, "param", text or name)
        if self.parent is not None:
            return self.parent.resolve(name, at, text)
        return self.host.module_value(name, text or name)

    def _fold(self, name: str, chosen: list[PyDef], at: tuple[int, int]) -> Expr:
        first = chosen[0]
        if first.value is None:
            return unknown(f"`{name}` is a loop variable", name)
        if self._depth > 30:
            return unknown("definitions nest too deeply", name)
        self._depth += 1
        try:
            value = self.expr(first.value, first.position)
            if first.index is not None:
                value = self._element(first.value, first.index, first.position, value)
            for d in chosen[1:]:
                if d.value is None:
                    return unknown(f"`{name}` is reassigned in a loop", name)
                step = self.expr(d.value, d.position)
                if not _encloses_all(d.containers, at):
                    test = _remainder_test(d.containers)
                    if d.operator == "add" and test is not None:
                        value = op("add", value, op("cond", self.expr(test, d.position), step,
                                                    const(0)))
                        continue
                    return unknown(f"`{name}` is reassigned conditionally", name)
                if d.operator == "=":
                    value = step
                elif d.operator in ("add", "sub", "mul", "fdiv", "truediv", "mod"):
                    value = binary(d.operator, value, step)
                else:
                    return unknown(f"`{name}` is updated with an unsupported operator", name)
            return value
        finally:
            self._depth -= 1

    def _element(self, node: ast.expr, index: int, at: tuple[int, int], whole: Expr) -> Expr:
        if isinstance(node, (ast.Tuple, ast.List)) and index < len(node.elts):
            return self.expr(node.elts[index], at)
        if isinstance(node, ast.Attribute) and node.attr == "shape":
            receiver = self.host.code(node.value)
            return sym(f"{receiver}.size({index})", "size", f"{receiver}.shape[{index}]")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "size" and not node.args:
            receiver = self.host.code(node.func.value)
            return sym(f"{receiver}.size({index})", "size", f"{receiver}.size({index})")
        return unknown("tuple element of a value kaudit does not follow", self.host.code(node))

    def expr(self, node: ast.AST, at: tuple[int, int]) -> Expr:  # noqa: C901 - one case per form
        # Source text is kept for names, constants and calls (messages quote them); operators
        # render from their operands.
        if isinstance(node, ast.Name):
            return self.resolve(node.id, at, node.id)
        text = "" if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.BoolOp)) \
            else self.host.code(node)
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool):
                return const(int(value), text)
            if isinstance(value, int):
                return const(value, text)
            if isinstance(value, float) and value.is_integer():
                return const(int(value), text)
            return unknown("not an integer", text)
        if isinstance(node, ast.Name):
            return self.resolve(node.id, at, text)
        if isinstance(node, ast.BinOp) and type(node.op) in _PY_BINOPS:
            return binary(_PY_BINOPS[type(node.op)], self.expr(node.left, at),
                          self.expr(node.right, at), text)
        if isinstance(node, ast.UnaryOp):
            inner = self.expr(node.operand, at)
            if isinstance(node.op, ast.USub):
                return op("neg", inner, text=text)
            if isinstance(node.op, ast.UAdd):
                return with_text(inner, text)
            return op("not", inner, text=text)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _PY_CMPOPS:
            return op("cmp", self.expr(node.left, at), self.expr(node.comparators[0], at),
                      value=_PY_CMPOPS[type(node.ops[0])], text=text)
        if isinstance(node, ast.IfExp):
            return op("cond", self.expr(node.test, at), self.expr(node.body, at),
                      self.expr(node.orelse, at), text=text)
        if isinstance(node, ast.BoolOp):
            return op("bool", *(self.expr(v, at) for v in node.values), text=text)
        if isinstance(node, ast.Call):
            return self._call(node, at, text)
        if isinstance(node, ast.Subscript):
            return self._subscript(node, at, text)
        if isinstance(node, ast.Attribute):
            parts = dotted_parts(node)
            if parts and parts[0] == "self" and len(parts) == 2:
                return self.host.self_attribute(self.function, parts[1], text)
            if node.attr == "ndim":
                return sym(f"{self.host.code(node.value)}.dim()", "size", text)
            return unknown(f"`{text}` is an attribute kaudit does not follow", text)
        return unknown(f"`{text[:40]}` is not an integer expression kaudit follows", text)

    def _call(self, node: ast.Call, at: tuple[int, int], text: str) -> Expr:
        func = node.func
        parts = dotted_parts(func) or []
        resolved = self.host.model.bindings.resolve(func) or ".".join(parts)
        last = resolved.split(".")[-1] if resolved else ""
        args = [a for a in node.args if not isinstance(a, ast.Starred)]
        if isinstance(func, ast.Attribute) and not (resolved.startswith(("triton", "math", "torch",
                                                                          "numpy"))):
            size = self._tensor_size(func.value, func.attr, args, text)
            if size is not None:
                return size
        if (last.lower() in CEIL_DIV_NAMES or resolved == "triton.cdiv") and len(args) == 2:
            return op("cdiv", self.expr(args[0], at), self.expr(args[1], at), text=text)
        if resolved in ("math.ceil", "numpy.ceil", "torch.ceil") and len(args) == 1:
            return rounding("ceil", self.expr(args[0], at), text)
        if resolved in ("math.floor", "numpy.floor") and len(args) == 1:
            return rounding("floor", self.expr(args[0], at), text)
        if resolved in ("int", "math.trunc") and len(args) == 1:
            return rounding("trunc", self.expr(args[0], at), text)
        if resolved in ("min", "max") and len(args) >= 2 and "min" not in self.host.model.functions \
                and "max" not in self.host.model.functions:
            return op(resolved, *(self.expr(a, at) for a in args), text=text)
        if resolved == "triton.language.constexpr" and len(args) == 1:  # FEATURES = tl.constexpr(1000)
            return with_text(self.expr(args[0], at), text)
        if resolved.endswith("next_power_of_2") and len(args) == 1:
            return op("np2", self.expr(args[0], at), text=text)
        if resolved == "len" and len(args) == 1:
            return sym(f"len({self.host.code(args[0])})", "size", text)
        if len(parts) == 1 and parts[0] in self.host.model.functions \
                and parts[0] not in self.host.model.triton_kernels:
            inlined = self.host.inline_python(self.host.model.functions[parts[0]], node, self, at)
            if inlined is not None:
                return with_text(inlined, text)
        return unknown(f"`{text[:50]}` is computed by a call kaudit does not follow", text)

    def _tensor_size(self, receiver: ast.expr, method: str, args: list[ast.expr],
                     text: str) -> Expr | None:
        name = self.host.code(receiver)
        if method in ("numel", "nelement") and not args:
            return sym(f"{name}.numel()", "size", text)
        if method in ("size", "stride") and len(args) == 1:
            index = self.host.code(args[0])
            return sym(f"{name}.{method}({index})", "size", text)
        if method == "dim" and not args:
            return sym(f"{name}.dim()", "size", text)
        return None

    def _subscript(self, node: ast.Subscript, at: tuple[int, int], text: str) -> Expr:
        value, index = node.value, node.slice
        if isinstance(value, ast.Name) and value.id == self.meta and isinstance(index, ast.Constant):
            key = str(index.value)
            return self.meta_values.get(key) or sym(f"meta.{key}", "meta", text)
        if isinstance(value, ast.Attribute) and value.attr == "shape":
            return sym(f"{self.host.code(value.value)}.size({self.host.code(index)})", "size", text)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and value.func.attr == "size" and not value.args:
            return sym(f"{self.host.code(value.func.value)}.size({self.host.code(index)})", "size",
                       text)
        if isinstance(value, ast.Name) and isinstance(index, ast.Constant) \
                and isinstance(index.value, int):
            chosen, _ = self.select(value.id, at)
            if chosen and len(chosen) == 1 and chosen[0].index is None \
                    and isinstance(chosen[0].value, (ast.Tuple, ast.List)):
                return self._element(chosen[0].value, index.value, chosen[0].position, unknown(""))
        return unknown(f"`{text[:50]}` is an element kaudit does not follow", text)


@dataclass(frozen=True)
class _Else:
    """Marks the `else` branch of an `if` as a conditional container of its own."""

    statement: ast.If


def _param_names(function: ast.AST | None) -> set[str]:
    args = getattr(function, "args", None)
    if not isinstance(args, ast.arguments):
        return set()
    return {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs} | \
        ({args.vararg.arg} if args.vararg else set()) | ({args.kwarg.arg} if args.kwarg else set())


def _encloses_all(containers: tuple[ast.AST, ...], at: tuple[int, int]) -> bool:
    """True when every conditional statement around a definition also holds the position `at`
    (so the definition runs whenever `at` does)."""
    for container in containers:
        node = container.statement if isinstance(container, _Else) else container
        if isinstance(container, _Else):
            start = (node.orelse[0].lineno, node.orelse[0].col_offset) if node.orelse else (0, 0)
        elif isinstance(node, ast.If):
            start = (node.lineno, node.col_offset)
            end_body = node.body[-1]
            if not (start <= at <= (end_body.end_lineno or 0, end_body.end_col_offset or 0)):
                return False
            continue
        else:
            start = (node.lineno, node.col_offset)  # type: ignore[attr-defined]
        end = (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)
        if not start <= at <= end:
            return False
    return True


def _remainder_test(containers: tuple[ast.AST, ...]) -> ast.expr | None:
    """The test of `if n % BLOCK: grid += 1` (which rounds the grid up) around an update."""
    for container in containers:
        test = getattr(container, "test", None)
        if test is not None and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
                                    for n in ast.walk(test)):
            return test
    return None


# --- a small entry point for tests and examples ---------------------------------------------------

def parse_python_expr(text: str, env: dict[str, str] | None = None) -> Expr:
    """An expression written in Python (`(n + 255) // 256`, `triton.cdiv(n, BLOCK)`), evaluated
    at module level after `import math, triton` and the assignments in `env` (name -> Python
    source). Free names are size symbols, except names in capitals (`B`, `BLOCK`), which are
    block sizes chosen by the launch (Triton meta-parameters). For tests and examples."""
    lines = ["import math", "import triton"] + [f"{k} = {v}" for k, v in (env or {}).items()]
    source = "\n".join(lines + [f"__kaudit_e = {text}", ""])
    model = SourceModel("<expr>", source)
    host = PythonHost(model)
    tree = model.module.body[-1].value  # type: ignore[union-attr,attr-defined]
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - set(env or {}) \
        - {"min", "max", "int", "len", "math", "triton"}
    bound = {n: sym(n, "meta" if n.isupper() else "size", n) for n in names}
    return PyScope(host, None, bound=bound).expr(tree, (len(lines) + 1, 0))
