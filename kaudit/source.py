"""The source model: one parse per file, shared by every rule.

A `SourceModel` holds the libcst module (with positions), the import/assignment bindings, the
C++/CUDA sources handed to `load_inline`/`load` parsed by tree-sitter with every node mapped back to
the file a user opens, and the Triton kernels with their launch sites. Rules read it; none re-parses.
"""

from __future__ import annotations

import ast
import bisect
import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
import tree_sitter
import tree_sitter_cuda
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from kaudit.findings import Location
from kaudit.python_scope import (
    Bindings,
    MappedText,
    decode_literal_body,
    dotted_parts,
    split_string_literal,
)

MAX_FILE_BYTES = 5 * 1024 * 1024
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_EXTENSION_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp")


def split_lines(text: str) -> list[str]:
    """Lines as Python and libcst count them (\\r\\n, \\r or \\n; not form feeds)."""
    return _LINE_BREAK.split(text)


@functools.cache
def _cuda_parser() -> tree_sitter.Parser:
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_cuda.language()))


class LineIndex:
    """Absolute character offsets <-> 1-based lines and columns of one text."""

    def __init__(self, text: str) -> None:
        self.starts = [0] + [m.end() for m in _LINE_BREAK.finditer(text)]

    def position(self, offset: int) -> tuple[int, int]:
        row = bisect.bisect_right(self.starts, offset) - 1
        return row + 1, offset - self.starts[row] + 1

    def offset(self, line: int, column0: int) -> int:
        return self.starts[min(line, len(self.starts)) - 1] + column0


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
    origin: cst.CSTNode  # the Python expression the source came from

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
        return self.text[self._char(node.start_byte) : self._char(node.end_byte)]

    def walk(self, types: frozenset[str] | None = None):
        """Every node of the unit (or those of the given types), depth first."""
        stack = [self.tree.root_node]
        while stack:
            node = stack.pop()
            if types is None or node.type in types:
                yield node
            stack.extend(reversed(node.children))

    def walk_errors(self):
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

    call: cst.Call
    bound_to: list[str]  # names (or `self.attr`) the returned module is assigned to
    functions: list[str]
    units: list[CudaUnit] = field(default_factory=list)


@dataclass
class TritonKernel:
    name: str
    node: cst.FunctionDef


@dataclass
class TritonLaunch:
    kernel: str
    call: cst.Call
    grid: cst.BaseExpression


@dataclass
class UnresolvedSource:
    """An extension source kaudit could not read statically, so could not analyse."""

    node: cst.CSTNode
    reason: str


_LOAD_FUNCTIONS = {
    "torch.utils.cpp_extension.load_inline": ("name", "cpp_sources", "cuda_sources", "functions"),
    "torch.utils.cpp_extension.load": ("name", "sources"),
}
_TRITON_DECORATORS = ("jit", "autotune", "heuristics")


class SourceModel:
    """Everything the static rules know about one Python kernel file."""

    def __init__(self, path: str, text: str | None, problem: InputProblem | None = None) -> None:
        self.path = path
        self.text = text or ""
        self.lines = split_lines(self.text)
        self.index = LineIndex(self.text)
        self.problem = problem
        self.module: cst.Module | None = None
        self.bindings = Bindings()
        self.classes: dict[str, cst.ClassDef] = {}
        self.functions: dict[str, cst.FunctionDef] = {}
        self.extensions: list[Extension] = []
        self.triton_kernels: dict[str, TritonKernel] = {}
        self.triton_launches: list[TritonLaunch] = []
        self.unresolved_sources: list[UnresolvedSource] = []
        #: texts of other files findings may point into (extension sources on disk)
        self.other_files: dict[str, str] = {}
        self._positions: dict[cst.CSTNode, CodeRange] = {}
        if text is not None and problem is None:
            self._parse()

    # --- construction ---------------------------------------------------------------------

    def _parse(self) -> None:
        try:
            module = cst.parse_module(self.text)
        except (cst.ParserSyntaxError, RecursionError, MemoryError, ValueError) as exc:
            self.problem = _syntax_problem(self.text, exc)
            return
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        self._positions = wrapper.resolve(PositionProvider)
        self.module = module
        indexer = _Indexer(self)
        module.visit(indexer)
        self.bindings.finish()
        for name, function in self.functions.items():
            if any(self.is_triton_decorator(d) for d in function.decorators):
                self.triton_kernels[name] = TritonKernel(name, function)
        for call, bound_to in indexer.load_calls:
            self._add_extension(call, bound_to)
        for call in indexer.subscript_calls:
            kernel = self._launched_kernel(call)
            if kernel is not None:
                self.triton_launches.append(TritonLaunch(kernel, call, call.func.slice[0].slice.value))

    # --- positions ------------------------------------------------------------------------

    def location(self, node: cst.CSTNode) -> Location:
        code_range = self._positions.get(node)
        if code_range is None:
            return Location(self.path)
        start, end = code_range.start, code_range.end
        return Location(self.path, start.line, start.column + 1, end.line, end.column + 1)

    def line_of(self, node: cst.CSTNode) -> int:
        return self.location(node).line

    def code_of(self, node: cst.CSTNode) -> str:
        assert self.module is not None
        return self.module.code_for_node(node)

    # --- content queries ------------------------------------------------------------------

    @property
    def model_new(self) -> cst.ClassDef | None:
        return self.classes.get("ModelNew")

    @property
    def cuda_units(self) -> list[CudaUnit]:
        return [unit for ext in self.extensions for unit in ext.units]

    def is_triton_decorator(self, decorator: cst.Decorator) -> bool:
        expr = decorator.decorator
        if isinstance(expr, cst.Call):
            expr = expr.func
        name = self.bindings.resolve(expr)
        return bool(name and name.startswith("triton.") and name.endswith(_TRITON_DECORATORS))

    # --- extensions -----------------------------------------------------------------------

    def _add_extension(self, call: cst.Call, bound_to: list[str]) -> None:
        resolved = self.bindings.resolve(call.func) or ""
        params = _LOAD_FUNCTIONS.get(resolved)
        if params is None:
            return
        args = _bind_arguments(call, params)
        functions = []
        if "functions" in args:
            for text in self._texts(args["functions"]) or []:
                functions.append(text.text)
        ext = Extension(call, bound_to, functions)
        for param, kind in (("cpp_sources", "cpp"), ("cuda_sources", "cuda")):
            if param in args:
                self._add_embedded_unit(ext, kind, args[param])
        if "sources" in args:
            self._add_source_files(ext, args["sources"])
        self.extensions.append(ext)

    def _add_embedded_unit(self, ext: Extension, kind: str, expr: cst.BaseExpression) -> None:
        pieces = self._texts(expr)
        if pieces is None:
            self.unresolved_sources.append(UnresolvedSource(
                expr, f"`{kind}_sources` is built at run time ({self.code_of(expr)[:60]}); "
                "its C++/CUDA code was not analysed"))
            return
        text = MappedText.join(pieces)
        ext.units.append(CudaUnit(kind, text.text, _cuda_parser().parse(text.text.encode("utf-8")),
                                  self.path, self.index, text.offsets, expr))

    def _add_source_files(self, ext: Extension, expr: cst.BaseExpression) -> None:
        elements = expr.elements if isinstance(expr, (cst.List, cst.Tuple)) else [expr]
        base = os.path.dirname(self.path)
        for element in elements:
            value = getattr(element, "value", element)
            parts = [t.text for t in self._literal_strings(value)]
            if not parts or not parts[-1].endswith(_EXTENSION_SUFFIXES):
                self.unresolved_sources.append(UnresolvedSource(
                    value, f"extension source `{self.code_of(value)[:60]}` is computed at run time; "
                    "not analysed"))
                continue
            # `os.path.join(HERE, "kernels", "k.cu")`, `HERE + "/k.cu"`: the literal parts, taken
            # relative to the kernel's folder.
            display = os.path.normpath(os.path.join(base, *(p.lstrip("/") for p in parts)))
            text = _read_regular_file(Path(display))
            if text is None:
                self.unresolved_sources.append(UnresolvedSource(
                    value, f"extension source {display} is missing or unreadable; not analysed"))
                continue
            data = text.encode("utf-8")
            kind = "cuda" if display.endswith((".cu", ".cuh")) else "cpp"
            self.other_files[display] = text
            ext.units.append(CudaUnit(kind, text, _cuda_parser().parse(data), display,
                                      LineIndex(text), None, value))

    def _literal_strings(self, expr: cst.BaseExpression) -> list[MappedText]:
        found: list[MappedText] = []

        class Collect(cst.CSTVisitor):
            def visit_SimpleString(inner, node: cst.SimpleString) -> None:  # noqa: N805
                text = self._simple_string(node)
                if text is not None:
                    found.append(text)

        expr.visit(Collect())
        return found

    def _texts(self, expr: cst.BaseExpression, depth: int = 0) -> list[MappedText] | None:
        """The string(s) an expression evaluates to, if that can be known without running it."""
        if depth > 20:
            return None
        if isinstance(expr, (cst.List, cst.Tuple)):
            out: list[MappedText] = []
            for element in expr.elements:
                if isinstance(element, cst.StarredElement):
                    return None
                texts = self._texts(element.value, depth + 1)
                if texts is None:
                    return None
                out.extend(texts)
            return out
        text = self._text(expr, depth)
        return None if text is None else [text]

    def _text(self, expr: cst.BaseExpression, depth: int) -> MappedText | None:
        if depth > 20:
            return None
        if isinstance(expr, cst.SimpleString):
            return self._simple_string(expr)
        if isinstance(expr, cst.ConcatenatedString):
            left, right = self._text(expr.left, depth + 1), self._text(expr.right, depth + 1)
            return None if left is None or right is None else left + right
        if isinstance(expr, cst.FormattedString):
            return self._formatted_string(expr, depth)
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
            left, right = self._text(expr.left, depth + 1), self._text(expr.right, depth + 1)
            return None if left is None or right is None else left + right
        if isinstance(expr, cst.Name):
            return self._bound_text(expr.value, depth)
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            method = expr.func.attr.value
            if method in ("format", "strip", "lstrip", "rstrip", "replace"):
                # The receiver's text is the code; formatting only fills small holes.
                return self._text(expr.func.value, depth + 1)
            if method == "join" and expr.args:
                sep = self._text(expr.func.value, depth + 1)
                parts = self._texts(expr.args[0].value, depth + 1)
                if sep is not None and parts is not None:
                    return MappedText.join(parts, sep.text)
        if isinstance(expr, cst.Call) and expr.args and dotted_parts(expr.func) in (
                ["textwrap", "dedent"], ["dedent"]):
            return self._text(expr.args[0].value, depth + 1)
        return None

    def _bound_text(self, name: str, depth: int) -> MappedText | None:
        assigned = self.bindings.assignments.get(name)
        if not assigned:
            return None
        last_plain = max((i for i, (op, _) in enumerate(assigned) if op == "="), default=None)
        if last_plain is None:
            return None
        text: MappedText | None = MappedText()
        for _op, value in assigned[last_plain:]:
            piece = self._text(value, depth + 1)
            if piece is None:
                return None
            text = text + piece
        return text

    def _simple_string(self, node: cst.SimpleString) -> MappedText | None:
        parts = split_string_literal(node.value)
        if parts is None:
            return None
        prefix, body, body_start = parts
        start = self._node_offset(node) + body_start
        return decode_literal_body(body, start, raw="r" in prefix)

    def _formatted_string(self, node: cst.FormattedString, depth: int) -> MappedText | None:
        raw = "r" in node.prefix.lower()
        out = MappedText()
        for part in node.parts:
            start = self._node_offset(part)
            if isinstance(part, cst.FormattedStringText):
                out = out + decode_literal_body(part.value, start, raw, fstring=True)
                continue
            # A hole: use the constant it names when known, else its source text, so the C++
            # around it still parses (`{BLOCK}` -> `256` or `BLOCK`).
            value = self._constant_text(part.expression, depth)
            out = out + MappedText(value, [start] * len(value))
        return out

    def _constant_text(self, expr: cst.BaseExpression, depth: int) -> str:
        if isinstance(expr, cst.Name):
            assigned = self.bindings.assignments.get(expr.value, [])
            if len(assigned) == 1 and isinstance(assigned[0][1], (cst.Integer, cst.Float)):
                return assigned[0][1].value
            text = self._bound_text(expr.value, depth + 1)
            if text is not None:
                return text.text
        return self.code_of(expr)

    def _node_offset(self, node: cst.CSTNode) -> int:
        code_range = self._positions[node]
        return self.index.offset(code_range.start.line, code_range.start.column)

    def _launched_kernel(self, call: cst.Call) -> str | None:
        subscript = call.func
        assert isinstance(subscript, cst.Subscript)
        parts = dotted_parts(subscript.value)
        if not parts or parts[-1] not in self.triton_kernels or len(subscript.slice) != 1:
            return None
        if not isinstance(subscript.slice[0].slice, cst.Index):
            return None
        return parts[-1]


def _syntax_problem(text: str, exc: Exception) -> InputProblem:
    """Where and why parsing failed, in CPython's words when it agrees the file is invalid (its
    messages and positions are the ones users know); libcst's otherwise."""
    try:
        ast.parse(text)
    except SyntaxError as error:
        return InputProblem("KA001", f"file does not parse: {error.msg}", error.lineno or 1,
                            error.offset or 1)
    except (RecursionError, MemoryError, ValueError) as error:
        return InputProblem("KA001", f"file does not parse: {error.__class__.__name__}")
    if isinstance(exc, cst.ParserSyntaxError):
        return InputProblem("KA001", f"kaudit's parser (libcst) cannot read this: {exc.message}",
                            exc.raw_line, exc.raw_column + 1)
    return InputProblem("KA001", f"file does not parse: {exc.__class__.__name__}")


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


def _read_regular_file(file: Path) -> str | None:
    """Text of a regular, small, UTF-8 file; never opens devices or FIFOs a kernel may name."""
    try:
        if not file.is_file() or file.stat().st_size > MAX_FILE_BYTES:
            return None
        text, problem = decode_source(file.read_bytes())
    except OSError:
        return None
    return text


def decode_source(data: bytes) -> tuple[str | None, InputProblem | None]:
    problem = _binary_problem(data)
    return (None, problem) if problem else (data.decode("utf-8-sig"), None)


def _binary_problem(data: bytes) -> InputProblem | None:
    nul = data.find(b"\0")
    if nul >= 0:
        return InputProblem("KA003", "binary file (NUL byte); not analysed",
                            data.count(b"\n", 0, nul) + 1)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        return InputProblem(
            "KA003", f"file is not UTF-8 (byte 0x{data[exc.start]:02x}); not analysed", line, column)
    return None


def _bind_arguments(call: cst.Call, params: tuple[str, ...]) -> dict[str, cst.BaseExpression]:
    bound: dict[str, cst.BaseExpression] = {}
    for position, arg in enumerate(call.args):
        if arg.star:
            continue
        if arg.keyword is not None:
            bound[arg.keyword.value] = arg.value
        elif position < len(params):
            bound[params[position]] = arg.value
    return bound


class _Indexer(cst.CSTVisitor):
    """One walk over the module that records what the model needs."""

    def __init__(self, model: SourceModel) -> None:
        self.model = model
        self.scope: list[cst.CSTNode] = []
        self.load_calls: list[tuple[cst.Call, list[str]]] = []
        self.subscript_calls: list[cst.Call] = []
        self._assign_targets: dict[cst.Call, list[str]] = {}

    def visit_Import(self, node: cst.Import) -> None:
        self.model.bindings.add_import(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.model.bindings.add_import(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if not self.scope:
            self.model.classes[node.name.value] = node
        self.scope.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.scope.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if not self.scope:
            self.model.functions[node.name.value] = node
        self.scope.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scope.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        names = []
        for target in node.targets:
            parts = dotted_parts(target.target)
            if parts is not None:
                names.append(".".join(parts))
                if len(parts) == 1:
                    self.model.bindings.add_assignment(parts[0], "=", node.value)
        if isinstance(node.value, cst.Call):
            self._assign_targets[node.value] = names

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None and isinstance(node.target, cst.Name):
            self.model.bindings.add_assignment(node.target.value, "=", node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Name) and isinstance(node.operator, cst.AddAssign):
            self.model.bindings.add_assignment(node.target.value, "+=", node.value)

    def visit_Call(self, node: cst.Call) -> None:
        parts = dotted_parts(node.func)
        if parts and parts[-1] in ("load_inline", "load"):
            self.load_calls.append((node, self._assign_targets.get(node, [])))
        elif isinstance(node.func, cst.Subscript):
            self.subscript_calls.append(node)
