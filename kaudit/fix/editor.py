"""The edits a rule's `fix` asks for, computed from the parse of one file.

Python expressions are rewritten with libcst, so the operands keep their formatting and comments;
imports are added with libcst's own import placement; C++/CUDA edits are made in the code that
tree-sitter parsed and mapped back into the Python string literal that holds it, escaped for that
literal (raw or not, single or triple quoted, f-string), then checked by parsing the edited file
again: the extension source must come out exactly as intended. This module is the only one that
imports libcst, and only `kaudit fix` and the fix-carrying reports (JSON, SARIF) import it.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable

import libcst as cst
import tree_sitter
from libcst import metadata

from kaudit.findings import Location
from kaudit.fix.edits import Edit, NoFix, apply_edits
from kaudit.source import CudaUnit, SourceModel

_EMPTY_MODULE = cst.Module(body=[])
_BODY_FIELDS = ("body", "orelse", "finalbody")
_KEEP_PARENS = (cst.Tuple, cst.GeneratorExp, cst.NamedExpr, cst.Yield)


class Editor:
    """Turns what a rule wants changed (an `ast` node, a tree-sitter node of an extension source)
    into `Edit`s of the file's text. Raises `NoFix` with the reason when it cannot."""

    def __init__(self, model: SourceModel) -> None:
        self.model = model
        self.text = model.text

    # --- positions --------------------------------------------------------------------------

    def span(self, node: ast.AST) -> tuple[int, int]:
        """Character offsets of an `ast` node (parentheses around it excluded, as `ast` has it)."""
        index = self.model.index
        return (index.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                index.offset(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def location_span(self, location: Location) -> tuple[int, int]:
        """Character offsets of a finding's location (1-based character columns)."""
        starts = self.model.index.starts
        return (starts[location.line - 1] + location.column - 1,
                starts[location.end_line - 1] + location.end_column - 1)  # type: ignore[operator]

    def line_bounds(self, offset: int) -> tuple[int, int, int]:
        """Start of the physical line holding `offset`, its end (before the line break) and the
        start of the next line."""
        start = self.text.rfind("\n", 0, offset) + 1
        end = self.text.find("\n", offset)
        if end < 0:
            return start, len(self.text), len(self.text)
        return start, end - 1 if end > start and self.text[end - 1] == "\r" else end, end + 1

    def node_at(self, location: Location, kinds: type | tuple[type, ...]) -> ast.AST | None:
        """The `ast` node of the given kind(s) a finding points at."""
        return next((node for node in self.model.nodes if isinstance(node, kinds)
                     and hasattr(node, "lineno") and self.model.location(node) == location), None)

    # --- Python -----------------------------------------------------------------------------

    def replace_expression(self, node: ast.expr,
                           rewrite: Callable[[cst.BaseExpression], cst.BaseExpression]) -> Edit:
        """Replace an expression by what `rewrite` makes of its libcst tree."""
        start, end = self.span(node)
        # Parenthesised, the expression parses even when it spans lines.
        wrapped = cst.parse_expression("(" + self.text[start:end] + ")")
        inner = wrapped.with_changes(lpar=wrapped.lpar[1:], rpar=wrapped.rpar[:-1])
        return Edit(start, end, _EMPTY_MODULE.code_for_node(rewrite(inner)))

    def remove_statement(self, statement: ast.stmt) -> Edit:
        """Delete a statement: its whole line when it stands alone there (with its trailing
        comment), else it and its `;`; `pass` when it is the only statement of its block."""
        start, end = self.span(statement)
        line_start, _, _ = self.line_bounds(start)
        _, line_end, next_line = self.line_bounds(end)
        before, after = self.text[line_start:start], self.text[end:line_end]
        alone = not before.strip() and (not after.strip() or after.lstrip().startswith("#"))
        if len(self._body_holding(statement)) == 1:
            return Edit(start, line_end if alone else end, "pass")
        if alone:
            return Edit(line_start, next_line)
        following = re.match(r"[ \t]*;[ \t]*", after)
        if following and after[following.end():].strip():
            return Edit(start, end + following.end())
        preceding = re.search(r";[ \t]*$", before)
        if preceding:
            return Edit(line_start + preceding.start(), end)
        raise NoFix("the statement shares its line with other code")

    def _body_holding(self, statement: ast.stmt) -> list[ast.stmt]:
        for node in self.model.nodes:
            for name in _BODY_FIELDS:
                body = getattr(node, name, None)
                if isinstance(body, list) and any(s is statement for s in body):
                    return body
            for handler in getattr(node, "handlers", ()):
                if any(s is statement for s in handler.body):
                    return handler.body
        raise NoFix("the statement's block was not found")

    def name_for(self, qualified: str) -> tuple[str, tuple[Edit, ...]]:
        """How this file can spell `qualified` (`triton.cdiv`): a name already bound to it, the
        module under the name it is imported as, or a new `import module`."""
        module, _, attribute = qualified.rpartition(".")
        bound = self.model.bindings.qualified
        direct = sorted(name for name, target in bound.items() if target == qualified)
        if direct:
            return direct[0], ()
        aliases = sorted(name for name, target in bound.items() if target == module)
        if module in aliases:
            return qualified, ()
        if aliases:
            return f"{aliases[0]}.{attribute}", ()
        root = module.split(".")[0]
        if root in bound or root in self.model.bindings.assignments \
                or root in self.model.functions or root in self.model.classes:
            raise NoFix(f"`{root}` names something else in this file")
        return qualified, (self._add_import(module),)

    def _add_import(self, module: str) -> Edit:
        from libcst.codemod import CodemodContext  # a second the other fixes need not wait for
        from libcst.codemod.visitors import AddImportsVisitor

        context = CodemodContext()
        AddImportsVisitor.add_needed_import(context, module)
        changed = AddImportsVisitor(context).transform_module(self._cst_module()).code
        return line_edit(self.text, changed)

    @functools.cached_property
    def _cst_positions(self) -> list[tuple[int, int, cst.CSTNode]]:
        """Every string literal of the file with its character span, innermost last."""
        wrapper = metadata.MetadataWrapper(self._cst_module(), unsafe_skip_copy=True)
        positions = wrapper.resolve(metadata.PositionProvider)
        starts = self.model.index.starts
        spans = []
        for node, where in positions.items():
            if isinstance(node, (cst.SimpleString, cst.FormattedString, cst.FormattedStringText)):
                spans.append((starts[where.start.line - 1] + where.start.column,
                              starts[where.end.line - 1] + where.end.column, node))
        spans.sort(key=lambda span: (span[0], -span[1]))
        return spans

    def _cst_module(self) -> cst.Module:
        try:
            return cst.parse_module(self.text)
        except cst.ParserSyntaxError as exc:
            raise NoFix(f"libcst cannot parse the file: {exc.message}") from exc

    # --- C++/CUDA inside Python strings -----------------------------------------------------

    def cpp_span(self, unit: CudaUnit, node: tree_sitter.Node) -> tuple[int, int]:
        """Character offsets of a tree-sitter node in its unit's text."""
        return char_offset(unit, node.start_byte), char_offset(unit, node.end_byte)

    def cpp_edit(self, unit: CudaUnit, start: int, end: int, replacement: str) -> Edit:
        """Replace `unit.text[start:end]` by `replacement`, as an edit of the Python literal the
        unit's code comes from; checked by parsing the edited file again."""
        offsets = unit.offsets
        if offsets is None or unit.path != self.model.path:
            raise NoFix(f"the code is in {unit.path}, not in the scanned file")
        if not 0 <= start <= end < len(offsets) \
                or any(offsets[i + 1] <= offsets[i] for i in range(start, end)):
            raise NoFix("the C++ text to change does not come from one string literal")
        file_start = offsets[start]
        file_end = offsets[end] if end > start else file_start
        edit = Edit(file_start, file_end, self._escaped(replacement, file_start, file_end))
        changed = SourceModel(self.model.path, apply_edits(self.text, [edit]), entry=self.model.entry,
                              policy=self.model.policy)
        position = next(i for i, u in enumerate(self.model.cuda_units) if u is unit)
        units = changed.cuda_units
        expected = unit.text[:start] + replacement + unit.text[end:]
        if len(units) != len(self.model.cuda_units) or units[position].text != expected:
            raise NoFix("the string literal holding the C++ code could not be rewritten exactly")
        return edit

    def _escaped(self, text: str, start: int, end: int) -> str:
        """`text` as it must be written inside the literal that holds offsets start..end."""
        holders = [(a, b, node) for a, b, node in self._cst_positions if a <= start and end <= b]
        if not holders:
            raise NoFix("no string literal holds the C++ code")
        _, _, node = holders[-1]
        if isinstance(node, cst.FormattedStringText):
            outer = next(n for a, b, n in reversed(holders) if isinstance(n, cst.FormattedString))
            prefix, quote = outer.prefix.lower(), outer.quote
            text = text.replace("{", "{{").replace("}", "}}")
        elif isinstance(node, cst.SimpleString):
            prefix, quote = node.prefix.lower(), node.quote
        else:
            raise NoFix("the C++ code to change sits in an f-string's expression")
        if "r" in prefix:
            if "\\" in text or quote[0] in text or (len(quote) == 1 and "\n" in text):
                raise NoFix("the raw string cannot hold the new text")
            return text
        text = text.replace("\\", "\\\\").replace(quote[0], "\\" + quote[0])
        return text.replace("\n", "\\n") if len(quote) == 1 else text


def char_offset(unit: CudaUnit, byte: int) -> int:
    """A tree-sitter byte offset in the unit's UTF-8 text as a character offset."""
    if unit.text.isascii():
        return byte
    return len(unit.text.encode("utf-8")[:byte].decode("utf-8", "ignore"))


def strip_parens(expression: cst.BaseExpression) -> cst.BaseExpression:
    """`(n + 1)` -> `n + 1` where the parentheses only grouped (an argument needs none)."""
    lpar, rpar = getattr(expression, "lpar", ()), getattr(expression, "rpar", ())
    plain = all(isinstance(p.whitespace_after, cst.SimpleWhitespace) for p in lpar) and \
        all(isinstance(p.whitespace_before, cst.SimpleWhitespace) for p in rpar)
    if not lpar or isinstance(expression, _KEEP_PARENS) or not plain:
        return expression
    return expression.with_changes(lpar=[], rpar=[])


def call(function: str, *arguments: cst.BaseExpression) -> cst.Call:
    """`function(a, b)` with the arguments' own formatting."""
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    args = [cst.Arg(strip_parens(a), comma=comma) for a in arguments[:-1]]
    args.append(cst.Arg(strip_parens(arguments[-1])))
    return cst.Call(func=cst.parse_expression(function), args=args)


def line_edit(old: str, new: str) -> Edit:
    """The one edit that turns `old` into `new`, on whole lines (for readable diffs and SARIF)."""
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    head = 0
    while head < min(len(old_lines), len(new_lines)) and old_lines[head] == new_lines[head]:
        head += 1
    tail = 0
    while tail < min(len(old_lines), len(new_lines)) - head \
            and old_lines[-1 - tail] == new_lines[-1 - tail]:
        tail += 1
    start = sum(len(line) for line in old_lines[:head])
    end = len(old) - sum(len(line) for line in old_lines[len(old_lines) - tail:])
    return Edit(start, end, "".join(new_lines[head:len(new_lines) - tail]))
