"""The C++/CUDA side: names in host functions and kernel bodies resolved to symbolic expressions
(declarations, assignments, `++`, `+=` under `if (n % B)`), file-scope constants and macros,
one-line helpers inlined, and `<<<grid, block>>>` configurations (`dim3` variables, initialiser
lists, scalars).
"""

from __future__ import annotations

import ast
from typing import Any

import tree_sitter

from kaudit.cpp import CppFunction, CppIndex
from kaudit.geometry.algebra import (
    Expr,
    binary,
    const,
    evaluate,
    op,
    rounding,
    sym,
    unknown,
    with_text,
)
from kaudit.geometry.vocabulary import AXES, BUILTIN_OBJECTS, CEIL_DIV_NAMES, Dims
from kaudit.source import CudaUnit, LineIndex, SourceModel, cuda_parser

Node = tree_sitter.Node
#: sizes of the element types shared memory arrays are declared with
TYPE_BYTES = {
    "char": 1, "signed char": 1, "unsigned char": 1, "bool": 1, "int8_t": 1, "uint8_t": 1,
    "short": 2, "unsigned short": 2, "int16_t": 2, "uint16_t": 2, "half": 2, "__half": 2,
    "at::Half": 2, "c10::Half": 2, "__nv_bfloat16": 2, "nv_bfloat16": 2, "at::BFloat16": 2,
    "int": 4, "unsigned": 4, "unsigned int": 4, "int32_t": 4, "uint32_t": 4, "float": 4,
    "half2": 4, "__half2": 4, "__nv_bfloat162": 4,
    "long": 8, "unsigned long": 8, "long long": 8, "unsigned long long": 8, "int64_t": 8,
    "uint64_t": 8, "size_t": 8, "double": 8, "float2": 8, "int2": 8,
    "float4": 16, "int4": 16, "double2": 16, "uint4": 16,
}
INTEGRAL_TYPES = ("int", "long", "short", "size_t", "int64_t", "int32_t", "uint32_t", "uint64_t",
                   "unsigned", "index_t", "int16_t", "uint16_t", "ssize_t", "ptrdiff_t")
_BRANCH_FIELDS = ("body", "consequence", "alternative")
_C_CONDITIONAL = frozenset({"if_statement", "for_statement", "while_statement", "do_statement",
                            "switch_statement", "case_statement", "for_range_loop",
                            "conditional_expression", "else_clause"})
_C_BINOPS = {"+": "add", "-": "sub", "*": "mul", "/": "tdiv", "%": "mod", "<<": "shl", ">>": "shr"}
_C_CMPOPS = frozenset({"<", "<=", ">", ">=", "==", "!="})
_FILE_SCOPE = frozenset({"translation_unit", "declaration_list", "preproc_ifdef", "preproc_if",
                         "preproc_else", "linkage_specification"})
_DEF_KINDS = ("declaration", "assignment_expression", "pointer_expression", "update_expression")
KERNEL_KINDS = ("declaration", "assignment_expression", "call_expression", "for_statement",
                 "while_statement", "do_statement", "binary_expression", "field_expression")
_FLOAT_TYPES = ("float", "double")


class _Snippet:
    """A piece of C text parsed on its own (a macro's value), with the `text_of` a unit has."""

    def __init__(self, text: str) -> None:
        self.data = f"long __kaudit_value = ({text});".encode("utf-8")
        tree = cuda_parser().parse(self.data)
        self.value = _first_of(tree.root_node, "init_declarator")
        if self.value is not None:
            self.value = self.value.child_by_field_name("value")

    def text_of(self, node: Node) -> str:
        return self.data[node.start_byte:node.end_byte].decode("utf-8", "replace")


Source = Any  # CudaUnit or _Snippet: anything with text_of(node)


def _first_of(node: Node, kind: str) -> Node | None:
    stack = [node]
    while stack:
        current = stack.pop()
        if current.type == kind:
            return current
        stack.extend(reversed(current.children))
    return None


def c_tokens(node: Node, src: Source, through_memory: bool = True) -> set[str]:
    """Identifiers an expression reads, with builtins as `blockIdx.x`; callee names left out.
    With `through_memory` False, values read from memory (`x[i]`, `*p`) add nothing: a loaded
    value is data, not an index."""
    every, direct = c_token_sets(node, src)
    return every if through_memory else direct


def c_token_sets(node: Node, src: Source) -> tuple[set[str], set[str]]:
    """`c_tokens` both ways in one walk: (every token, the tokens not read through memory)."""
    every: set[str] = set()
    direct: set[str] = set()
    stack = [(node, False)]
    while stack:
        current, loaded = stack.pop()
        kind = current.type
        if kind == "subscript_expression" or (kind == "pointer_expression" and current.children
                                              and current.children[0].type == "*"):
            loaded = True
        if kind == "field_expression":
            argument = current.child_by_field_name("argument")
            if argument is not None and argument.type == "identifier" \
                    and src.text_of(argument) in BUILTIN_OBJECTS:
                token = src.text_of(current).replace(" ", "")
                every.add(token)
                if not loaded:
                    direct.add(token)
                continue
            if argument is not None:
                stack.append((argument, loaded))
            continue
        if kind == "identifier":
            token = src.text_of(current)
            every.add(token)
            if not loaded:
                direct.add(token)
            continue
        if kind == "call_expression":
            arguments = current.child_by_field_name("arguments")
            function = current.child_by_field_name("function")
            if arguments is not None:
                stack.append((arguments, loaded))
            if function is not None and function.type == "field_expression":
                stack.append((function, loaded))  # x.size(0): the receiver is read
            continue
        if kind in ("string_literal", "type_descriptor", "template_argument_list", "sizeof_expression"):
            continue
        stack.extend((child, loaded) for child in current.children)
    return every, direct


def number_literal(text: str) -> tuple[int | None, bool]:
    """(value, is_float) of a C number literal."""
    raw = text.replace("'", "").strip()
    lowered = raw.lower()
    if lowered.startswith("0x"):
        try:
            return int(lowered.rstrip("ul"), 16), False
        except ValueError:
            return None, False
    is_float = any(c in lowered for c in ".e") or lowered.endswith("f")
    digits = lowered.rstrip("ulf")
    try:
        value = float(digits) if is_float else int(digits, 8 if len(digits) > 1 and digits[0] == "0" else 10)
    except ValueError:
        return None, is_float
    if is_float:
        return (int(value) if float(value).is_integer() else None), True
    return int(value), False


class CDef:
    """One definition of a C++ name: a declaration, an assignment, `++`, or `&name` handed out."""

    __slots__ = ("start", "value", "operator", "type_text", "node", "body", "_branches")

    def __init__(self, start: int, value: Node | None, operator: str, type_text: str, node: Node,
                 body: Node | None) -> None:
        self.start = start
        self.value = value
        self.operator = operator  # "=", "+=", "++", "&", "decl" (declared without a value)
        self.type_text = type_text
        self.node = node
        self.body = body
        self._branches: tuple[Node, ...] | None = None

    @property
    def branches(self) -> tuple[Node, ...]:
        """The conditional branches around the definition, innermost first."""
        if self._branches is None:
            out = []
            child, parent = self.node, self.node.parent
            while parent is not None and (self.body is None or child.id != self.body.id):
                if parent.type in _C_CONDITIONAL:
                    if parent.type in ("conditional_expression", "else_clause", "case_statement"):
                        out.append(child)
                    elif any((b := parent.child_by_field_name(f)) is not None and b.id == child.id
                             for f in _BRANCH_FIELDS):
                        out.append(child)
                child, parent = parent, parent.parent
            self._branches = tuple(out)
        return self._branches


class CScope:
    """Names of one C++ function: its declarations and assignments, its parameters, and the
    constants and macros of the file. Kernel scopes replace locals that are assigned once."""

    def __init__(self, host: CppHost, unit: CudaUnit, function: CppFunction | None, *,
                 kernel: bool = False, bound: dict[str, Expr] | None = None) -> None:
        self.host = host
        self.unit = unit
        self.function = function
        self.kernel = kernel
        self.bound = bound or {}
        self.params: dict[str, str] = {}  # name -> type text
        self.pointer_params: set[str] = set()
        self.template_params: set[str] = set()
        self.template_order: list[str] = []
        self.defs: dict[str, list[CDef]] = {}
        self._memo: dict[str, Expr] = {}
        self._active: set[str] = set()
        if function is not None:
            self._read_signature(function)
            if function.body is not None:
                self._collect(function.body)

    def _read_signature(self, function: CppFunction) -> None:
        declarator = function.node.child_by_field_name("declarator")
        while declarator is not None and declarator.type != "function_declarator":
            declarator = declarator.child_by_field_name("declarator")
        parameters = declarator.child_by_field_name("parameters") if declarator else None
        for parameter in parameters.named_children if parameters is not None else []:
            if parameter.type not in ("parameter_declaration", "optional_parameter_declaration"):
                continue
            name_node, pointer = declarator_name(parameter.child_by_field_name("declarator"))
            if name_node is None:
                continue
            name = self.unit.text_of(name_node)
            type_node = parameter.child_by_field_name("type")
            self.params[name] = self.unit.text_of(type_node) if type_node is not None else ""
            if pointer:
                self.pointer_params.add(name)
        parent = function.node.parent
        if parent is not None and parent.type == "template_declaration":
            plist = parent.child_by_field_name("parameters")
            for parameter in plist.named_children if plist is not None else []:
                name_node, _ = declarator_name(parameter.child_by_field_name("declarator"))
                if name_node is None:
                    name_node = next((c for c in parameter.named_children
                                      if c.type in ("identifier", "type_identifier")), None)
                if name_node is not None:
                    self.template_params.add(self.unit.text_of(name_node))
                    self.template_order.append(self.unit.text_of(name_node))

    @property
    def param_names(self) -> list[str]:
        return list(self.params)

    def _collect(self, body: Node) -> None:
        unit, add = self.unit, self._add
        for node in self.host.nodes(unit, _DEF_KINDS, body):
            kind = node.type
            if kind == "declaration":
                type_node = node.child_by_field_name("type")
                type_text = unit.text_of(type_node) if type_node is not None else ""
                for child in node.children_by_field_name("declarator"):
                    if child.type == "init_declarator":
                        name_node, _ = declarator_name(child.child_by_field_name("declarator"))
                        if name_node is not None:
                            add(unit.text_of(name_node), CDef(
                                child.start_byte, child.child_by_field_name("value"), "=", type_text,
                                child, body))
                    else:
                        name_node, _ = declarator_name(child)
                        if name_node is not None:
                            add(unit.text_of(name_node), CDef(child.start_byte, None, "decl",
                                                              type_text, child, body))
            elif kind == "assignment_expression":
                left = node.child_by_field_name("left")
                if left is not None and left.type == "identifier":
                    operator = node.child_by_field_name("operator")
                    add(unit.text_of(left), CDef(
                        node.start_byte, node.child_by_field_name("right"),
                        unit.text_of(operator) if operator is not None else "=", "", node, body))
            elif kind == "pointer_expression":
                if node.child_count == 2 and node.children[1].type == "identifier" \
                        and unit.text_of(node.children[0]) == "&":
                    add(unit.text_of(node.children[1]), CDef(node.start_byte, None, "&", "", node,
                                                              body))
            elif kind == "update_expression":
                argument = node.child_by_field_name("argument")
                if argument is not None and argument.type == "identifier":
                    operator = node.child_by_field_name("operator")
                    add(unit.text_of(argument), CDef(
                        node.start_byte, None, unit.text_of(operator) if operator else "++", "",
                        node, body))

    def _add(self, name: str, definition: CDef) -> None:
        self.defs.setdefault(name, []).append(definition)

    # --- resolution ---------------------------------------------------------------------------

    def select(self, name: str, at: int) -> tuple[list[CDef], str]:
        found = [d for d in self.defs.get(name, []) if d.start < at]
        if not found:
            return [], ""
        for i in range(len(found) - 1, -1, -1):
            d = found[i]
            if d.operator in ("=", "decl") and all(b.start_byte <= at < b.end_byte for b in d.branches):
                return found[i:], ""
        return [], f"`{name}` is assigned only conditionally"

    def resolve(self, name: str, at: int, text: str = "") -> Expr:
        text = text or name
        if name in self.bound:
            return self.bound[name]
        if self.kernel:
            return self._kernel_name(name, text)
        chosen, reason = self.select(name, at)
        if reason:
            return unknown(reason, text)
        if chosen:
            return with_text(self._fold(name, chosen, at), text)
        return self._outer_name(name, text)

    def _outer_name(self, name: str, text: str) -> Expr:
        if name in self.params:
            type_text = self.params[name]
            if "Tensor" in type_text:
                return unknown(f"`{name}` is a tensor", text)
            return sym(name, "kparam" if self.kernel else "param", text)
        if name in self.template_params:
            return sym(name, "kparam", text)
        return self.host.constant(name, text)

    def _kernel_name(self, name: str, text: str) -> Expr:
        definitions = self.defs.get(name, [])
        if not definitions:
            return self._outer_name(name, text)
        if len(definitions) == 1 and definitions[0].value is not None \
                and definitions[0].operator == "=" and name not in self._active:
            if name not in self._memo:
                self._active.add(name)
                try:
                    self._memo[name] = self.expr(definitions[0].value, definitions[0].start)
                finally:
                    self._active.discard(name)
            return with_text(self._memo[name], text)
        return sym(name, "local", text)

    def _fold(self, name: str, chosen: list[CDef], at: int) -> Expr:
        if name in self._active:
            return unknown(f"`{name}` is defined in terms of itself", name)
        self._active.add(name)
        try:
            first = chosen[0]
            if first.value is None:
                return unknown(f"`{name}` is declared without a value", name)
            value = self.expr(first.value, first.start)
            for d in chosen[1:]:
                conditional = not all(b.start_byte <= at < b.end_byte for b in d.branches)
                if d.operator == "&":
                    return unknown(f"`{name}` is written through its address", name)
                if d.operator in ("++", "--") or d.value is None:
                    step: Expr = const(1)
                    operator = "+=" if d.operator == "++" else "-="
                else:
                    step = self.expr(d.value, d.start)
                    operator = d.operator
                if conditional:
                    test = self._remainder_test(d)
                    if operator == "+=" and test is not None:
                        value = op("add", value, op("cond", self.expr(test, d.start), step, const(0)))
                        continue
                    return unknown(f"`{name}` is reassigned conditionally", name)
                if operator == "=":
                    value = step
                elif operator in ("+=", "-=", "*=", "/=", "%="):
                    value = binary(_C_BINOPS[operator[0]], value, step)
                else:
                    return unknown(f"`{name}` is updated with `{operator}`", name)
            return value
        finally:
            self._active.discard(name)

    def _remainder_test(self, definition: CDef) -> Node | None:
        """The condition of `if (n % B) blocks++;` around an increment."""
        node = definition.node.parent
        while node is not None:
            if node.type == "if_statement":
                condition = node.child_by_field_name("condition")
                if condition is not None and "%" in self.unit.text_of(condition):
                    return condition
            node = node.parent
        return None

    def file_constant(self, node: Node, at: int, depth: int = 0) -> str | None:
        """The file-scope constant or macro an expression names (`N`, or a local set once from
        it), if any."""
        if node.type != "identifier" or depth > 3:
            return None
        name = self.unit.text_of(node)
        if name in self.bound or name in self.params or name in self.template_params:
            return None
        chosen, reason = self.select(name, at)
        if reason:
            return None
        if chosen:
            first = chosen[0]
            if len(chosen) == 1 and first.value is not None:
                return self.file_constant(first.value, first.start, depth + 1)
            return None
        return name if evaluate(self.host.constant(name, name)) is not None else None

    # --- expressions --------------------------------------------------------------------------

    def expr(self, node: Node, at: int, src: Source | None = None) -> Expr:  # noqa: C901
        src = src or self.unit
        text = src.text_of(node)
        kind = node.type
        if kind == "number_literal":
            value, is_float = number_literal(text)
            if value is None:
                return unknown("not an integer", text)
            return op("float", const(value), text=text) if is_float else const(value, text)
        if kind in ("true", "false"):
            return const(int(kind == "true"), text)
        if kind == "identifier":
            return self.resolve(text, at, text)
        if kind in ("parenthesized_expression", "expression_statement", "condition_clause"):
            inner = node.named_children[-1] if node.named_children else None
            return with_text(self.expr(inner, at, src), text) if inner is not None \
                else unknown("empty", text)
        if kind == "binary_expression":
            return self._binary(node, at, src, text)
        if kind == "unary_expression":
            argument = node.child_by_field_name("argument")
            operator = node.child_by_field_name("operator")
            inner = self.expr(argument, at, src) if argument is not None else unknown("", text)
            sign = src.text_of(operator) if operator is not None else ""
            if sign == "-":
                return op("neg", inner, text=text)
            if sign == "+":
                return with_text(inner, text)
            return op("not", inner, text=text)
        if kind == "cast_expression":
            type_node = node.child_by_field_name("type")
            value = node.child_by_field_name("value")
            if value is None:
                return unknown("cast", text)
            return self._cast(src.text_of(type_node) if type_node is not None else "",
                              self.expr(value, at, src), text)
        if kind == "conditional_expression":
            parts = [node.child_by_field_name(f) for f in ("condition", "consequence", "alternative")]
            if any(p is None for p in parts):
                return unknown("conditional", text)
            return op("cond", *(self.expr(p, at, src) for p in parts), text=text)  # type: ignore[arg-type]
        if kind == "call_expression":
            return self._call(node, at, src, text)
        if kind == "subscript_expression":
            argument = node.child_by_field_name("argument")
            if argument is not None and argument.type == "call_expression":
                function = argument.child_by_field_name("function")
                if function is not None and function.type == "field_expression" \
                        and src.text_of(function).replace(" ", "").endswith((".sizes", "->sizes")):
                    receiver = function.child_by_field_name("argument")
                    indices = node.child_by_field_name("indices")
                    index = src.text_of(indices).strip("[] ") if indices is not None else "?"
                    return sym(f"{src.text_of(receiver)}.size({index})", "size", text)
            return unknown(f"`{text[:40]}` is an element kaudit does not follow", text)
        if kind == "field_expression":
            compact = text.replace(" ", "")
            head, _, axis = compact.partition(".")
            if head in BUILTIN_OBJECTS and axis in AXES:
                return sym(compact, "builtin", text)
            return unknown(f"`{text[:40]}` is a member kaudit does not follow", text)
        if kind == "sizeof_expression":
            type_node = node.child_by_field_name("type")
            inner = src.text_of(type_node) if type_node is not None else text[6:].strip("() ")
            size = TYPE_BYTES.get(" ".join(inner.replace("const", "").split()))
            return const(size, text) if size is not None else unknown(f"`{text}`", text)
        return unknown(f"`{text[:40]}` is not an integer expression kaudit follows", text)

    def _binary(self, node: Node, at: int, src: Source, text: str) -> Expr:
        left_node = node.child_by_field_name("left")
        right_node = node.child_by_field_name("right")
        operator_node = node.child_by_field_name("operator")
        if left_node is None or right_node is None or operator_node is None:
            return unknown("incomplete expression", text)
        operator = src.text_of(operator_node)
        left, right = self.expr(left_node, at, src), self.expr(right_node, at, src)
        if operator in _C_CMPOPS:
            return op("cmp", left, right, value=operator, text=text)
        if operator in ("&&", "||", "&", "|", "^"):
            return op("bool" if operator in ("&&", "||") else "bits", left, right, value=operator,
                      text=text)
        name = _C_BINOPS.get(operator)
        if name is None:
            return unknown(f"operator {operator}", text)
        if name == "tdiv" and (_is_float(left) or _is_float(right)):
            return op("truediv", _strip_float(left), _strip_float(right), text=text)
        if name in ("add", "sub", "mul") and (_is_float(left) or _is_float(right)):
            return op("float", binary(name, _strip_float(left), _strip_float(right)), text=text)
        return binary(name, left, right, text)

    def _cast(self, type_text: str, inner: Expr, text: str) -> Expr:
        compact = " ".join(type_text.split())
        if compact in _FLOAT_TYPES:
            return op("float", inner, text=text)
        if any(t in compact for t in INTEGRAL_TYPES) or compact in ("auto",):
            return rounding("trunc", inner, text) if inner.op in ("truediv", "float") \
                else with_text(_strip_float(inner), text)
        return with_text(inner, text)

    def _call(self, node: Node, at: int, src: Source, text: str) -> Expr:  # noqa: C901
        function = node.child_by_field_name("function")
        arguments = node.child_by_field_name("arguments")
        arg_nodes = list(arguments.named_children) if arguments is not None else []
        args = lambda: [self.expr(a, at, src) for a in arg_nodes]  # noqa: E731
        if function is None:
            return unknown("call", text)
        callee = "".join(src.text_of(function).split())
        if function.type == "template_function":
            name_node = function.child_by_field_name("name")
            base = src.text_of(name_node) if name_node is not None else callee
            if base in ("static_cast", "reinterpret_cast") and len(arg_nodes) == 1:
                targs = function.child_by_field_name("arguments")
                return self._cast(src.text_of(targs).strip("<> ") if targs is not None else "",
                                  self.expr(arg_nodes[0], at, src), text)
        if function.type == "field_expression":
            receiver = function.child_by_field_name("argument")
            method = callee.replace("->", ".").rsplit(".", 1)[-1]
            receiver_text = src.text_of(receiver) if receiver is not None else "?"
            if method in ("numel", "nelement") and not arg_nodes:
                return sym(f"{receiver_text}.numel()", "size", text)
            if method in ("size", "stride") and len(arg_nodes) == 1:
                return sym(f"{receiver_text}.{method}({src.text_of(arg_nodes[0])})", "size", text)
            if method == "dim" and not arg_nodes:
                return sym(f"{receiver_text}.dim()", "size", text)
            return unknown(f"`{text[:50]}` is computed by a call kaudit does not follow", text)
        short = callee.split("::")[-1].split("<")[0]
        lowered = short.lower()
        if lowered in CEIL_DIV_NAMES and len(arg_nodes) == 2:
            a, b = args()
            return op("cdiv", a, b, text=text)
        if lowered in ("ceil", "ceilf", "ceill") and len(arg_nodes) == 1:
            return rounding("ceil", self.expr(arg_nodes[0], at, src), text)
        if lowered in ("floor", "floorf", "floorl") and len(arg_nodes) == 1:
            return rounding("floor", self.expr(arg_nodes[0], at, src), text)
        if lowered in ("min", "max", "umin", "umax", "imin", "imax") and len(arg_nodes) == 2:
            return op(lowered.lstrip("ui"), *args(), text=text)
        if short == "numel" and len(arg_nodes) == 1:
            return sym(f"{src.text_of(arg_nodes[0])}.numel()", "size", text)
        if short == "dim3":
            return unknown("dim3", text)
        inlined = self.host.inline(short, arg_nodes, self, at, src)
        if inlined is not None:
            return with_text(inlined, text)
        return unknown(f"`{text[:50]}` is computed by a call kaudit does not follow", text)


def _is_float(e: Expr) -> bool:
    return e.op in ("float", "truediv")


def _strip_float(e: Expr) -> Expr:
    return e.args[0] if e.op == "float" else e


def declarator_name(declarator: Node | None) -> tuple[Node | None, bool]:
    """The identifier a (pointer/array/reference) declarator names, and whether it is a pointer
    or array (so writes through it reach memory)."""
    pointer = False
    while declarator is not None and declarator.type != "identifier":
        if declarator.type in ("pointer_declarator", "array_declarator", "abstract_pointer_declarator"):
            pointer = True
        if declarator.type in ("field_identifier", "type_identifier"):
            return declarator, pointer
        inner = declarator.child_by_field_name("declarator")
        if inner is None:
            inner = next((c for c in declarator.named_children
                          if c.type in ("identifier", "pointer_declarator", "array_declarator",
                                        "reference_declarator")), None)
        declarator = inner
    return declarator, pointer


class CppHost:
    """The file-scope C++ facts of one file that every C++ scope consults: constants, macros,
    inlinable helpers, and an index of the node types the analysis looks for."""

    def __init__(self, model: SourceModel) -> None:
        self.model = model
        self._constants: dict[str, tuple[str, Any, Any]] | None = None
        self._memo: dict[str, Expr] = {}
        self._inline_depth = 0
        self._scopes: dict[int, CScope] = {}

    def nodes(self, unit: CudaUnit, kinds: tuple[str, ...], within: Node | None = None) -> list[Node]:
        """The nodes of the given types in a unit (inside `within` when given), in source order."""
        return unit.nodes(kinds, within)

    def scope(self, unit: CudaUnit, function: CppFunction | None) -> CScope:
        key = id(function) if function is not None else id(unit)
        if key not in self._scopes:
            self._scopes[key] = CScope(self, unit, function)
        return self._scopes[key]

    def constant(self, name: str, text: str) -> Expr:
        if self._constants is None:
            self._constants = {}
            for unit in self.model.cuda_units:
                self._collect_constants(unit)
        entry = self._constants.get(name)
        if entry is None:
            return unknown(f"`{name}` is not defined where kaudit can see it", text)
        if name not in self._memo:
            self._memo[name] = unknown(f"`{name}` is defined in terms of itself", name)
            kind, value, unit = entry
            if kind == "macro":
                snippet = _Snippet(value)
                result = CScope(self, unit, None).expr(snippet.value, 0, snippet) \
                    if snippet.value is not None else unknown(f"macro `{name}`", name)
            else:
                result = CScope(self, unit, None).expr(value, 0)
            self._memo[name] = result
        return with_text(self._memo[name], text)

    def _collect_constants(self, unit: CudaUnit) -> None:
        assert self._constants is not None
        for node in self.nodes(unit, ("preproc_def", "preproc_function_def", "declaration")):
            kind = node.type
            name_node = node.child_by_field_name("name")
            if kind == "preproc_def":
                value_node = node.child_by_field_name("value")
                if name_node is not None and value_node is not None:
                    self._constants.setdefault(unit.text_of(name_node),
                                                 ("macro", unit.text_of(value_node).strip(), unit))
            elif kind == "preproc_function_def":
                if name_node is not None:
                    self._constants.setdefault(unit.text_of(name_node), ("function", node, unit))
            elif node.parent is not None and node.parent.type in _FILE_SCOPE:
                qualifiers = {unit.text_of(c) for c in node.children if c.type == "type_qualifier"}
                if qualifiers & {"const", "constexpr"}:
                    for declarator in node.children_by_field_name("declarator"):
                        value = declarator.child_by_field_name("value")
                        name_node, _ = declarator_name(declarator.child_by_field_name("declarator"))
                        if declarator.type == "init_declarator" and value is not None \
                                and name_node is not None:
                            self._constants.setdefault(unit.text_of(name_node), ("value", value, unit))

    def inline(self, name: str, arg_nodes: list[Node], caller: CScope, at: int,
                 src: Source) -> Expr | None:
        if self._inline_depth > 4:
            return None
        if self._constants is None:
            self.constant("", "")
        assert self._constants is not None
        args = [caller.expr(a, at, src) for a in arg_nodes]
        entry = self._constants.get(name)
        self._inline_depth += 1
        try:
            if entry is not None and entry[0] == "function":
                node, unit = entry[1], entry[2]
                params_node = node.child_by_field_name("parameters")
                value_node = node.child_by_field_name("value")
                names = [unit.text_of(p) for p in params_node.named_children] if params_node else []
                if value_node is None or len(names) != len(args):
                    return None
                snippet = _Snippet(unit.text_of(value_node))
                if snippet.value is None:
                    return None
                return CScope(self, unit, None, bound=dict(zip(names, args))).expr(
                    snippet.value, 0, snippet)
            index = CppIndex.of(self.model)
            function = next((f for f in index.functions if f.name == name and f.qualifier != "global"),
                            None)
            if function is None or function.body is None:
                return None
            statements = [c for c in function.body.named_children if c.type != "comment"]
            if len(statements) != 1 or statements[0].type != "return_statement" \
                    or not statements[0].named_children:
                return None
            scope = CScope(self, function.unit, function)
            scope.bound = dict(zip(scope.param_names, args))
            return scope.expr(statements[0].named_children[0], statements[0].start_byte)
        finally:
            self._inline_depth -= 1

    # --- launch configurations ----------------------------------------------------------------

    def dims(self, node: Node, scope: CScope, at: int, depth: int = 0) -> Dims:
        unit = scope.unit
        text = " ".join(unit.text_of(node).split())
        if node.type == "identifier" and depth < 5:
            name = text
            chosen, reason = scope.select(name, at)
            if reason:
                return Dims([], 0, text, name, reason)
            if chosen:
                first = chosen[0]
                is_dim3 = "dim3" in first.type_text
                if is_dim3 and len(chosen) > 1:
                    return Dims([], 0, text, name, f"`{name}` is modified after its declaration")
                if first.value is None:
                    if is_dim3:
                        return Dims([], 0, text, name, f"`{name}` is set member by member")
                    return Dims([], 0, text, name, f"`{name}` is declared without a value")
                if is_dim3 or first.value.type in ("argument_list", "initializer_list") or \
                        _is_dim3_call(first.value, unit):
                    dims = self.dims(first.value, scope, first.start, depth + 1)
                    definition = dims.text if first.value.type != "argument_list" \
                        else f"dim3{dims.text}"
                    return Dims(dims.exprs, dims.explicit, text, name, dims.unknown_reason,
                                definition)
                value = scope.resolve(name, at, name)
                return Dims([value], 1, text, name,
                            definition=" ".join(unit.text_of(first.value).split()))
            if "dim3" in scope.params.get(name, ""):
                return Dims([], 0, text, name, f"`{name}` is a parameter of the host function")
        if node.type in ("argument_list", "initializer_list") or _is_dim3_call(node, unit):
            arguments = node.child_by_field_name("arguments") if node.type == "call_expression" \
                else node
            values = list(arguments.named_children) if arguments is not None else []
            values = [v for v in values if v.type != "comment"]
            if not values:
                return Dims([const(1), const(1), const(1)], 3, text)
            exprs = [scope.expr(v, at) for v in values[:3]]
            return Dims(exprs, len(exprs), text)
        return Dims([scope.expr(node, at)], 1, text)


def _is_dim3_call(node: Node, unit: CudaUnit) -> bool:
    if node.type != "call_expression":
        return False
    function = node.child_by_field_name("function")
    return function is not None and unit.text_of(function).replace(" ", "") in ("dim3", "::dim3")


# --- a small entry point for tests and examples ---------------------------------------------------

def parse_c_expr(text: str, prelude: str = "") -> Expr:
    """An expression written in C++ (`(n + 255) / 256`), evaluated inside a host function whose
    body starts with `prelude` (declarations such as `const int threads = 256;`). Free names are
    size symbols."""
    source = (f"void __kaudit_host(int n, int m, int rows, int cols) {{ {prelude}\n"
              f" long __kaudit_e = ({text}); }}")
    model = SourceModel("<expr>", "x = 0\n")
    unit = CudaUnit("cuda", source, cuda_parser().parse(source.encode("utf-8")), "<expr>",
                    LineIndex(source), None, ast.Constant(""))
    host = CppHost(model)
    index = CppIndex()
    index._add_unit(unit)
    function = index.functions[0]
    scope = CScope(host, unit, function)
    for name in ("n", "m", "rows", "cols"):
        scope.params[name] = "int"
    declaration = scope.defs["__kaudit_e"][0]
    value = scope.expr(declaration.value, declaration.start)  # type: ignore[arg-type]
    return _free_to_size(value)


def _free_to_size(e: Expr) -> Expr:
    if e.op == "unknown" and str(e.value).endswith("is not defined where kaudit can see it"):
        return sym(e.text, "size", e.text)
    if e.op == "sym" and e.kind == "param":
        return sym(e.value, "size", e.text)
    if not e.args:
        return e
    return Expr(e.op, tuple(_free_to_size(a) for a in e.args), e.value, e.text, e.kind, e.known)
