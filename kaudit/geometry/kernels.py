"""What a kernel indexes with, from its body alone: the block/program and thread axes its stored
indices depend on, grid-stride and persistent loops, whether each global store is guarded (a
bounds check, a mask, an early exit), the elements each block covers, bounds compared with
literals, and static shared memory. CUDA kernels are read with tree-sitter, Triton kernels with
`ast`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kaudit.cpp import CppFunction
from kaudit.forward import walk_code
from kaudit.geometry.algebra import (
    Expr,
    binary,
    coefficient,
    equal,
    evaluate,
    poly_expr,
    sym,
    unknown,
    unknown_in,
    walk_expr,
    with_text,
)
from kaudit.geometry.cpp_host import (
    INTEGRAL_TYPES,
    KERNEL_KINDS,
    TYPE_BYTES,
    CppHost,
    CScope,
    Node,
    c_token_sets,
    c_tokens,
    declarator_name,
    number_literal,
)
from kaudit.geometry.python_host import PyScope, PythonHost
from kaudit.geometry.vocabulary import (
    AXIS_NAMES,
    BUILTIN_OBJECTS,
    IndexBound,
    KernelFacts,
    Store,
    axes_of,
)
from kaudit.python_scope import dotted_parts
from kaudit.source import CudaUnit, SourceModel, TritonKernel, child_nodes, walk_tree


def closure_of(deps: Callable[[str], Iterable[str]]) -> Callable[[Iterable[str]], frozenset[str]]:
    """The tokens some tokens depend on, transitively, given what each name is defined from
    (`deps`, asked once per name and only for the names reached)."""
    cache: dict[str, frozenset[str]] = {}
    direct: dict[str, Iterable[str]] = {}

    def of_name(name: str) -> frozenset[str]:
        if name in cache:
            return cache[name]
        seen = {name}
        pending = [name]
        while pending:
            current = pending.pop()
            if current not in direct:
                direct[current] = deps(current)
            for token in direct[current]:
                if token not in seen:
                    seen.add(token)
                    pending.append(token)
        cache[name] = frozenset(seen)
        return cache[name]

    def closure(tokens: Iterable[str]) -> frozenset[str]:
        out: set[str] = set()
        for token in tokens:
            out |= of_name(token)
        return frozenset(out)

    return closure


_EXIT_STATEMENTS = frozenset({"return_statement", "break_statement", "continue_statement"})


def _exits(node: Node) -> bool:
    if node.type in _EXIT_STATEMENTS:
        return True
    if node.type == "compound_statement":
        return any(c.type in _EXIT_STATEMENTS for c in node.named_children)
    return False


def cuda_kernel_facts(host: CppHost, function: CppFunction) -> KernelFacts:  # noqa: C901
    unit = function.unit
    scope = CScope(host, unit, function, kernel=True)
    body = function.body
    token_sets: dict[str, tuple[set[str], set[str]]] = {}

    def tokens_of(name: str) -> tuple[set[str], set[str]]:
        """What `name`'s definitions read: every token, and those not read through memory."""
        if name not in token_sets:
            every: set[str] = set()
            direct: set[str] = set()
            for definition in scope.defs.get(name, ()):
                if definition.value is not None:
                    found = c_token_sets(definition.value, unit)
                    every |= found[0]
                    direct |= found[1]
            token_sets[name] = (every, direct)
        return token_sets[name]

    closure = closure_of(lambda name: tokens_of(name)[0])
    globals_ = set(scope.pointer_params)
    shared: list[tuple[str, int | None]] = []
    local_pointers: list[tuple[str, set[str]]] = []
    stores_raw: list[tuple[Node, set[str], Node]] = []  # (statement, index tokens, index node)
    loops: list[Node] = []
    comparisons: list[Node] = []
    builtins: set[str] = set()
    for node in host.nodes(unit, KERNEL_KINDS, body) if body is not None else []:
        kind = node.type
        if kind == "declaration":
            _kernel_declaration(node, unit, scope, shared, local_pointers)
        elif kind == "assignment_expression":
            left = node.child_by_field_name("left")
            if left is not None:
                stores_raw.append((node, set(), left))
        elif kind == "call_expression":
            callee = node.child_by_field_name("function")
            arguments = node.child_by_field_name("arguments")
            if callee is not None and unit.text_of(callee).startswith("atomic") \
                    and arguments is not None and arguments.named_children:
                stores_raw.append((node, set(), arguments.named_children[0]))
        elif kind in ("for_statement", "while_statement", "do_statement"):
            loops.append(node)
        elif kind == "binary_expression":
            operator = node.child_by_field_name("operator")
            if operator is not None and unit.text_of(operator) in ("<", "<=", ">", ">="):
                comparisons.append(node)
        elif kind == "field_expression":
            text = unit.text_of(node).replace(" ", "")
            if text.split(".")[0] in BUILTIN_OBJECTS:
                builtins.add(text)
    for _ in range(3):  # pointers derived from pointers: `float* row = out + r * n;`
        for name, tokens in local_pointers:
            if tokens & globals_:
                globals_.add(name)
    stores: list[Store] = []
    for statement, _, target in stores_raw:
        index = _store_index(target, unit, globals_)
        if index is None:
            continue
        index_tokens, index_text = index
        tokens = closure(index_tokens)
        clamps = [index_text] + [unit.text_of(d.value) for name in tokens
                                  for d in scope.defs.get(name, ()) if d.value is not None]
        guarded = any(w in text for text in clamps for w in ("min(", "max(", "%", "clamp")) \
            or _c_guarded(statement, body, tokens, closure, unit)
        stores.append(Store(unit.text_of(statement).split("\n")[0][:80], unit.location(statement),
                            guarded, tokens))
    store_tokens = frozenset().union(*(s.tokens for s in stores)) if stores else frozenset(builtins)
    loop_axes, stride_axes = set(), set()
    for loop in loops:
        covered, strided = _c_loop_axes(loop, unit, scope, closure)
        loop_axes |= covered
        stride_axes |= strided
    written = frozenset().union(*(s.tokens for s in stores))

    def coverage(output_only: bool) -> dict[int, list[Expr]]:
        found: dict[int, list[Expr]] = {}
        for name, defs in scope.defs.items():
            if output_only and name not in written:
                continue
            if len(defs) == 1 and defs[0].value is not None and "blockIdx." in deps_text(name):
                _add_coverage(found, scope.resolve(name, 0), "blockIdx.")
        for _statement, _, target in stores_raw:
            if target.type == "subscript_expression":
                indices = target.child_by_field_name("indices")
                if indices is not None and any(t.startswith("blockIdx.") for t in c_tokens(indices, unit)):
                    inner = indices.named_children[0] if indices.named_children else indices
                    _add_coverage(found, scope.expr(inner, 0), "blockIdx.")
        return found

    def deps_text(name: str) -> str:
        return " ".join(closure([name]))
    index_closure = closure_of(lambda name: tokens_of(name)[1])

    def bounds(fixed: bool) -> list[IndexBound]:
        return [bound for comparison in comparisons
                for bound in _c_index_bound(comparison, unit, scope, index_closure, fixed)]

    size_params = [name for name, type_text in scope.params.items()
                   if name not in scope.pointer_params
                   and any(t in type_text for t in INTEGRAL_TYPES)]
    return KernelFacts(
        function.name, "cuda", scope.param_names, size_params,
        axes_of(store_tokens, "blockIdx"), axes_of(store_tokens, "threadIdx"), loop_axes, stride_axes,
        coverage, stores, bounds, shared, template_params=scope.template_order)


def _kernel_declaration(node: Node, unit: CudaUnit, scope: CScope,
                        shared: list[tuple[str, int | None]],
                        local_pointers: list[tuple[str, set[str]]]) -> None:
    qualifiers = {unit.text_of(c) for c in node.children
                  if c.type in ("type_qualifier", "storage_class_specifier")}
    type_node = node.child_by_field_name("type")
    type_text = " ".join(unit.text_of(type_node).split()) if type_node is not None else ""
    for declarator in node.children_by_field_name("declarator"):
        if "__shared__" in qualifiers:
            if "extern" in qualifiers:
                continue
            target = declarator.child_by_field_name("declarator") \
                if declarator.type == "init_declarator" else declarator
            count: int | None = 1
            name = ""
            while target is not None and target.type == "array_declarator":
                size_node = target.child_by_field_name("size")
                size = evaluate(scope.expr(size_node, 0)) if size_node is not None else None
                count = None if size is None or count is None else count * size
                target = target.child_by_field_name("declarator")
            name = unit.text_of(target) if target is not None else "?"
            element = TYPE_BYTES.get(type_text)
            shared.append((name, None if count is None or element is None else count * element))
            continue
        if declarator.type == "init_declarator":
            inner = declarator.child_by_field_name("declarator")
            value = declarator.child_by_field_name("value")
            name_node, pointer = declarator_name(inner)
            if name_node is not None and value is not None and (pointer or type_text == "auto"):
                local_pointers.append((unit.text_of(name_node), c_tokens(value, unit)))


def _store_index(target: Node, unit: CudaUnit, globals_: set[str]) -> tuple[set[str], str] | None:
    """The tokens and text of the index a store target writes through, when it writes global
    memory (a pointer parameter or a pointer derived from one)."""
    while target.type in ("field_expression", "parenthesized_expression") and target.named_children:
        inner = target.child_by_field_name("argument") if target.type == "field_expression" \
            else target.named_children[0]
        if inner is None:
            break
        target = inner
    if target.type == "subscript_expression":
        argument = target.child_by_field_name("argument")
        indices = target.child_by_field_name("indices")
        if argument is None or indices is None:
            return None
        base = c_tokens(argument, unit)
        if not base & globals_:
            return None
        return (c_tokens(indices, unit) | base) - globals_, unit.text_of(indices)
    if target.type == "pointer_expression":
        argument = target.child_by_field_name("argument")
        if argument is None:
            return None
        if argument.type == "subscript_expression":  # atomicAdd(&out[i], v)
            return _store_index(argument, unit, globals_)
        tokens = c_tokens(argument, unit)
        if target.child_by_field_name("operator") is not None and tokens & globals_:
            return tokens - globals_, unit.text_of(argument)
        return None
    if target.type in ("binary_expression", "identifier"):  # atomicAdd(out + i, v)
        tokens = c_tokens(target, unit)
        if tokens & globals_ and target.type == "binary_expression":
            return tokens - globals_, unit.text_of(target)
    return None


def _c_guarded(statement: Node, body: Node | None, tokens: frozenset[str],
               closure: Callable[[Iterable[str]], frozenset[str]], unit: CudaUnit) -> bool:
    """An `if`, loop condition or earlier early exit (`if (i >= n) return;`) bounds the index."""
    watched = {t for t in tokens if not t.startswith(("blockDim.", "gridDim."))}

    def bounds(condition: Node | None) -> bool:
        return condition is not None and bool(closure(c_tokens(condition, unit)) & watched)

    child, parent = statement, statement.parent
    while parent is not None and (body is None or child.id != body.id):
        kind = parent.type
        if kind in ("if_statement", "while_statement", "do_statement", "for_statement",
                    "conditional_expression"):
            if bounds(parent.child_by_field_name("condition")):
                return True
        elif kind == "else_clause":
            grand = parent.parent
            if grand is not None and bounds(grand.child_by_field_name("condition")):
                return True
        elif kind == "binary_expression" and "&&" in unit.text_of(parent.child_by_field_name("operator")
                                                                  or parent):
            left = parent.child_by_field_name("left")
            if left is not None and left.id != child.id and bounds(left):
                return True
        if kind == "compound_statement":
            for sibling in parent.named_children:
                if sibling.id == child.id:
                    break
                if sibling.type == "if_statement":
                    consequence = sibling.child_by_field_name("consequence")
                    if consequence is not None and _exits(consequence) \
                            and bounds(sibling.child_by_field_name("condition")):
                        return True
        child, parent = parent, parent.parent
    return False


def _c_loop_axes(loop: Node, unit: CudaUnit, scope: CScope,
                 closure: Callable[[Iterable[str]], frozenset[str]]) -> tuple[set[int], set[int]]:
    """Axes a loop covers (its variable starts from blockIdx and runs to a size) and axes it
    strides by gridDim."""
    condition = loop.child_by_field_name("condition")
    if condition is None:
        return set(), set()
    variables: set[str] = set()
    if loop.type == "for_statement":
        for part in ("initializer", "update"):
            node = loop.child_by_field_name(part)
            if node is None:
                continue
            for inner in walk_tree(node):
                if inner.type == "init_declarator":
                    name_node, _ = declarator_name(inner.child_by_field_name("declarator"))
                    if name_node is not None:
                        variables.add(unit.text_of(name_node))
                elif inner.type in ("assignment_expression", "update_expression"):
                    target = inner.child_by_field_name("left") or inner.child_by_field_name("argument")
                    if target is not None and target.type == "identifier":
                        variables.add(unit.text_of(target))
    condition_tokens = c_tokens(condition, unit)
    if not variables:  # while / do: the condition's names assigned inside the loop
        body = loop.child_by_field_name("body")
        assigned = {unit.text_of(n.child_by_field_name("left") or n) for n in walk_tree(body)
                    if n.type == "assignment_expression"} if body is not None else set()
        variables = condition_tokens & assigned
    if not variables:
        return set(), set()
    bound = {t for t in condition_tokens - variables if "." not in t}
    reach = closure(variables)
    covered = axes_of(reach, "blockIdx") if bound else set()
    strided = axes_of(reach, "gridDim")
    return covered | strided, strided


def _add_coverage(coverage: dict[int, list[Expr]], e: Expr, prefix: str) -> None:
    if unknown_in(e) and not any(s.op == "sym" and str(s.value).startswith(prefix) for s in walk_expr(e)):
        return
    for axis in range(3):
        atom = f"{prefix}{AXIS_NAMES[axis]}" if prefix.endswith(".") else f"{prefix}{axis}"
        if not any(s.op == "sym" and s.value == atom for s in walk_expr(e)):
            continue
        p = coefficient(e, atom)
        if p:
            found = poly_expr(p)
            if not any(equal(found, c) for c in coverage.get(axis, [])):
                coverage.setdefault(axis, []).append(found)


def _c_index_bound(comparison: Node, unit: CudaUnit, scope: CScope,
                   closure: Callable[[Iterable[str]], frozenset[str]], fixed: bool) -> list[IndexBound]:
    """The upper bounds a comparison puts on the global index (built from `blockIdx` and
    `threadIdx`, not through values read from memory): `i < n`, `4096 > i`, and `i >= n` only
    when it leaves (`if (i >= n) return;`); `o >= 4 && o <= L - 4` bounds `o` by `L` alone.
    `fixed`: bounds by a literal or a named constant, else bounds by kernel parameters."""
    left = comparison.child_by_field_name("left")
    right = comparison.child_by_field_name("right")
    operator = comparison.child_by_field_name("operator")
    if left is None or right is None or operator is None:
        return []
    sign = unit.text_of(operator)
    for index_side, other, upper in ((left, right, sign in ("<", "<=")),
                                     (right, left, sign in (">", ">="))):
        constant = other.type == "number_literal" or (
            other.type == "identifier" and unit.text_of(other) not in scope.params
            and unit.text_of(other) not in scope.defs)
        if constant != fixed:
            continue  # the other kind: decided without following the index
        reach = closure(c_tokens(index_side, unit, through_memory=False))
        if not (any(t.startswith("blockIdx.") for t in reach)
                and any(t.startswith("threadIdx.") for t in reach)):
            continue
        if not upper and not _leaves_when_true(comparison, unit):
            continue
        text = " ".join(unit.text_of(comparison).split())
        location = unit.location(comparison)
        if other.type == "number_literal":
            value, is_float = number_literal(unit.text_of(other))
            return [IndexBound(text, location, value)] if value is not None and not is_float \
                and value >= 2 else []
        names = c_tokens(other, unit, through_memory=False)
        if other.type == "identifier" and fixed:
            value = evaluate(scope.expr(other, 0))
            name = unit.text_of(other)
            return [IndexBound(text, location, value, name)] if value is not None and value >= 2 \
                else []
        params = [p for p in sorted(closure(names)) if p in scope.params
                  and p not in scope.pointer_params]
        return [IndexBound(text, location, param=p) for p in params]
    return []


def _leaves_when_true(comparison: Node, unit: CudaUnit) -> bool:
    """The comparison is (an `||` operand of) the condition of an `if` that returns, breaks or
    continues: `if (i >= n) return;` bounds `i` from above."""
    node, parent = comparison, comparison.parent
    while parent is not None and (parent.type in ("parenthesized_expression", "condition_clause")
                                  or (parent.type == "binary_expression"
                                      and unit.text_of(parent.child_by_field_name("operator")
                                                       or parent) == "||")):
        node, parent = parent, parent.parent
    if parent is None or parent.type != "if_statement":
        return False
    condition = parent.child_by_field_name("condition")
    consequence = parent.child_by_field_name("consequence")
    return condition is not None and condition.id == node.id and consequence is not None \
        and _exits(consequence)


# --- Triton ---------------------------------------------------------------------------------

_TL = "triton.language."


class TritonKernelScope(PyScope):
    """A Triton kernel's names: locals assigned once are replaced by their value; parameters are
    symbols the launch fills in; `tl.program_id(a)` is `pid<a>`, `tl.arange` a symbol per call."""

    def __init__(self, host: PythonHost, function: ast.FunctionDef,
                 values: dict[str, ast.expr | None], aranges: dict[int, int]) -> None:
        super().__init__(host, function)
        self.values = values
        self.aranges = aranges
        self._memo_values: dict[str, Expr] = {}
        self._active: set[str] = set()

    def resolve(self, name: str, at: tuple[int, int], text: str = "") -> Expr:
        text = text or name
        if name in self.values:
            value = self.values[name]
            if value is not None and name not in self._active:
                if name not in self._memo_values:
                    self._active.add(name)
                    try:
                        self._memo_values[name] = self.expr(value, at)
                    finally:
                        self._active.discard(name)
                return with_text(self._memo_values[name], text)
            return sym(name, "local", text)
        if name in self._params:
            return sym(name, "kparam", text)
        return self.host.module_value(name, text)

    def _call(self, node: ast.Call, at: tuple[int, int], text: str) -> Expr:
        resolved = self.host.model.bindings.resolve(node.func) or ""
        if resolved.startswith(_TL):
            short = resolved[len(_TL):]
            if short in ("program_id", "num_programs"):
                axis = _triton_axis(node)
                prefix = "pid" if short == "program_id" else "nprog"
                return sym(f"{prefix}{axis}", "builtin", text)
            if short == "arange":
                return sym(f"arange#{self.aranges.get(id(node), 0)}", "builtin", text)
        return super()._call(node, at, text)


def _triton_axis(call: ast.Call) -> int | None:
    node = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "axis"), None)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    return None if node is not None else 0


def _parents(nodes: list[ast.stmt]) -> dict[int, ast.AST]:
    """id(node) -> its parent, under `nodes`, not entering nested functions or classes."""
    return {id(child): node for node in walk_code(nodes, into_functions=False)
            for child in child_nodes(node)}


def triton_kernel_facts(host: PythonHost, kernel: TritonKernel) -> KernelFacts:  # noqa: C901
    function = kernel.node
    model = host.model
    params = [a.arg for a in function.args.posonlyargs + function.args.args]
    constexpr = {a.arg for a in function.args.posonlyargs + function.args.args
                 if a.annotation is not None and host.code(a.annotation).endswith("constexpr")}
    values: dict[str, list[ast.expr]] = {}
    parents: dict[int, ast.AST] = {}
    calls: list[tuple[ast.Call, str]] = []
    loops: list[ast.AST] = []
    compares: list[ast.Compare] = []
    aranges: dict[int, int] = {}
    arange_nodes: list[ast.Call] = []
    for node in walk_code(function.body, into_functions=False):
        kind = type(node)
        if kind is ast.Name or kind is ast.Constant or kind is ast.Attribute:
            continue
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        values.setdefault(name.id, []).append(
                            node.value if isinstance(target, ast.Name) else _Opaque(node.value))
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name) \
                and node.value is not None:
            values.setdefault(node.target.id, []).append(node.value)
            if isinstance(node, ast.AugAssign):
                values[node.target.id].append(node.target)
        elif isinstance(node, (ast.For, ast.While)):
            loops.append(node)
            if isinstance(node, ast.For):
                for name in ast.walk(node.target):
                    if isinstance(name, ast.Name):
                        values.setdefault(name.id, []).extend([node.iter, node.iter])
        elif isinstance(node, ast.Compare):
            compares.append(node)
        elif isinstance(node, ast.Call):
            resolved = model.bindings.resolve(node.func) or ""
            if resolved.startswith(_TL):
                short = resolved[len(_TL):]
                calls.append((node, short))
                if short == "arange":
                    aranges[id(node)] = len(arange_nodes)
                    arange_nodes.append(node)

    token_caches: dict[bool, dict[int, set[str]]] = {True: {}, False: {}}

    def tokens(node: ast.AST, through_memory: bool = True) -> set[str]:
        """What an expression reads; values `tl.load`ed add nothing unless `through_memory`."""
        cache = token_caches[through_memory]
        key = id(node)
        if key not in cache:
            cache[key] = _tokens(node, through_memory)
        return cache[key]

    tl_calls = {id(call): short for call, short in calls}

    def _tokens(node: ast.AST, through_memory: bool) -> set[str]:
        out: set[str] = set()
        start = node.value if isinstance(node, _Opaque) else node
        stack: list[ast.AST] = [start] if start is not None else []
        while stack:
            current = stack.pop()
            kind = type(current)
            if kind is ast.Name:
                out.add(current.id)  # type: ignore[attr-defined]
            elif kind is ast.Constant:
                continue
            elif kind is ast.Call:
                short = tl_calls.get(id(current), "")
                if short == "load" and not through_memory:
                    continue
                if short == "program_id":
                    out.add(f"pid{_triton_axis(current)}")  # type: ignore[arg-type]
                elif short == "num_programs":
                    out.add(f"nprog{_triton_axis(current)}")  # type: ignore[arg-type]
                elif short == "arange":
                    out.add(f"arange#{aranges.get(id(current), 0)}")
                elif short in ("make_block_ptr", "advance", "make_tensor_descriptor"):
                    out.add("blockptr")
                stack.extend(current.args)  # type: ignore[attr-defined]
                stack.extend(k.value for k in current.keywords)  # type: ignore[attr-defined]
                func = current.func  # type: ignore[attr-defined]
                if type(func) is ast.Attribute and not short:
                    stack.append(func.value)
            elif kind is ast.Attribute:
                stack.append(current.value)  # type: ignore[attr-defined]
            else:
                stack.extend(child_nodes(current))
        return out

    closure = closure_of(lambda name: set().union(*(tokens(v) for v in values.get(name, ()))))
    single = {name: (vs[0] if len(vs) == 1 and not isinstance(vs[0], _Opaque) else None)
              for name, vs in values.items()}
    scope = TritonKernelScope(host, function, single, aranges)
    stores: list[Store] = []
    for call, short in calls:
        if short != "store" and not short.startswith("atomic_"):
            continue
        pointer = call.args[0] if call.args else next((k.value for k in call.keywords
                                                       if k.arg == "pointer"), None)
        if pointer is None:
            continue
        reach = closure(tokens(pointer))
        keywords = {k.arg for k in call.keywords}
        masked = bool(keywords & {"mask", "boundary_check"}) or len(call.args) >= 3 \
            or "blockptr" in reach
        if not masked and not parents:
            parents.update(_parents(function.body))
        guarded = masked or _py_guarded(call, parents, closure, tokens, reach)
        extents = tuple(_arange_extent(arange_nodes[int(t.split("#")[1])], scope)
                        for t in sorted(reach) if t.startswith("arange#"))
        stores.append(Store(host.code(call).split("\n")[0][:80], model.location(call), guarded,
                            reach, extents))
    all_pids = {f"pid{_triton_axis(c)}" for c, short in calls if short == "program_id"}
    store_tokens = frozenset().union(*(s.tokens for s in stores)) if stores else frozenset(all_pids)
    loop_axes, stride_axes = set(), set()
    for loop in loops:
        covered, strided = _py_loop_axes(loop, closure, tokens, constexpr, model)
        loop_axes |= covered
        stride_axes |= strided
    written = frozenset().union(*(s.tokens for s in stores))

    def coverage(output_only: bool) -> dict[int, list[Expr]]:
        found: dict[int, list[Expr]] = {}
        for name, vs in values.items():
            if output_only and name not in written:
                continue
            if len(vs) == 1 and not isinstance(vs[0], _Opaque) \
                    and any(t.startswith("pid") for t in closure([name])):
                _add_coverage(found, scope.resolve(name, (0, 0)), "pid")
        for call, short in calls:
            if (short == "store" or short.startswith("atomic_")) and call.args:
                if any(t.startswith("pid") for t in tokens(call.args[0])):
                    _add_coverage(found, scope.expr(call.args[0], (0, 0)), "pid")
        return found
    index_closure = closure_of(lambda name: set().union(*(tokens(v, False)
                                                          for v in values.get(name, ()))))

    def bounds(fixed: bool) -> list[IndexBound]:
        return [bound for compare in compares
                for bound in _py_index_bound(compare, index_closure, tokens, host, params,
                                             set(values), fixed)]

    compared = {t for c in compares for t in tokens(c)}
    size_params = [p for p in params if p not in constexpr and "ptr" not in p.lower()
                   and not p.lower().startswith("stride")
                   and (p in compared or _SIZE_NAME.match(p) is not None)]
    return KernelFacts(kernel.name, "triton", params, size_params, axes_of(store_tokens, "pid"), set(),
                       loop_axes, stride_axes, coverage, stores, bounds, [], constexpr=constexpr)


_SIZE_NAME = re.compile(r"^(n|N|M|K|L|B|size|numel|rows|cols|length|n_\w+|num_\w+|\w+_size|"
                        r"\w+_elements|\w+_len|\w*numel\w*)$")


@dataclass(frozen=True)
class _Opaque:
    """A value assigned through tuple unpacking: its dependencies count, its value is unknown."""

    value: ast.AST | None


def _arange_extent(call: ast.Call, scope: TritonKernelScope) -> Expr:
    args = call.args
    if len(args) == 2:
        start, stop = scope.expr(args[0], (0, 0)), scope.expr(args[1], (0, 0))
        return stop if evaluate(start) == 0 else binary("sub", stop, start)
    return unknown("arange", scope.host.code(call))


def _py_guarded(call: ast.AST, parents: dict[int, ast.AST],
                closure: Callable[[Iterable[str]], frozenset[str]],
                tokens: Callable[[ast.AST], set[str]], reach: frozenset[str]) -> bool:
    watched = {t for t in reach if not t.startswith("nprog")}
    node = call
    while id(node) in parents:
        parent = parents[id(node)]
        if isinstance(parent, (ast.If, ast.While)) and node is not parent.test:
            if closure(tokens(parent.test)) & watched:
                return True
        node = parent
    return False


def _py_loop_axes(loop: ast.AST, closure: Callable[[Iterable[str]], frozenset[str]],
                  tokens: Callable[[ast.AST], set[str]], constexpr: set[str],
                  model: SourceModel) -> tuple[set[int], set[int]]:
    if isinstance(loop, ast.For):
        iterator = loop.iter
        if not isinstance(iterator, ast.Call) or not iterator.args:
            return set(), set()
        name = (model.bindings.resolve(iterator.func) or "").split(".")[-1] or \
            (dotted_parts(iterator.func) or [""])[-1]
        if name not in ("range", "static_range"):
            return set(), set()
        args = iterator.args
        start = args[0] if len(args) >= 2 else None
        stop = args[1] if len(args) >= 2 else args[0]
        step = args[2] if len(args) >= 3 else None
        start_reach = closure(tokens(start)) if start is not None else frozenset()
        stop_tokens = tokens(stop)
        step_reach = closure(tokens(step)) if step is not None else frozenset()
        sized = any(not t.startswith(("pid", "nprog", "arange")) for t in stop_tokens)
        covered = axes_of(start_reach, "pid") if sized else set()
        strided = axes_of(step_reach, "nprog")
        if covered and step is not None and not isinstance(step, ast.Constant):
            strided |= covered
        return covered | strided, strided
    if isinstance(loop, ast.While):
        variables = {n.id for n in ast.walk(loop.test) if isinstance(n, ast.Name)}
        reach = closure(variables)
        bound = variables - {n.target.id for n in ast.walk(loop) if isinstance(n, ast.AugAssign)
                             and isinstance(n.target, ast.Name)}
        covered = axes_of(reach, "pid") if bound else set()
        strided = axes_of(reach, "nprog")
        return covered | strided, strided
    return set(), set()


def _py_index_bound(compare: ast.Compare, closure: Callable[[Iterable[str]], frozenset[str]],
                    tokens: Callable[[ast.AST, bool], set[str]], host: PythonHost,
                    params: list[str], local_names: set[str], fixed: bool) -> list[IndexBound]:
    """The upper bounds a comparison puts on an element index (built from `tl.arange`, not
    through values loaded from memory): `offs < n`, `4096 > offs`, `cols < FEATURES` (a module
    constant). A literal counts only against a global index (`tl.program_id` too): `cols < 64`
    over one row is a block's shape."""
    if len(compare.ops) != 1:
        return []
    less = isinstance(compare.ops[0], (ast.Lt, ast.LtE))
    greater = isinstance(compare.ops[0], (ast.Gt, ast.GtE))
    for index_side, other, upper in ((compare.left, compare.comparators[0], less),
                                     (compare.comparators[0], compare.left, greater)):
        constant = isinstance(other, ast.Constant) or (
            isinstance(other, ast.Name) and other.id not in params and other.id not in local_names)
        if not upper or constant != fixed:
            continue
        reach = closure(tokens(index_side, False))
        if not any(t.startswith("arange") for t in reach):
            continue
        text, location = host.code(compare), host.model.location(compare)
        if isinstance(other, ast.Constant):
            value = other.value
            return [IndexBound(text, location, value)] if isinstance(value, int) \
                and not isinstance(value, bool) and value >= 2 \
                and any(t.startswith("pid") for t in reach) else []
        if isinstance(other, ast.Name) and fixed:
            value = evaluate(host.module_value(other.id, other.id))
            return [IndexBound(text, location, value, other.id)] if value is not None and value >= 2 \
                else []
        return [IndexBound(text, location, param=p) for p in sorted(closure(tokens(other, False)))
                if p in params]
    return []
