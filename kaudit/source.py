"""The source model: one parse per file, shared by every rule.

A `SourceModel` holds the Python syntax tree (the standard library's `ast`, which carries positions),
the import/assignment bindings, the C++/CUDA sources handed to `load_inline`/`load` parsed by
tree-sitter with every node mapped back to the file a user opens, and the Triton kernels with their
launch sites. Rules read it; none re-parses.
"""

from __future__ import annotations

import ast
import bisect
import functools
import itertools
import os
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import tree_sitter
import tree_sitter_cuda

from kaudit.entry import MODEL_NEW, EntryPoint
from kaudit.findings import Location
from kaudit.python_scope import Bindings, MappedText, dotted_parts, string_literal_text

MAX_FILE_BYTES = 5 * 1024 * 1024
T = TypeVar("T")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_HEADER_END = re.compile(r":[ \t]*(#.*)?$")
_EXTENSION_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp")


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """`list(ast.iter_child_nodes(node))` without the expression contexts (`Load`, `Store`) and
    without ast's per-field generators."""
    out: list[ast.AST] = []
    for name in node._fields:
        value = getattr(node, name, None)
        if value.__class__ is list:
            out.extend([item for item in value if isinstance(item, ast.AST)])
        elif isinstance(value, ast.AST) and name != "ctx":
            out.append(value)
    return out


def walk_all(root: ast.AST) -> list[ast.AST]:
    """`list(ast.walk(root))` (breadth first) without the expression contexts (`Load`, `Store`)
    and without ast's per-field generators: the one full walk of each module, on the hot path of
    every scan."""
    out = [root]
    i = 0
    while i < len(out):
        node = out[i]
        i += 1
        for name in node._fields:
            value = getattr(node, name, None)
            if value.__class__ is list:
                out.extend([item for item in value if isinstance(item, ast.AST)])
            elif isinstance(value, ast.AST) and name != "ctx":
                out.append(value)
    return out


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


def walk_tree(root: tree_sitter.Node, types: frozenset[str] | None = None
              ) -> Iterator[tree_sitter.Node]:
    """Every node under a tree-sitter `root` (itself included), or those of the given types,
    depth first in source order. Given types, one query finds them (much faster than walking
    `children` from Python)."""
    if types is not None:
        found = find_nodes(root, tuple(sorted(types)))
        nodes = [node for kind in found.values() for node in kind]
        if len(found) > 1:
            nodes.sort(key=lambda node: (node.start_byte, -node.end_byte))
        yield from nodes
        return
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def compact(text: str) -> str:
    """`text` without any whitespace (`x . size ( 0 )` -> `x.size(0)`), for comparing code."""
    return "".join(text.split())


def split_lines(text: str) -> list[str]:
    """Lines as Python counts them (\\r\\n, \\r or \\n; not form feeds)."""
    return text.split("\n") if "\r" not in text else _LINE_BREAK.split(text)


@functools.cache
def cuda_language() -> tree_sitter.Language:
    return tree_sitter.Language(tree_sitter_cuda.language())


@functools.cache
def cuda_parser() -> tree_sitter.Parser:
    return tree_sitter.Parser(cuda_language())


@functools.cache
def _kinds_query(kinds: tuple[str, ...]) -> tree_sitter.Query:
    return tree_sitter.Query(cuda_language(), " ".join(f"({kind}) @{kind}" for kind in kinds))


#: the node types every C++ unit indexes once (CudaUnit.nodes): what the C++ index, the launch
#: geometry and the rules ask for most
INDEXED_KINDS = ("assignment_expression", "binary_expression", "call_expression", "declaration",
                 "do_statement", "field_expression", "for_statement", "function_definition",
                 "if_statement", "init_declarator", "pointer_expression", "preproc_def",
                 "preproc_function_def", "subscript_expression", "update_expression",
                 "while_statement")


def prepare_grammar() -> None:
    """Builds the C++ parser and the shared query now (worker processes forked afterwards
    inherit them instead of each building its own)."""
    cuda_parser()
    _kinds_query(INDEXED_KINDS)


def find_nodes(root: tree_sitter.Node, kinds: tuple[str, ...]) -> dict[str, list[tree_sitter.Node]]:
    """Nodes of the given types under `root`, in source order (outer before inner), by type. A
    tree-sitter query: much faster than walking `children` from Python."""
    found = tree_sitter.QueryCursor(_kinds_query(kinds)).captures(root)
    for nodes in found.values():
        nodes.sort(key=lambda node: (node.start_byte, -node.end_byte))
    return found


class LineIndex:
    """Character offsets <-> 1-based lines and columns of one text, and `ast`'s UTF-8 byte
    columns -> character columns."""

    def __init__(self, text: str) -> None:
        self.text = text
        if "\r" in text:
            self.starts = [0] + [m.end() for m in _LINE_BREAK.finditer(text)]
        else:
            self.starts = list(itertools.accumulate((len(line) + 1 for line in text.split("\n")[:-1]),
                                                    initial=0))
        self.ascii = text.isascii()

    def position(self, offset: int) -> tuple[int, int]:
        row = bisect.bisect_right(self.starts, offset) - 1
        return row + 1, offset - self.starts[row] + 1

    def offset(self, line: int, byte_column: int) -> int:
        """Character offset of `ast`'s (line, UTF-8 byte column)."""
        start = self.starts[min(max(line, 1), len(self.starts)) - 1]
        if self.ascii:
            return start + byte_column
        end = self.starts[line] if line < len(self.starts) else len(self.text)
        encoded = self.text[start:end].encode("utf-8")
        return start + len(encoded[:byte_column].decode("utf-8", "ignore"))


@dataclass
class InputProblem:
    """Why a file could not be analysed (it still gets a finding, at the place that broke)."""

    code: str  # the KA0xx rule that reports it
    message: str
    line: int = 1
    column: int = 1


@dataclass
class CudaUnit:
    """One C++/CUDA translation unit (a `cpp_sources`/`cuda_sources` argument or a file on disk)."""

    kind: str  # "cpp" or "cuda"
    text: str
    tree: tree_sitter.Tree
    path: str  # the file a user opens to see this code
    index: LineIndex  # of that file
    offsets: list[int] | None  # char -> offset in `path`; None when the unit *is* the file
    origin: ast.expr  # the Python expression the source came from

    @functools.cached_property
    def _char_of_byte(self) -> list[int] | None:
        if self.text.isascii():
            return None
        table: list[int] = []
        for i, ch in enumerate(self.text):
            table.extend([i] * len(ch.encode("utf-8")))
        table.append(len(self.text))
        return table

    def _char(self, byte: int) -> int:
        table = self._char_of_byte
        return byte if table is None else table[min(byte, len(table) - 1)]

    def _file_offset(self, char: int) -> int:
        if self.offsets is None:
            return char
        if not self.offsets:
            return 0
        return self.offsets[max(0, min(char, len(self.offsets) - 1))]

    def location(self, node: tree_sitter.Node) -> Location:
        start = self._char(node.start_byte)
        end = max(start, self._char(node.end_byte) - 1)
        line, column = self.index.position(self._file_offset(start))
        end_line, end_column = self.index.position(self._file_offset(end))
        return Location(self.path, line, column, end_line, end_column + 1)

    def text_of(self, node: tree_sitter.Node) -> str:
        table = self._char_of_byte
        if table is None:  # ASCII: bytes are characters
            return self.text[node.start_byte:node.end_byte]
        return self.text[self._char(node.start_byte) : self._char(node.end_byte)]

    def walk(self, types: frozenset[str] | None = None,
             root: tree_sitter.Node | None = None) -> Iterator[tree_sitter.Node]:
        """Every node of the unit, or under `root`, (or those of the given types), depth first."""
        return walk_tree(root or self.tree.root_node, types)

    def nodes_of(self, kinds: tuple[str, ...], root: tree_sitter.Node | None = None
                 ) -> dict[str, list[tree_sitter.Node]]:
        """`find_nodes` under `root`, by default the whole unit."""
        if not all(kind in INDEXED_KINDS for kind in kinds):
            return find_nodes(root or self.tree.root_node, kinds)
        return {kind: found for kind in kinds if (found := self._indexed(kind, root))}

    def nodes(self, kinds: tuple[str, ...], root: tree_sitter.Node | None = None
              ) -> list[tree_sitter.Node]:
        """The nodes of the given types under `root` (the whole unit by default), outer before
        inner in source order."""
        if not all(kind in INDEXED_KINDS for kind in kinds):
            return list(walk_tree(root or self.tree.root_node, frozenset(kinds)))
        if len(kinds) == 1:
            return list(self._indexed(kinds[0], root))
        starts, types, nodes = self._in_order
        lo, hi = (0, len(nodes)) if root is None else (
            bisect.bisect_left(starts, root.start_byte), bisect.bisect_left(starts, root.end_byte))
        return [node for kind, node in zip(types[lo:hi], nodes[lo:hi]) if kind in kinds]

    def _indexed(self, kind: str, root: tree_sitter.Node | None) -> list[tree_sitter.Node]:
        starts, nodes = self._node_index.get(kind, ((), []))
        if root is None:
            return nodes
        return nodes[bisect.bisect_left(starts, root.start_byte):
                     bisect.bisect_left(starts, root.end_byte)]

    @functools.cached_property
    def _node_index(self) -> dict[str, tuple[list[int], list[tree_sitter.Node]]]:
        """One query finds every node of the kinds the analyses look for; later lookups are
        slices of it."""
        return {kind: ([node.start_byte for node in nodes], nodes)
                for kind, nodes in find_nodes(self.tree.root_node, INDEXED_KINDS).items()}

    @functools.cached_property
    def _in_order(self) -> tuple[list[int], list[str], list[tree_sitter.Node]]:
        """Every indexed node in one list, outer before inner in source order: (starts, types,
        nodes); lookups of several kinds filter a slice of it instead of sorting."""
        entries = sorted(((node.start_byte, -node.end_byte, kind, node)
                          for kind, (_, nodes) in self._node_index.items() for node in nodes),
                         key=lambda entry: entry[:2])
        return [e[0] for e in entries], [e[2] for e in entries], [e[3] for e in entries]

    def walk_errors(self) -> Iterator[tree_sitter.Node]:
        """The nodes where tree-sitter gave up (ERROR) or invented a token (MISSING), in order."""
        stack = [self.tree.root_node]
        while stack:
            node = stack.pop()
            if node.type == "ERROR" or node.is_missing:
                yield node
            elif node.has_error:
                stack.extend(reversed(node.children))


@dataclass
class Extension:
    """A `load_inline(...)`/`load(...)` call and what it compiles."""

    call: ast.Call
    bound_to: list[str]  # names (or `self.attr`) the returned module is assigned to
    functions: list[str]
    units: list[CudaUnit] = field(default_factory=list)


@dataclass
class TritonKernel:
    name: str
    node: ast.FunctionDef


@dataclass
class TritonLaunch:
    kernel: str
    call: ast.Call
    grid: ast.expr


@dataclass
class UnresolvedSource:
    """An extension source kaudit could not read statically, so could not analyse."""

    node: ast.AST
    reason: str


_LOAD_FUNCTIONS = {
    "torch.utils.cpp_extension.load_inline": ("name", "cpp_sources", "cuda_sources", "functions"),
    "torch.utils.cpp_extension.load": ("name", "sources"),
    # FastKernels' loader: `load_op("name", "kernel.cu")`, sources beside the candidate
    "fastkernels.infra.cuda_ext.load_op": ("name", "sources"),
}
_LOADER_NAMES = frozenset(name.rsplit(".", 1)[1] for name in _LOAD_FUNCTIONS)
_TRITON_DECORATORS = ("jit", "autotune", "heuristics")
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


class SourceModel:
    """Everything the static rules know about one Python kernel file."""

    def __init__(self, path: str, text: str | None, problem: InputProblem | None = None,
                 entry: EntryPoint = MODEL_NEW, policy: str = "kernelbench") -> None:
        self.path = path
        #: what the benchmark calls: `class ModelNew` unless an adapter says otherwise
        self.entry = entry
        #: the scan's policy (`kaudit.config.POLICIES`): what a submission may keep in PyTorch
        self.policy = policy
        self.text = text or ""
        self.lines = split_lines(self.text)
        self.index = LineIndex(self.text)
        self.problem = problem
        self.module: ast.Module | None = None
        self.nodes: list[ast.AST] = []
        self.bindings = Bindings()
        self.classes: dict[str, ast.ClassDef] = {}
        self.functions: dict[str, FunctionNode] = {}
        self.extensions: list[Extension] = []
        self.triton_kernels: dict[str, TritonKernel] = {}
        self.triton_launches: list[TritonLaunch] = []
        self.unresolved_sources: list[UnresolvedSource] = []
        #: texts of other files findings may point into (extension sources on disk)
        self.other_files: dict[str, str] = {}
        self._memo: dict[str, Any] = {}
        if text is not None and problem is None:
            self._parse()

    def _parse(self) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escapes in kernels are not our business
                module = ast.parse(self.text, filename=self.path)
        except SyntaxError as error:
            self.problem = InputProblem("KA001", f"file does not parse: {error.msg}",
                                        error.lineno or 1, error.offset or 1)
            return
        except (RecursionError, MemoryError, ValueError) as error:
            self.problem = InputProblem("KA001", f"file does not parse: {error.__class__.__name__}")
            return
        self.module = module
        #: every node of the module, outside-in: walk this instead of walking the tree again
        self.nodes = walk_all(module)
        load_calls: list[tuple[ast.Call, list[str]]] = []
        subscript_calls: list[ast.Call] = []
        for node in self.nodes:
            kind = node.__class__
            if kind is ast.Import or kind is ast.ImportFrom:
                self.bindings.add_import(node)  # type: ignore[arg-type]
            elif kind is ast.Assign:
                self._record_assignment(node, load_calls)  # type: ignore[arg-type]
            elif kind is ast.AnnAssign and node.value is not None \
                    and isinstance(node.target, ast.Name):
                self.bindings.add_assignment(node.target.id, "=", node.value)
            elif kind is ast.AugAssign and isinstance(node.target, ast.Name) \
                    and isinstance(node.op, ast.Add):
                self.bindings.add_assignment(node.target.id, "+=", node.value)
            elif kind is ast.Call:
                parts = dotted_parts(node.func)
                if parts and parts[-1] in _LOADER_NAMES:
                    load_calls.append((node, []))
                elif isinstance(node.func, ast.Subscript):
                    subscript_calls.append(node)
        for statement in module.body:
            if isinstance(statement, ast.ClassDef):
                self.classes[statement.name] = statement
            elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[statement.name] = statement
        self.bindings.finish()
        for name, function in self.functions.items():
            if any(self.is_triton_decorator(d) for d in function.decorator_list):
                self.triton_kernels[name] = TritonKernel(name, function)
        seen: set[int] = set()
        for call, bound_to in load_calls:
            if id(call) not in seen:  # an assigned call is listed twice; the first has its names
                seen.add(id(call))
                self._add_extension(call, bound_to)
        for call in subscript_calls:
            kernel = dotted_parts(call.func.value)  # type: ignore[attr-defined]
            if kernel and kernel[-1] in self.triton_kernels:
                self.triton_launches.append(TritonLaunch(kernel[-1], call, call.func.slice))  # type: ignore[attr-defined]

    def _record_assignment(self, node: ast.Assign, load_calls: list) -> None:
        names = []
        for target in node.targets:
            parts = dotted_parts(target)
            if parts is not None:
                names.append(".".join(parts))
                if len(parts) == 1:
                    self.bindings.add_assignment(parts[0], "=", node.value)
        if isinstance(node.value, ast.Call):
            parts = dotted_parts(node.value.func)
            if parts and parts[-1] in _LOADER_NAMES:
                load_calls.append((node.value, names))

    def release(self) -> None:
        """Drops the analyses built on this model: they refer back to it, so without this only
        the cycle collector would free them."""
        self._memo.clear()

    def memo(self, key: str, build: Callable[[], T]) -> T:
        """An analysis shared by the rules (forward paths, the kernel graph, ...), built once per
        file on first use and dropped with the model."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    # --- positions ------------------------------------------------------------------------

    def location(self, node: ast.AST) -> Location:
        if not hasattr(node, "lineno"):
            return Location(self.path)
        line, column = node.lineno, node.col_offset  # type: ignore[attr-defined]
        end_line = getattr(node, "end_lineno", None) or line
        end_column = getattr(node, "end_col_offset", None)
        end_column = column if end_column is None else end_column
        start = self.index.position(self.index.offset(line, column))
        end = self.index.position(self.index.offset(end_line, end_column))
        return Location(self.path, start[0], start[1], end[0], end[1])

    def header_location(self, node: ast.AST) -> Location:
        """A compound statement's header only (`class ModelNew(Model):`, `if x.is_cuda:`), up to its
        colon, so a region does not cover the whole body."""
        full = self.location(node)
        line = self.lines[full.line - 1] if 0 < full.line <= len(self.lines) else ""
        colon = _HEADER_END.search(line, full.column - 1)
        end = colon.start() + 2 if colon else len(line.rstrip()) + 1
        return Location(self.path, full.line, full.column, full.line, max(end, full.column + 1))

    def line_of(self, node: ast.AST) -> int:
        return getattr(node, "lineno", 1)

    def code_of(self, node: ast.AST) -> str:
        location = self.location(node)
        start = self.index.starts[location.line - 1] + location.column - 1
        end = self.index.starts[location.end_line - 1] + location.end_column - 1
        return self.text[start:end]

    def _span(self, node: ast.AST) -> tuple[int, int]:
        start = self.index.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]
        end = self.index.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
        return start, end

    # --- content queries ------------------------------------------------------------------

    @property
    def model_new(self) -> ast.ClassDef | None:
        """The entry point's class (`class ModelNew` for KernelBench); None for a function entry."""
        if not self.entry.may_be_class:
            return None
        return next((found for found in map(self._class_named, self.entry.names) if found), None)

    def _class_named(self, name: str) -> ast.ClassDef | None:
        """`class NAME`, or the class `NAME = SomeClass` binds at module level."""
        found = self.classes.get(name)
        if found is None and self.module is not None:
            for statement in self.module.body:
                if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Name) \
                        and statement.value.id in self.classes and any(
                            isinstance(t, ast.Name) and t.id == name for t in statement.targets):
                    found = self.classes[statement.value.id]
        return found

    @property
    def entry_function(self) -> FunctionNode | None:
        """The entry point's function, for benchmarks that call a function (KernelBenchX)."""
        if not self.entry.may_be_function or self.model_new is not None:
            return None
        return next((self.functions[n] for n in self.entry.names if n in self.functions), None)

    @property
    def entry_name(self) -> str:
        """How messages name the entry point's forward path: `ModelNew.forward`, `gelu`."""
        cls, function = self.model_new, self.entry_function
        if cls is not None or not self.entry.may_be_function:
            return f"`{cls.name if cls else self.entry.names[0]}.forward`"
        return f"`{function.name if function else self.entry.names[0]}`"

    def entry_member(self, name: str) -> str:
        """`ModelNew.__init__`-style names of the entry class's other methods, for messages."""
        cls = self.model_new
        return f"`{cls.name if cls else self.entry.names[0]}.{name}`"

    @property
    def cuda_units(self) -> list[CudaUnit]:
        return [unit for ext in self.extensions for unit in ext.units]

    def is_triton_decorator(self, decorator: ast.expr) -> bool:
        if isinstance(decorator, ast.Call):
            decorator = decorator.func
        name = self.bindings.resolve(decorator)
        return bool(name and name.startswith("triton.") and name.endswith(_TRITON_DECORATORS))

    # --- extensions -----------------------------------------------------------------------

    def _add_extension(self, call: ast.Call, bound_to: list[str]) -> None:
        params = _LOAD_FUNCTIONS.get(self.bindings.resolve(call.func) or "")
        if params is None:
            return
        args = _bind_arguments(call, params)
        functions = [text.text for text in self._texts(args["functions"]) or []] \
            if "functions" in args else []
        ext = Extension(call, bound_to, functions)
        for param, kind in (("cpp_sources", "cpp"), ("cuda_sources", "cuda")):
            if param in args:
                self._add_embedded_unit(ext, kind, args[param])
        if "sources" in args:
            self._add_source_files(ext, args["sources"])
        self.extensions.append(ext)

    def _add_embedded_unit(self, ext: Extension, kind: str, expr: ast.expr) -> None:
        pieces = self._texts(expr)
        if pieces is None:
            self.unresolved_sources.append(UnresolvedSource(
                expr, f"`{kind}_sources` is built at run time ({self.code_of(expr)[:60]}); "
                "its C++/CUDA code was not analysed"))
            return
        text = MappedText.join(pieces)
        ext.units.append(CudaUnit(kind, text.text, cuda_parser().parse(text.text.encode("utf-8")),
                                  self.path, self.index, text.offsets, expr))

    def _add_source_files(self, ext: Extension, expr: ast.expr) -> None:
        elements = expr.elts if isinstance(expr, (ast.List, ast.Tuple)) else [expr]
        base = os.path.dirname(self.path)
        for element in elements:
            parts = [n.value for n in ast.walk(element)
                     if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            if not parts or not parts[-1].endswith(_EXTENSION_SUFFIXES):
                self.unresolved_sources.append(UnresolvedSource(
                    element, f"extension source `{self.code_of(element)[:60]}` is computed at run "
                    "time; not analysed"))
                continue
            # `os.path.join(HERE, "kernels", "k.cu")`, `HERE + "/k.cu"`: the literal parts, taken
            # relative to the kernel's folder.
            display = os.path.normpath(os.path.join(base, *(p.lstrip("/") for p in parts)))
            text = _read_regular_file(Path(display))
            if text is None:
                self.unresolved_sources.append(UnresolvedSource(
                    element, f"extension source {display} is missing or unreadable; not analysed"))
                continue
            kind = "cuda" if display.endswith((".cu", ".cuh")) else "cpp"
            self.other_files[display] = text
            ext.units.append(CudaUnit(kind, text, cuda_parser().parse(text.encode("utf-8")),
                                      display, LineIndex(text), None, element))

    def _texts(self, expr: ast.expr, depth: int = 0) -> list[MappedText] | None:
        """The string(s) an expression evaluates to, if that can be known without running it."""
        if isinstance(expr, (ast.List, ast.Tuple)):
            out: list[MappedText] = []
            for element in expr.elts:
                texts = None if isinstance(element, ast.Starred) else self._texts(element, depth + 1)
                if texts is None:
                    return None
                out.extend(texts)
            return out
        text = self._text(expr, depth)
        return None if text is None else [text]

    def _text(self, expr: ast.expr, depth: int) -> MappedText | None:
        if depth > 20:
            return None
        if isinstance(expr, (ast.Constant, ast.JoinedStr)):
            if isinstance(expr, ast.Constant) and not isinstance(expr.value, str):
                return None
            start, end = self._span(expr)
            return string_literal_text(self.text, start, end,
                                       lambda hole: self._hole_text(hole, depth))
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left, right = self._text(expr.left, depth + 1), self._text(expr.right, depth + 1)
            return None if left is None or right is None else left + right
        if isinstance(expr, ast.Name):
            return self._bound_text(expr.id, depth)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
            method = expr.func.attr
            if method in ("format", "strip", "lstrip", "rstrip", "replace"):
                # The receiver's text is the code; formatting only fills small holes.
                return self._text(expr.func.value, depth + 1)
            if method == "join" and expr.args:
                sep = self._text(expr.func.value, depth + 1)
                parts = self._texts(expr.args[0], depth + 1)
                if sep is not None and parts is not None:
                    return MappedText.join(parts, sep.text)
        if isinstance(expr, ast.Call) and expr.args and \
                dotted_parts(expr.func) in (["textwrap", "dedent"], ["dedent"]):
            return self._text(expr.args[0], depth + 1)
        return None

    def _bound_text(self, name: str, depth: int) -> MappedText | None:
        assigned = self.bindings.assignments.get(name)
        if not assigned:
            return None
        last_plain = max((i for i, (op, _) in enumerate(assigned) if op == "="), default=None)
        if last_plain is None:
            return None
        text = MappedText()
        for _op, value in assigned[last_plain:]:
            piece = self._text(value, depth + 1)
            if piece is None:
                return None
            text = text + piece
        return text

    def _hole_text(self, expression: str, depth: int) -> str:
        """What stands in for an f-string hole: the constant a name is bound to, else the
        expression itself, so the C++ around it still parses (`{BLOCK}` -> `256` or `BLOCK`)."""
        assigned = self.bindings.assignments.get(expression, [])
        if len(assigned) == 1 and isinstance(assigned[0][1], ast.Constant):
            value = assigned[0][1].value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return repr(value)
        if expression.isidentifier() and depth < 20:
            text = self._bound_text(expression, depth + 1)
            if text is not None:
                return text.text
        return expression


def _read_regular_file(file: Path) -> str | None:
    """Text of a regular, small, UTF-8 file; never opens devices or FIFOs a kernel may name."""
    try:
        if not file.is_file() or file.stat().st_size > MAX_FILE_BYTES:
            return None
        text, _problem = decode_source(file.read_bytes())
    except OSError:
        return None
    return text


def read_source(file: Path) -> tuple[str | None, InputProblem | None]:
    """A file's text, or why it cannot be analysed (too large, unreadable, binary, not UTF-8)."""
    try:
        if file.is_symlink() and not file.exists():
            return None, InputProblem("KA003", f"broken symlink (-> {os.readlink(file)})")
        size = file.stat().st_size
        if size > MAX_FILE_BYTES:
            return None, InputProblem(
                "KA003", f"file is {size / 1e6:.1f} MB, over kaudit's 5 MB limit; not analysed")
        data = file.read_bytes()
    except OSError as exc:
        return None, InputProblem("KA003", f"cannot read file: {exc.strerror or exc}")
    return decode_source(data)


def decode_source(data: bytes) -> tuple[str | None, InputProblem | None]:
    nul = data.find(b"\0")
    if nul >= 0:
        return None, InputProblem("KA003", "binary file (NUL byte); not analysed",
                                  data.count(b"\n", 0, nul) + 1)
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        return None, InputProblem(
            "KA003", f"file is not UTF-8 (byte 0x{data[exc.start]:02x}); not analysed", line, column)


def _bind_arguments(call: ast.Call, params: tuple[str, ...]) -> dict[str, ast.expr]:
    bound: dict[str, ast.expr] = {}
    for position, arg in enumerate(call.args):
        if not isinstance(arg, ast.Starred) and position < len(params):
            bound[params[position]] = arg
    for keyword in call.keywords:
        if keyword.arg is not None:
            bound[keyword.arg] = keyword.value
    return bound
