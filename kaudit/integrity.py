"""Shared facts for the integrity rules (KA3xx): one extra walk over the Python module, data-flow
helpers ("does this value come from forward's inputs?"), and small C++ queries over the CppIndex
(what a stream expression is, which host functions synchronise or check errors).

Only the KA3xx rules use this module; it never changes what the shared indexes report.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import tree_sitter

from kaudit.cpp import CppCall, CppFunction, CppIndex, KernelLaunch
from kaudit.forward import ForwardAnalysis, methods_of, walk_code
from kaudit.source import (  # compact: re-exported for the KA3xx rules
    CudaUnit,
    FunctionNode,
    SourceModel,
    child_nodes,
    compact,  # noqa: F401
)

# --- the Python module ---------------------------------------------------------------------------

SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".ptx",
                   ".py")  # `.py` only counts when the path is `__file__` itself (see below)


def _is_main_guard(node: ast.AST) -> bool:
    """`if __name__ == "__main__":` (either order)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    sides = [test.left, *test.comparators]
    return len(sides) == 2 and any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) \
        and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)


@dataclass
class ModuleFacts:
    """The nodes the KA3xx rules look at, from one walk over the module. Code under
    `if __name__ == "__main__":` is left out: the harness imports the module and never runs it."""

    calls: list[ast.Call] = field(default_factory=list)
    attributes: list[ast.Attribute] = field(default_factory=list)
    names: list[ast.Name] = field(default_factory=list)
    subscripts: list[ast.Subscript] = field(default_factory=list)
    compares: list[ast.Compare] = field(default_factory=list)
    #: (target expression, statement) for every assignment / augmented / annotated / del target
    targets: list[tuple[ast.expr, ast.stmt]] = field(default_factory=list)

    @classmethod
    def of(cls, model: SourceModel) -> ModuleFacts:
        def build() -> ModuleFacts:
            facts = cls()
            if model.module is not None:
                facts._collect(model.module)
            return facts

        return model.memo("integrity-facts", build)

    def _collect(self, module: ast.Module) -> None:
        stack: list[ast.AST] = [module]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Call):
                self.calls.append(node)
            elif isinstance(node, ast.Attribute):
                self.attributes.append(node)
            elif isinstance(node, ast.Name):
                self.names.append(node)
            elif isinstance(node, ast.Subscript):
                self.subscripts.append(node)
            elif isinstance(node, ast.Compare):
                self.compares.append(node)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    self._add_targets(target, node)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                self._add_targets(node.target, node)
            elif isinstance(node, ast.Delete):
                for target in node.targets:
                    self._add_targets(target, node)
            if _is_main_guard(node):
                stack.extend(reversed(node.orelse))  # type: ignore[attr-defined]
                continue
            stack.extend(reversed(child_nodes(node)))

    def _add_targets(self, target: ast.expr, statement: ast.stmt) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._add_targets(element, statement)
        elif isinstance(target, ast.Starred):
            self._add_targets(target.value, statement)
        else:
            self.targets.append((target, statement))


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def word_set(model: SourceModel) -> frozenset[str]:
    """Every identifier-like word of the file's text (comments and strings included): a cheap
    prefilter, since a name a rule looks for must be written somewhere in the file."""
    return model.memo("words", lambda: frozenset(_WORD.findall(model.text)))


def statement_targets(model: SourceModel) -> list[tuple[ast.expr, ast.stmt]]:
    """(target, statement) of every assignment, augmented or annotated assignment and `del` in
    the module, found by walking statement lists only (much cheaper than a full walk); code under
    `if __name__ == "__main__":` is left out."""
    return model.memo("statement-targets", lambda: _statement_targets(model))


def _statement_targets(model: SourceModel) -> list[tuple[ast.expr, ast.stmt]]:
    facts = ModuleFacts()
    blocks: list[list[ast.stmt]] = [model.module.body] if model.module is not None else []
    while blocks:
        for statement in blocks.pop():
            if isinstance(statement, ast.Assign):
                for target in statement.targets:
                    facts._add_targets(target, statement)
            elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
                facts._add_targets(statement.target, statement)
            elif isinstance(statement, ast.Delete):
                for target in statement.targets:
                    facts._add_targets(target, statement)
            if _is_main_guard(statement):
                blocks.append(statement.orelse)  # type: ignore[attr-defined]
                continue
            for name in ("body", "orelse", "finalbody"):
                inner = getattr(statement, name, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    blocks.append(inner)
            for handler in getattr(statement, "handlers", None) or []:
                blocks.append(handler.body)
            for case in getattr(statement, "cases", None) or []:
                blocks.append(case.body)
    return facts.targets


def imported_names(model: SourceModel) -> dict[str, str]:
    """Local name -> qualified name from import statements only (not `alias = torch.x`)."""
    bindings = model.bindings
    return model.memo("imported-names", lambda: {
        local: target for local, target in bindings.qualified.items()
        if local not in bindings.assignments})


def method_name(call: ast.Call) -> str | None:
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def first_line(model: SourceModel, node: ast.AST, limit: int = 60) -> str:
    """The source of a node on one line, shortened, for messages."""
    text = " ".join(model.code_of(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def forward_functions(model: SourceModel) -> list[FunctionNode]:
    """`ModelNew.forward` and everything it reaches (methods, helpers, submodule forwards)."""
    return ForwardAnalysis.of(model).reachable


def model_new_init(model: SourceModel) -> FunctionNode | None:
    cls = model.model_new
    return methods_of(cls).get("__init__") if cls is not None else None


def function_parameters(function: FunctionNode, skip_self: bool) -> list[str]:
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    if args.vararg:
        names.append(args.vararg.arg)
    if args.kwarg:
        names.append(args.kwarg.arg)
    if skip_self and names and names[0] in ("self", "cls"):
        names = names[1:]
    return names


def is_method(function: FunctionNode, model: SourceModel) -> bool:
    owner = ForwardAnalysis.of(model).owner.get(function)
    if owner is not None:
        return True
    params = function.args.posonlyargs + function.args.args
    return bool(params) and params[0].arg in ("self", "cls")


def names_in(expr: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}


def tainted_names(model: SourceModel, function: FunctionNode) -> set[str]:
    """Names in `function` whose value depends on its inputs (its parameters other than `self`):
    the parameters, and every name assigned, looped over or bound by `with` from an expression
    that mentions one of them. Scope-insensitive and flow-insensitive, like the bindings."""
    cache: dict[FunctionNode, set[str]] = model.__dict__.setdefault("_integrity_taint", {})
    if function in cache:
        return cache[function]
    tainted = set(function_parameters(function, skip_self=is_method(function, model)))
    flows: list[tuple[ast.AST, ast.AST]] = []  # (target, value)
    for node in walk_code(function.body):
        if isinstance(node, ast.Assign):
            flows.extend((t, node.value) for t in node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            flows.append((node.target, node.value))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            flows.append((node.target, node.iter))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            flows.append((node.optional_vars, node.context_expr))
        elif isinstance(node, ast.NamedExpr):
            flows.append((node.target, node.value))
    changed = True
    while changed:
        changed = False
        for target, value in flows:
            if names_in(value) & tainted:
                for name in names_in(target) - tainted:
                    if isinstance(target, (ast.Name, ast.Tuple, ast.List, ast.Starred)):
                        tainted.add(name)
                        changed = True
    cache[function] = tainted
    return tainted


def depends_on_inputs(model: SourceModel, function: FunctionNode, expr: ast.AST) -> bool:
    return bool(names_in(expr) & tainted_names(model, function))


def assignments_in(function: FunctionNode) -> dict[str, list[ast.expr]]:
    """Local name -> the values assigned to it in `function` (tuple unpacking paired up).
    Cached on the function node (several KA3xx rules ask for the same functions)."""
    cached = function.__dict__.get("_integrity_assignments")
    if cached is not None:
        return cached
    out: dict[str, list[ast.expr]] = {}
    function.__dict__["_integrity_assignments"] = out
    for node in walk_code(function.body):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                _pair(target, node.value, out)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            _pair(node.target, node.value, out)
        elif isinstance(node, ast.NamedExpr):
            _pair(node.target, node.value, out)
    return out


def _pair(target: ast.AST, value: ast.expr, out: dict[str, list[ast.expr]]) -> None:
    if isinstance(target, ast.Name):
        out.setdefault(target.id, []).append(value)
    elif isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts):
                _pair(t, v, out)
        else:
            for t in target.elts:
                _pair(t, value, out)  # `a, b = x.shape`: each comes from the whole value


def is_int_literal(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) \
            and not isinstance(node.value, bool):
        return node.value
    return None


def literal_path_is_source(model: SourceModel, expr: ast.AST, depth: int = 0) -> bool:
    """True for a path expression that names one of the kernel's own sources: it holds a string
    literal ending in a C++/CUDA suffix (`"kernel.cu"`, `f"{HERE}/k.cuh"`, `"*.cu"`), or it is
    `__file__` itself. Names are followed through their module-level assignments."""
    if isinstance(expr, ast.Name) and expr.id == "__file__":
        return True
    for node in ast.walk(expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.lower().endswith(SOURCE_SUFFIXES[:-1]):
                return True
        elif isinstance(node, ast.Name) and node is not expr and depth < 4:
            assigned = model.bindings.assignments.get(node.id, [])
            if len(assigned) == 1 and literal_path_is_source(model, assigned[0][1], depth + 1):
                return True
    if isinstance(expr, ast.Name) and depth < 4:
        assigned = model.bindings.assignments.get(expr.id, [])
        return len(assigned) == 1 and literal_path_is_source(model, assigned[0][1], depth + 1)
    return False


# --- C++ ------------------------------------------------------------------------------------------

def within(node: tree_sitter.Node, outer: tree_sitter.Node) -> bool:
    return outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte


def calls_in(index: CppIndex, function: CppFunction) -> list[CppCall]:
    per: dict[int, list[CppCall]] = index.__dict__.setdefault("_integrity_calls", {})
    key = id(function)
    if key not in per:
        per[key] = [c for c in index.calls if c.function is function]
    return per[key]


def launches_in(index: CppIndex, function: CppFunction) -> list[KernelLaunch]:
    per: dict[int, list[KernelLaunch]] = index.__dict__.setdefault("_integrity_launches", {})
    key = id(function)
    if key not in per:
        per[key] = [launch for launch in index.launches if launch.function is function]
    return per[key]


def callers_of(index: CppIndex, function: CppFunction) -> list[CppCall]:
    """Calls of a host function by its unqualified name (template arguments dropped)."""
    return [c for c in index.calls if c.short_name == function.name
            and c.function is not function and c.unit is function.unit]


def parameters_of(function: CppFunction) -> list[tuple[str, str]]:
    """(name, type text) of each parameter of a C++ function definition."""
    declarator = function.node.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    if declarator is None:
        return []
    params = declarator.child_by_field_name("parameters")
    out: list[tuple[str, str]] = []
    for param in params.named_children if params is not None else ():
        if param.type not in ("parameter_declaration", "optional_parameter_declaration"):
            continue
        name_node = param.child_by_field_name("declarator")
        while name_node is not None and name_node.type not in ("identifier",):
            inner = name_node.child_by_field_name("declarator")
            if inner is None:
                inner = next((c for c in name_node.named_children if c.type == "identifier"), None)
            name_node = inner
        type_node = param.child_by_field_name("type")
        out.append((function.unit.text_of(name_node) if name_node is not None else "",
                    compact(function.unit.text_of(type_node)) if type_node is not None else ""))
    return out


def has_tensor_parameter(function: CppFunction) -> bool:
    return any("Tensor" in type_text for _name, type_text in parameters_of(function))


def local_values(unit: CudaUnit, scope: tree_sitter.Node) -> dict[str, list[tree_sitter.Node]]:
    """Identifier -> the expressions it is initialised or assigned from, under `scope`
    (`int n = x.size(0);`, `dim3 grid(64, 64);` gives the argument list, `s = ...;`)."""
    cache: dict[tuple[int, int], dict[str, list[tree_sitter.Node]]] = \
        unit.__dict__.setdefault("_integrity_values", {})
    key = (scope.start_byte, scope.end_byte)
    if key in cache:
        return cache[key]
    out: dict[str, list[tree_sitter.Node]] = {}
    for node in unit.nodes(_DEFINITIONS, scope):
        if node.type == "init_declarator":
            name = node.child_by_field_name("declarator")
            value = node.child_by_field_name("value")
            while name is not None and name.type not in ("identifier",):
                name = name.child_by_field_name("declarator")
            if name is not None and value is not None:
                out.setdefault(unit.text_of(name), []).append(value)
        elif node.type == "assignment_expression":
            left = node.child_by_field_name("left")
            right = node.child_by_field_name("right")
            if left is not None and left.type == "identifier" and right is not None:
                out.setdefault(unit.text_of(left), []).append(right)
    cache[key] = out
    return out


_DEFINITIONS = ("init_declarator", "assignment_expression")


def integer_value(unit: CudaUnit, node: tree_sitter.Node) -> int | None:
    """The value of an integer-literal expression (`65536`, `(1 << 20)`, `4096 * 4096 / 256`)."""
    if node.type == "number_literal":
        literal = unit.text_of(node).lower().rstrip("ul")
        try:
            return int(literal, 0)
        except ValueError:
            return None
    if node.type == "parenthesized_expression" and node.named_child_count == 1:
        return integer_value(unit, node.named_children[0])
    if node.type == "binary_expression":
        left = node.child_by_field_name("left")
        right = node.child_by_field_name("right")
        operator = node.child_by_field_name("operator")
        if left is None or right is None or operator is None:
            return None
        a, b = integer_value(unit, left), integer_value(unit, right)
        if a is None or b is None:
            return None
        op = operator.type
        try:
            return {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else None,
                    "<<": a << b if 0 <= b < 64 else None, "%": a % b if b else None}.get(op)
        except (ValueError, OverflowError):
            return None
    return None


def enclosing_function(index: CppIndex, unit: CudaUnit, node: tree_sitter.Node
                       ) -> CppFunction | None:
    best: CppFunction | None = None
    for function in index.functions:
        if function.unit is unit and within(node, function.node):
            if best is None or within(function.node, best.node):
                best = function
    return best


def find_tokens(unit: CudaUnit, pattern: re.Pattern[str],
                types: frozenset[str]) -> Iterator[tuple[str, tree_sitter.Node]]:
    """Occurrences of `pattern` in a unit that tree-sitter reads as one of `types` (so words in
    comments and strings are skipped)."""
    encoded_prefix_needed = not unit.text.isascii()
    root = unit.tree.root_node
    for match in pattern.finditer(unit.text):
        start = match.start()
        byte = len(unit.text[:start].encode("utf-8")) if encoded_prefix_needed else start
        width = len(match.group(0).encode("utf-8"))
        node = root.descendant_for_byte_range(byte, byte + width)
        if node is not None and node.type in types:
            yield match.group(0), node


def find_words(unit: CudaUnit, words: Iterable[str],
               types: frozenset[str]) -> Iterator[tuple[str, tree_sitter.Node]]:
    """Occurrences of the whole words `words` in a unit that tree-sitter reads as one of `types`,
    found with `str.find` (no pattern to compile for each set of words)."""
    text = unit.text
    encoded_prefix_needed = not text.isascii()
    root = unit.tree.root_node
    for word in words:
        start = text.find(word)
        while start >= 0:
            end = start + len(word)
            if not _word_char(text, start - 1) and not _word_char(text, end):
                byte = len(text[:start].encode("utf-8")) if encoded_prefix_needed else start
                node = root.descendant_for_byte_range(byte, byte + len(word.encode("utf-8")))
                if node is not None and node.type in types:
                    yield word, node
            start = text.find(word, end)


def _word_char(text: str, i: int) -> bool:
    return 0 <= i < len(text) and (text[i].isalnum() or text[i] == "_")


def loop_or_block_rest(node: tree_sitter.Node) -> list[tree_sitter.Node]:
    """The statements after `node` in its enclosing block."""
    parent = node.parent
    if parent is None:
        return []
    siblings = parent.named_children
    for i, sibling in enumerate(siblings):
        if sibling.start_byte == node.start_byte and sibling.end_byte == node.end_byte:
            return siblings[i + 1:]
    return []

