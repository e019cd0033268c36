"""The alternatives of each conditional in a function body, for the rules that compare what two
paths run (KA102: one path runs the reference; KA307: one path is gated on a literal shape).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from kaudit.forward import walk_code

#: (the conditional, what runs when it holds, what runs otherwise, whether the two exclude each other)
Alternative = tuple[ast.AST, Sequence[ast.AST], Sequence[ast.AST], bool]


def alternatives(body: Sequence[ast.stmt]) -> Iterator[Alternative]:
    """Each `if` with its two alternatives (the `else`/`elif`, or after an early return or raise
    the statements that follow), each `assert` (with empty alternatives), and the arms of
    `a if c else b`. The flag is False for an `if` without `else` whose body falls through: both
    paths then run what follows. Nested functions are entered, nested classes are not."""
    blocks: list[Sequence[ast.stmt]] = [body]
    while blocks:
        block = blocks.pop()
        for i, statement in enumerate(block):
            if isinstance(statement, ast.If):
                if statement.orelse:
                    yield statement, statement.body, statement.orelse, True
                else:
                    yield statement, statement.body, block[i + 1:], _leaves(statement.body)
            elif isinstance(statement, ast.Assert):
                yield statement, [], [], True
            if isinstance(statement, ast.ClassDef):
                continue
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(statement, field, None)
                if isinstance(inner, list) and inner:
                    blocks.append(inner)
            for handler in getattr(statement, "handlers", []) or []:
                blocks.append(handler.body)
    for node in walk_code(body):
        if isinstance(node, ast.IfExp):
            yield node, [node.body], [node.orelse], True


def exclusive_alternatives(body: Sequence[ast.stmt]
                           ) -> Iterator[tuple[ast.AST, Sequence[ast.AST], Sequence[ast.AST]]]:
    """The `if`s and `a if c else b`s of `alternatives` whose two paths exclude each other."""
    for node, first, second, exclusive in alternatives(body):
        if exclusive and not isinstance(node, ast.Assert):
            yield node, first, second


def _leaves(body: Sequence[ast.stmt]) -> bool:
    """True when a block always leaves the function (its last statement returns or raises)."""
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise))


#: guards on what the benchmark's problem fixes (KA102), as the note names them
_FIXED_BY_PROBLEM = {"rank": "the input's rank", "axis": "the axis the kernel reduces over"}


def guard_note(kind: str) -> str:
    """What a fallback finding adds when its branch is only a guard, on the input's `kind`
    (device, dtype, emptiness: what a benchmark's inputs never are) or on what the benchmark's
    problem fixes (rank, axis), and so is a warning (KA102, KA106)."""
    if kind in _FIXED_BY_PROBLEM:
        return (f" (a guard on {_FIXED_BY_PROBLEM[kind]}, which the benchmark's problem fixes: "
                "whether its inputs take this branch is the dynamic pass's to show, KD601 and "
                "KD602; a warning)")
    return f" (a guard on the input's {kind}, which a benchmark's inputs do not take: a warning)"
