"""Name resolution over one libcst module: import aliases and the strings that names are bound to.

Kernels hide what they call behind aliases (`import torch.nn.functional as fn`, `from torch import
matmul as mm`, `mm = torch.matmul`) and build their CUDA sources from pieces (`src = HEADER +
KERNEL`). This module undoes both, without running anything.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import libcst as cst


def dotted_parts(expr: cst.BaseExpression) -> list[str] | None:
    """`a.b.c` -> ["a", "b", "c"]; None for anything that is not a plain name chain."""
    parts: list[str] = []
    while isinstance(expr, cst.Attribute):
        parts.append(expr.attr.value)
        expr = expr.value
    if not isinstance(expr, cst.Name):
        return None
    parts.append(expr.value)
    parts.reverse()
    return parts


def _module_name(node: cst.BaseExpression) -> str:
    parts = dotted_parts(node)
    return ".".join(parts) if parts else ""


@dataclass
class Bindings:
    """What each module-level (or any-scope, last wins) name refers to."""

    #: local name -> fully qualified name, from imports and `alias = dotted.name` assignments
    qualified: dict[str, str] = field(default_factory=dict)
    #: name -> the expressions assigned to it, in source order (`=` and `+=`)
    assignments: dict[str, list[tuple[str, cst.BaseExpression]]] = field(default_factory=dict)

    def add_import(self, node: cst.Import | cst.ImportFrom) -> None:
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = _module_name(alias.name)
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self.qualified[alias.asname.name.value] = full
                else:
                    # `import torch.nn` binds `torch`
                    root = full.split(".")[0]
                    self.qualified[root] = root
            return
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        base = _module_name(node.module)
        for alias in node.names:
            if not isinstance(alias.name, cst.Name):
                continue
            name = alias.name.value
            local = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            self.qualified[local] = f"{base}.{name}"

    def add_assignment(self, name: str, op: str, value: cst.BaseExpression) -> None:
        self.assignments.setdefault(name, []).append((op, value))

    def finish(self) -> None:
        """Follow `alias = torch.matmul` style assignments once all imports are known."""
        for name, assigned in self.assignments.items():
            if name in self.qualified or len(assigned) != 1 or assigned[0][0] != "=":
                continue
            target = self.resolve(assigned[0][1])
            if target is not None and target != name:
                self.qualified[name] = target

    def resolve(self, expr: cst.BaseExpression) -> str | None:
        """The fully qualified name an expression such as `F.relu` or `T.nn.Linear` refers to."""
        parts = dotted_parts(expr)
        if not parts or parts[0] not in self.qualified:
            return None
        return ".".join([self.qualified[parts[0]], *parts[1:]])


# --- strings with a map back to the file -------------------------------------------------------

_ESCAPE = re.compile(
    r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|N\{[^}]*\}|[0-7]{1,3}|\n|.)", re.S
)
_STRING_PREFIX = re.compile(r"^([a-zA-Z]*)('''|\"\"\"|'|\")")


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


def decode_literal_body(body: str, start: int, raw: bool, fstring: bool = False) -> MappedText:
    """Evaluate a string literal's body, keeping for each character the offset it came from."""
    chars: list[str] = []
    offsets: list[int] = []
    i = 0
    n = len(body)
    while i < n:
        ch = body[i]
        if fstring and ch in "{}" and i + 1 < n and body[i + 1] == ch:
            chars.append(ch)
            offsets.append(start + i)
            i += 2
            continue
        if ch == "\\" and not raw:
            match = _ESCAPE.match(body, i)
            if match:
                try:
                    value = ast.literal_eval('"' + match.group(0) + '"')
                except (SyntaxError, ValueError):
                    value = match.group(0)
                chars.append(value)
                offsets.extend([start + i] * len(value))
                i = match.end()
                continue
        chars.append(ch)
        offsets.append(start + i)
        i += 1
    return MappedText("".join(chars), offsets)


def split_string_literal(raw_literal: str) -> tuple[str, str, int] | None:
    """(prefix, body, body offset within the literal) of a literal such as `r'''...'''`."""
    match = _STRING_PREFIX.match(raw_literal)
    if not match:
        return None
    prefix, quote = match.group(1), match.group(2)
    begin = len(prefix) + len(quote)
    if len(raw_literal) < begin + len(quote):
        return None
    return prefix.lower(), raw_literal[begin : len(raw_literal) - len(quote)], begin
