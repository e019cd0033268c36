"""Name resolution over one Python module: import aliases, and the strings names are bound to.

Kernels hide what they call behind aliases (`import torch.nn.functional as fn`, `from torch import
matmul as mm`, `mm = torch.matmul`) and build their CUDA sources from pieces (`src = HEADER +
KERNEL`, f-strings, implicit concatenation). This module undoes both without running anything, and
keeps, for every character of a rebuilt string, the offset in the file it came from.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field


def dotted_parts(expr: ast.AST) -> list[str] | None:
    """`a.b.c` -> ["a", "b", "c"]; None for anything that is not a plain name chain."""
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    parts.reverse()
    return parts


@dataclass
class Bindings:
    """What names refer to. Scope-insensitive on purpose: kernels are small modules, and a name
    bound anywhere to `torch.matmul` is a strong enough signal."""

    #: local name -> fully qualified name, from imports and `alias = dotted.name` assignments
    qualified: dict[str, str] = field(default_factory=dict)
    #: name -> the expressions assigned to it, in source order ("=" or "+=")
    assignments: dict[str, list[tuple[str, ast.expr]]] = field(default_factory=dict)

    def add_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.qualified[alias.asname] = alias.name
                else:  # `import torch.nn` binds `torch`
                    root = alias.name.split(".")[0]
                    self.qualified[root] = root
            return
        if node.level or not node.module:
            return
        for alias in node.names:
            if alias.name != "*":
                self.qualified[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def add_assignment(self, name: str, op: str, value: ast.expr) -> None:
        self.assignments.setdefault(name, []).append((op, value))

    def finish(self) -> None:
        """Follow `alias = torch.matmul` style assignments once all imports are known."""
        for name, assigned in self.assignments.items():
            if name in self.qualified or len(assigned) != 1 or assigned[0][0] != "=":
                continue
            target = self.resolve(assigned[0][1])
            if target is not None and target != name:
                self.qualified[name] = target

    def resolve(self, expr: ast.AST) -> str | None:
        """The fully qualified name an expression such as `F.relu` or `T.nn.Linear` refers to."""
        parts = dotted_parts(expr)
        if not parts or parts[0] not in self.qualified:
            return None
        return ".".join([self.qualified[parts[0]], *parts[1:]])


# --- strings with a map back to the file -------------------------------------------------------

_ESCAPE = re.compile(
    r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|N\{[^}]*\}|[0-7]{1,3}|\r\n|.)", re.S)
_QUOTES = ('"""', "'''", '"', "'")


@dataclass
class MappedText:
    """Text assembled from source literals; `offsets[i]` is where `text[i]` sits in the file."""

    text: str = ""
    offsets: list[int] = field(default_factory=list)

    def __add__(self, other: MappedText) -> MappedText:
        return MappedText(self.text + other.text, self.offsets + other.offsets)

    @classmethod
    def join(cls, pieces: list[MappedText], sep: str = "\n") -> MappedText:
        out = MappedText()
        for i, piece in enumerate(pieces):
            if i:
                anchor = out.offsets[-1] if out.offsets else 0
                out = out + MappedText(sep, [anchor] * len(sep))
            out = out + piece
        return out


def decode_literal_body(body: str, start: int, raw: bool) -> MappedText:
    """Evaluate a string literal's body, keeping for each character the offset it came from."""
    if raw or "\\" not in body:
        return MappedText(body, list(range(start, start + len(body))))
    chars: list[str] = []
    offsets: list[int] = []
    i = 0
    while i < len(body):
        escape = body.find("\\", i)
        if escape != i:  # the plain run up to the next backslash, in one piece
            end = len(body) if escape < 0 else escape
            chars.append(body[i:end])
            offsets.extend(range(start + i, start + end))
            i = end
            continue
        match = _ESCAPE.match(body, i)
        if match is None:
            chars.append(body[i])
            offsets.append(start + i)
            i += 1
            continue
        value = _escape_value(match.group(0))
        chars.append(value)
        offsets.extend([start + i] * len(value))
        i = match.end()
    return MappedText("".join(chars), offsets)


@functools.lru_cache(maxsize=256)
def _escape_value(escape: str) -> str:
    """What an escape sequence stands for (`\\n` -> newline); the same few recur in every file."""
    try:
        return ast.literal_eval('"' + escape + '"')
    except (SyntaxError, ValueError):
        return escape


def string_literal_text(source: str, start: int, end: int,
                        fill_hole: Callable[[str], str]) -> MappedText | None:
    """The value of the string literal(s) in `source[start:end]` (implicit concatenation and
    f-strings included), mapped to file offsets. `fill_hole` gives the text standing in for an
    f-string's `{expression}`. None if the span holds something else (bytes, say)."""
    out = MappedText()
    i = start
    while i < end:
        i = _skip_between_literals(source, i, end)
        if i >= end:
            break
        j = i
        while j < end and source[j].isalpha():
            j += 1
        prefix = source[i:j].lower()
        quote = next((q for q in _QUOTES if source.startswith(q, j)), None)
        if quote is None or "b" in prefix:
            return None
        body_start = j + len(quote)
        body_end = _closing_quote(source, body_start, end, quote, "f" in prefix)
        if body_end < 0:
            return None
        if "f" in prefix:
            out = out + _fstring_body(source, body_start, body_end, "r" in prefix, fill_hole)
        else:
            out = out + decode_literal_body(source[body_start:body_end], body_start, "r" in prefix)
        i = body_end + len(quote)
    return out


def _skip_between_literals(source: str, i: int, end: int) -> int:
    while i < end:
        ch = source[i]
        if ch in " \t\r\n\f()":
            i += 1
        elif ch == "\\":
            i += 2
        elif ch == "#":
            newline = source.find("\n", i, end)
            i = end if newline < 0 else newline + 1
        else:
            break
    return i


#: the characters that can change `_closing_quote`'s state; everything between them is skipped
_QUOTE_EVENTS = re.compile(r"""[\\{}'"]""")


def _closing_quote(source: str, i: int, end: int, quote: str, fstring: bool) -> int:
    depth = 0
    while i < end:
        found = _QUOTE_EVENTS.search(source, i, end)
        if found is None:
            return -1
        i = found.start()
        ch = source[i]
        if ch == "\\":
            i += 2
            continue
        if fstring and ch == "{":
            if depth == 0 and source.startswith("{{", i):
                i += 2
                continue
            depth += 1
        elif fstring and ch == "}" and depth:
            depth -= 1
        elif depth and ch in "'\"":  # a string nested in an f-string hole (Python 3.12+)
            nested = next(q for q in _QUOTES if source.startswith(q, i))
            close = source.find(nested, i + len(nested), end)
            i = end if close < 0 else close + len(nested)
            continue
        elif depth == 0 and source.startswith(quote, i):
            return i
        i += 1
    return -1


def _fstring_body(source: str, start: int, end: int, raw: bool,
                  fill_hole: Callable[[str], str]) -> MappedText:
    out = MappedText()
    literal_start = i = start
    while i < end:
        ch = source[i]
        if ch in "{}" and source.startswith(ch * 2, i):
            out = out + decode_literal_body(source[literal_start:i], literal_start, raw)
            out = out + MappedText(ch, [i])
            i += 2
            literal_start = i
        elif ch == "{":
            out = out + decode_literal_body(source[literal_start:i], literal_start, raw)
            close = _hole_end(source, i + 1, end)
            expression = re.split(r"(?<![=!<>])[!:=](?!=)", source[i + 1:close], maxsplit=1)[0]
            value = fill_hole(expression.strip())
            out = out + MappedText(value, [i] * len(value))
            i = literal_start = close + 1
        elif ch == "\\" and not raw:
            i += 2
        else:
            i += 1
    return out + decode_literal_body(source[literal_start:end], literal_start, raw)


def _hole_end(source: str, i: int, end: int) -> int:
    depth = 0
    while i < end:
        ch = source[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return end
