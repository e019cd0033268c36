"""Launch geometry: the grid and block of every kernel launch, what the kernel indexes with, and a
tiny symbolic evaluator that compares the two. The KA2xx rules are small queries over this.

Sizes are symbols (`x.numel()`, `x.size(0)`, a host parameter `n`); the grid, the block and the
kernel's per-block coverage (`blockIdx.x * blockDim.x + threadIdx.x` covers `blockDim.x` elements
per block; `pid * BLOCK + tl.arange(0, BLOCK)` covers `BLOCK`) become expressions over them, kept in
a polynomial normal form so `threads` bound to `256` equals `blockDim.x` launched with 256, and
`meta["BLOCK"]` equals the kernel's `BLOCK` launched with `BLOCK=...`. Divisions are recognised as
rounding up (`(n + B - 1) / B`, `cdiv`, `-(-n // B)`, `(n - 1) / B + 1`, `ceil(n / (float)B)`, ...)
or down (`n / B`, `n // B`, `int(n / B)`, `n >> 8`). Nothing is executed; sympy is not needed.
"""

from __future__ import annotations

import ast
import bisect
import functools
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import tree_sitter

from kaudit.cpp import CppFunction, CppIndex, KernelLaunch
from kaudit.findings import Location
from kaudit.python_scope import dotted_parts
from kaudit.source import (
    CudaUnit,
    SourceModel,
    TritonKernel,
    TritonLaunch,
    cuda_language,
    cuda_parser,
)

# =============================================================================================
# Symbolic expressions
# =============================================================================================

#: symbol kinds: "size" (derived from a tensor), "problem" (a module constant the problem's
#: get_inputs uses), "param" (a parameter or attribute whose value is decided elsewhere), "meta"
#: (a Triton meta-parameter), "builtin" (blockIdx.x, tl.program_id(0), ...), "kparam" (a kernel
#: parameter, replaced by the launch's argument)
SIZE_KINDS = frozenset({"size", "problem"})


@dataclass(frozen=True, eq=False)
class Expr:
    """One node of a symbolic integer expression. `text` is the source it came from, if any."""

    op: str
    args: tuple[Expr, ...] = ()
    value: Any = None  # const: int; sym: name; unknown: reason; cmp: operator
    text: str = ""
    kind: str = ""  # syms only
    known: int | None = None  # syms only: a value known from the module (problem constants)
    written: str = ""  # when `text` is a name: the text of the expression it was bound to

    def show(self) -> str:
        return clip(self.text if self.text else render(self))

    def __repr__(self) -> str:
        return f"Expr({render(self)})"


def clip(text: str, limit: int = 80) -> str:
    """Whitespace collapsed and long text cut, for messages."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def const(value: int, text: str = "") -> Expr:
    return Expr("const", value=int(value), text=text)


def sym(name: str, kind: str = "param", text: str = "", known: int | None = None) -> Expr:
    return Expr("sym", value=name, text=text, kind=kind, known=known)


def unknown(reason: str, text: str = "") -> Expr:
    return Expr("unknown", value=reason, text=text)


def op(name: str, *args: Expr, value: Any = None, text: str = "") -> Expr:
    return Expr(name, tuple(args), value=value, text=text)


def with_text(expr: Expr, text: str) -> Expr:
    """`expr` as written `text`; when `text` is a name, `written` keeps what it stands for."""
    is_name = text.replace(".", "_").isidentifier()
    written = expr.text if is_name and expr.text and expr.text != text else expr.written
    return Expr(expr.op, expr.args, expr.value, text, expr.kind, expr.known, written)


def make_div(kind: str, a: Expr, b: Expr, text: str = "") -> Expr:
    """`a / b` (C, `tdiv`), `a // b` (Python, `fdiv`) or true division; nested integer divisions
    fold (`n / 4 / 256` is `n / 1024`)."""
    if kind in ("fdiv", "tdiv") and a.op in ("fdiv", "tdiv"):
        divisor = op("mul", a.args[1], b, text=f"{a.args[1].show()} * {b.show()}")
        value = evaluate(divisor)
        return op(kind, a.args[0], const(value) if value is not None else divisor, text=text)
    return op(kind, a, b, text=text)


_OP_TEXT = {"fdiv": "//", "tdiv": "/", "truediv": "/", "mod": "%"}


def render(e: Expr) -> str:
    if e.op == "const":
        return str(e.value)
    if e.op == "sym":
        return e.text if e.text and e.text.replace(".", "_").isidentifier() else str(e.value)
    if e.op == "unknown":
        return e.text or "?"
    if e.op == "add":
        out = ""
        for i, a in enumerate(e.args):
            if a.op == "neg":
                out += f" - {_paren(a.args[0])}" if i else f"-{_paren(a.args[0])}"
            elif a.op == "const" and a.value < 0 and i:
                out += f" - {-a.value}"
            else:
                out += f" + {render(a)}" if i else render(a)
        return out
    if e.op == "mul":
        return " * ".join(_paren(a) for a in e.args)
    if e.op == "neg":
        return f"-{_paren(e.args[0])}"
    if e.op in _OP_TEXT:
        return f"{_paren(e.args[0])} {_OP_TEXT[e.op]} {_paren(e.args[1])}"
    if e.op == "cmp":
        return f"{_paren(e.args[0])} {e.value} {_paren(e.args[1])}"
    if e.op == "cond":
        return f"({render(e.args[0])} ? {render(e.args[1])} : {render(e.args[2])})"
    return f"{e.op}({', '.join(render(a) for a in e.args)})"


def _paren(e: Expr) -> str:
    text = render(e)
    return f"({text})" if e.op in ("add", "neg", "fdiv", "tdiv", "truediv", "mod", "cmp") else text


def walk_expr(e: Expr) -> Iterator[Expr]:
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.args)


def symbols(e: Expr) -> list[Expr]:
    return [n for n in walk_expr(e) if n.op == "sym"]


def unknown_in(e: Expr) -> Expr | None:
    return next((n for n in walk_expr(e) if n.op == "unknown"), None)


def substitute(e: Expr, mapping: dict[str, Expr]) -> Expr:
    """`e` with symbols named in `mapping` replaced."""
    if e.op == "sym":
        return mapping.get(e.value, e)
    if not e.args:
        return e
    args = tuple(substitute(a, mapping) for a in e.args)
    if all(x is y for x, y in zip(args, e.args)):
        return e
    return Expr(e.op, args, e.value, e.text, e.kind, e.known, e.written)


# --- polynomial normal form (equality, coefficients, divisibility) -----------------------------

Monomial = tuple[str, ...]
Poly = dict[Monomial, Fraction]


def poly(e: Expr) -> Poly:
    """Sum of products of atoms; divisions, modulo, min/max, ... are atoms keyed by the normal
    form of their arguments, so `(n + 255) / 256` and `(255 + n) / 256` are the same atom."""
    if e.op == "const":
        return {(): Fraction(e.value)} if e.value else {}
    if e.op == "add":
        out: Poly = {}
        for a in e.args:
            _accumulate(out, poly(a))
        return out
    if e.op == "neg":
        return {m: -c for m, c in poly(e.args[0]).items()}
    if e.op == "mul":
        result: Poly = {(): Fraction(1)}
        for a in e.args:
            result = _multiply(result, poly(a))
        return result
    return {(atom_key(e),): Fraction(1)}


def _accumulate(into: Poly, other: Poly, scale: Fraction = Fraction(1)) -> None:
    for m, c in other.items():
        value = into.get(m, Fraction(0)) + c * scale
        if value:
            into[m] = value
        else:
            into.pop(m, None)


def _multiply(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            _accumulate(out, {tuple(sorted(ma + mb)): ca * cb})
    return out


def atom_key(e: Expr) -> str:
    if e.op == "sym":
        return str(e.value)
    if e.op == "unknown":
        return f"?{e.text}|{e.value}"
    name = "div" if e.op in ("fdiv", "tdiv") else e.op
    extra = f"|{e.value}" if e.value is not None else ""
    return f"{name}({';'.join(poly_key(poly(a)) for a in e.args)}{extra})"


def poly_key(p: Poly) -> str:
    return " + ".join(f"{c}*{'*'.join(m)}" for m, c in sorted(p.items())) or "0"


def equal(a: Expr, b: Expr) -> bool:
    """Symbolic equality in the polynomial normal form (`threads * 4` == `4 * threads`); an
    expression holding something kaudit does not know equals nothing."""
    if unknown_in(a) or unknown_in(b):
        return False
    try:
        return poly(a) == poly(b)
    except RecursionError:
        return False


def coefficient(e: Expr, atom: str) -> Poly | None:
    """The coefficient of the symbol `atom` in `e` when `e` is linear in it, else None."""
    try:
        p = poly(e)
    except RecursionError:
        return None
    out: Poly = {}
    for m, c in p.items():
        count = m.count(atom)
        if count > 1 or any(atom in part and part != atom for part in m if "(" in part):
            return None
        if count == 1:
            rest = list(m)
            rest.remove(atom)
            _accumulate(out, {tuple(rest): c})
    return out or None


def poly_expr(p: Poly) -> Expr:
    """A renderable expression for a polynomial (used for coefficients in messages)."""
    terms = []
    for m, c in sorted(p.items()):
        factors = [sym(name) for name in m]
        if c != 1 or not factors:
            factors.insert(0, const(int(c)) if c.denominator == 1 else unknown(str(c), str(c)))
        terms.append(factors[0] if len(factors) == 1 else op("mul", *factors))
    if not terms:
        return const(0)
    return terms[0] if len(terms) == 1 else op("add", *terms)


# --- evaluation --------------------------------------------------------------------------------


def evaluate(e: Expr, env: dict[str, int] | None = None) -> int | None:
    """The integer value of `e` when every symbol is known (from `env` or a known constant)."""
    try:
        value = _eval(e, env or {})
    except RecursionError:
        return None
    if value is None or isinstance(value, bool):
        return None if value is None else int(value)
    if isinstance(value, Fraction):
        return int(value) if value.denominator == 1 else None
    return int(value)


def _eval(e: Expr, env: dict[str, int]) -> Fraction | None:  # noqa: C901 - one case per op
    if e.op == "const":
        return Fraction(e.value)
    if e.op == "sym":
        value = env.get(e.value, e.known)
        return None if value is None else Fraction(value)
    values = [_eval(a, env) for a in e.args]
    if any(v is None for v in values):
        if e.op == "cond" and values[0] is not None:
            return values[1] if values[0] else values[2]
        return None
    v: list[Fraction] = values  # type: ignore[assignment]
    try:
        if e.op == "add":
            return sum(v, Fraction(0))
        if e.op == "mul":
            out = Fraction(1)
            for x in v:
                out *= x
            return out
        if e.op == "neg":
            return -v[0]
        if e.op == "fdiv":
            return Fraction(math.floor(v[0] / v[1]))
        if e.op == "tdiv":
            q = v[0] / v[1]
            return Fraction(math.floor(q) if q >= 0 else math.ceil(q))
        if e.op == "truediv":
            return v[0] / v[1]
        if e.op == "cdiv":
            return Fraction(math.ceil(v[0] / v[1]))
        if e.op == "mod":
            return v[0] % v[1]
        if e.op == "ceil":
            return Fraction(math.ceil(v[0]))
        if e.op in ("floor", "trunc"):
            return Fraction(math.floor(v[0]) if v[0] >= 0 else math.ceil(v[0]))
        if e.op == "min":
            return min(v)
        if e.op == "max":
            return max(v)
        if e.op == "np2":
            n = max(int(math.ceil(v[0])), 1)
            return Fraction(1 << (n - 1).bit_length())
        if e.op == "cmp":
            a, b = v
            return Fraction(int({"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b,
                                 "==": a == b, "!=": a != b}.get(e.value, False)))
        if e.op == "cond":
            return v[1] if v[0] else v[2]
    except (ZeroDivisionError, ValueError, OverflowError):
        return None
    return None


def is_multiple(num: Expr, den: Expr) -> bool:
    """True when `num` is provably a multiple of `den` (`blocks * 256` of 256, `rows * 1024` of
    256, 4096 of 256, `cdiv(n, B) * B` of `B`)."""
    try:
        return _is_multiple(num, den)
    except RecursionError:
        return False


def _is_multiple(num: Expr, den: Expr) -> bool:
    a, b = evaluate(num), evaluate(den)
    if b is not None and b > 0 and a is not None:
        return a % b == 0
    dp = poly(den)
    if len(dp) != 1 or unknown_in(num) or unknown_in(den):
        return False
    (dm, dc), = dp.items()
    if dc.denominator != 1 or dc == 0:
        return False
    for m, c in poly(num).items():
        rest = list(m)
        if any(rest.count(atom) < dm.count(atom) for atom in set(dm)):
            return False
        for atom in dm:
            rest.remove(atom)
        known = c
        for atom in rest:  # problem constants fold into the coefficient
            value = _known_value(num, atom)
            if value is not None:
                known *= value
        if known.denominator != 1 or known.numerator % dc.numerator:
            return False
    return True


def _known_value(e: Expr, name: str) -> int | None:
    return next((n.known for n in walk_expr(e) if n.op == "sym" and n.value == name), None)


# --- recognisers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Division:
    """A grid dimension that divides a size: rounded up (`ceil`), down (`floor`), exactly
    (`exact`: the numerator is a provable multiple) or with a too-small rounding term (`partial`)."""

    kind: str
    num: Expr  # the size divided (`n` for `(n + 255) / 256`)
    den: Expr
    expr: Expr

    def describe(self, python: bool) -> str:
        """`n / 256` for a floor division; a ceil division as written (`(n + 255) / 256`,
        `triton.cdiv(n, BLOCK)`), through the variable it was bound to."""
        if self.kind == "ceil":
            return clip(self.expr.written or self.expr.text or render(self.expr))
        sign = "//" if python else "/"
        return f"{_paren_text(self.num)} {sign} {_paren_text(self.den)}"


def _paren_text(e: Expr) -> str:
    text = e.show()
    if text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        return text
    simple = text.replace("_", "").replace(".", "").replace("(", "").replace(")", "") \
        .replace("[", "").replace("]", "").replace("'", "").replace('"', "").isalnum()
    return text if simple else f"({text})"


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def ceil_div(e: Expr) -> tuple[Expr, Expr] | None:
    """(size, divisor) when `e` rounds a division up, in any of the usual spellings:
    `cdiv(n, B)`, `ceil(n / B)`, `(n + B - 1) / B` (and `//`), `(n - 1) / B + 1`, `n / B + 1`,
    `n / B + (n % B != 0)`, `-(-n // B)` (Python floor division only), `(n + 255) >> 8`."""
    if e.op == "cdiv":
        return e.args[0], e.args[1]
    if e.op == "ceil" and e.args[0].op == "truediv":
        return e.args[0].args[0], e.args[0].args[1]
    if e.op in ("fdiv", "tdiv"):
        num, den = e.args
        sizes, rounding = _split_numerator(num, den)
        if sizes:
            diff = dict(rounding)
            _accumulate(diff, poly(den), Fraction(-1))
            _accumulate(diff, {(): Fraction(1)})
            if all(c > 0 for c in diff.values()):
                return num, den
        return None
    if e.op == "neg" and e.args[0].op == "fdiv":
        inner, den = e.args[0].args
        p = poly(inner)
        if p and all(c < 0 for c in p.values()):
            return _negated(inner), den
        return None
    if e.op == "add":
        divs = [a for a in e.args if a.op in ("fdiv", "tdiv")]
        rest = [a for a in e.args if a not in divs]
        if len(divs) == 1 and rest and all(_rounds_up(a) for a in rest):
            return divs[0].args[0], divs[0].args[1]
        return None
    if e.op == "max" or (e.op == "cond" and len(e.args) == 3):
        for a in e.args[1:] if e.op == "cond" else e.args:
            found = ceil_div(a)
            if found:
                return found
    return None


def _split_numerator(num: Expr, den: Expr) -> tuple[list[Expr], Poly]:
    """The terms of a division's numerator that are sizes, and the rounding term the others add
    up to: `n + 255` -> ([n], 255); `out_len + threads - 1` -> ([out_len], threads - 1) with
    `out_len` kept whole because it is a name. Constants and multiples of the divisor round."""
    terms: list[Expr] = []
    pending = [num]
    while pending:
        term = pending.pop(0)
        named = bool(term.written) or (term.text.isidentifier() and term.op != "sym")
        if term.op == "add" and not named:
            pending[:0] = list(term.args)
        else:
            terms.append(term)
    sizes: list[Expr] = []
    rounding: Poly = {}
    constants: list[Fraction] = []
    den_poly = poly(den)
    for term in terms:
        p = poly(term)
        if not any(m for m in p):
            constants.append(p.get((), Fraction(0)))
        elif _is_scaled(p, den_poly):
            _accumulate(rounding, p)
        else:
            sizes.append(term)
    positive = [c for c in constants if c > 0]
    if positive and any(c < 0 for c in constants):
        # `(W - 2 + 127) / 128`: the negative constants adjust the size, the largest positive one
        # is the rounding term.
        constants = [max(positive)]
    _accumulate(rounding, {(): sum(constants, Fraction(0))})
    return sizes, rounding


def _is_scaled(p: Poly, q: Poly) -> bool:
    """`p` is a constant multiple of the non-constant polynomial `q` (`-threads` of `threads`)."""
    if not p or not any(m for m in q) or set(p) != set(q):
        return False
    ratios = {p[m] / q[m] for m in q}
    return len(ratios) == 1


def _size_part(num: Expr, den: Expr) -> Expr:
    """`n` of `n + 255`, `n + threads - 1` (the numerator of a ceil division without its rounding
    term), as written."""
    sizes, _ = _split_numerator(num, den)
    return sizes[0] if len(sizes) == 1 else num


def _negated(e: Expr) -> Expr:
    return e.args[0] if e.op == "neg" else op("neg", e)


def _rounds_up(e: Expr) -> bool:
    """A term added to a floor division that makes it cover the remainder: a positive constant,
    or anything conditional on a remainder (`n % B != 0`, `(n % B) ? 1 : 0`, `bool(n % B)`)."""
    value = evaluate(e)
    if value is not None:
        return value > 0
    return any(n.op in ("mod", "cmp", "cond") for n in walk_expr(e))


def _has_size_term(e: Expr) -> bool:
    return any(m for m in poly(e)) if not unknown_in(e) else False


def floor_div(e: Expr) -> tuple[Expr, Expr] | None:
    """(size, divisor) when `e` divides a size without rounding up (`n / B`, `n // B`,
    `int(n / B)`, `floor(n / B)`, `n >> 8`, `-(-n / B)` in C, `max(n // B, 1)`)."""
    if e.op in ("fdiv", "tdiv") and ceil_div(e) is None:
        num, den = e.args
        sizes, rounding = _split_numerator(num, den)
        if sizes and all(c < 0 for c in rounding.values()):
            return num, den
        return None
    if e.op == "neg" and e.args[0].op == "tdiv":  # C truncates, so -(-n / B) is n / B
        inner, den = e.args[0].args
        p = poly(inner)
        if p and all(c < 0 for c in p.values()):
            return _negated(inner), den
    if e.op == "max" and len(e.args) == 2:
        small = [a for a in e.args if evaluate(a) is not None and evaluate(a) <= 1]
        other = [a for a in e.args if a not in small]
        if small and len(other) == 1:
            return floor_div(other[0])
    return None


def classify_division(e: Expr) -> Division | None:
    found = ceil_div(e)
    if found:
        return Division("ceil", _size_part(found[0], found[1]), found[1], e)
    found = floor_div(e)
    if found:
        kind = "exact" if is_multiple(*found) else "floor"
        return Division(kind, found[0], found[1], e)
    if e.op in ("fdiv", "tdiv") and _has_size_term(e.args[0]):
        return Division("exact" if is_multiple(*e.args) else "partial", e.args[0], e.args[1], e)
    return None


@dataclass(frozen=True)
class DimClass:
    """What one grid dimension is: "ceil", "floor", "exact", "partial" (a Division), "const",
    "size" (grows with a tensor size), "param" (a value decided by the caller), "capped"
    (`min(..., C)`), "product" (a floor division times something), or "unknown"."""

    kind: str
    division: Division | None = None
    value: int | None = None
    reason: str = ""


def classify_dim(e: Expr) -> DimClass:
    try:
        return _classify_dim(e)
    except RecursionError:
        return DimClass("unknown", reason="the expression nests too deeply")


def _classify_dim(e: Expr) -> DimClass:
    missing = unknown_in(e)
    division = classify_division(e)
    if division is not None and (missing is None or division.kind == "ceil"):
        return DimClass(division.kind, division)
    if missing is not None:
        return DimClass("unknown", reason=str(missing.value))
    syms = symbols(e)
    if not syms:
        value = evaluate(e)
        if value is None:
            return DimClass("unknown", reason="not an integer")
        return DimClass("const", value=value)
    if e.op == "min":
        return DimClass("capped", reason=clip(e.written or e.show()))
    if e.op == "max":
        inner = [classify_dim(a) for a in e.args if symbols(a)]
        if len(inner) == 1:
            return inner[0]
    if e.op == "mul":
        parts = [classify_dim(a) for a in e.args]
        if any(p.kind == "ceil" for p in parts) and all(p.kind in ("ceil", "size", "const", "exact")
                                                        for p in parts):
            return next(p for p in parts if p.kind == "ceil")
        if any(p.kind in ("floor", "partial") for p in parts):
            return DimClass("product", next(p.division for p in parts if p.division), reason=e.show())
    if any(n.op in ("fdiv", "tdiv", "truediv", "cdiv", "mod", "min", "shr") for n in walk_expr(e)):
        inner = next(classify_division(n) for n in walk_expr(e) if n.op in ("fdiv", "tdiv", "cdiv")) \
            if any(n.op in ("fdiv", "tdiv", "cdiv") for n in walk_expr(e)) else None
        if inner is not None and inner.kind == "ceil":
            return DimClass("ceil", inner)
        return DimClass("unknown", reason=f"`{e.show()}` mixes divisions kaudit does not decide")
    if all(s.kind not in SIZE_KINDS for s in syms):
        names = ", ".join(sorted({str(s.value) for s in syms}))
        return DimClass("param", reason=f"`{names}` is a parameter or attribute set by the caller")
    return DimClass("size")


# =============================================================================================
# Python expressions (host code of Triton launches, sizes handed to extensions)
# =============================================================================================

#: callee names (lower-cased, last component) that round a division up
CEIL_DIV_NAMES = frozenset({
    "cdiv", "ceil_div", "ceildiv", "div_up", "divup", "div_round_up", "ceil_divide", "ceildivide",
    "div_ceil", "divceil", "round_up_div", "cuda_ceil_div", "ceil_div_int", "idiv_ceil",
    "num_blocks_for", "blocks_for",
})
_CONDITIONAL_STMTS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.Match)
_PY_BINOPS: dict[type, str] = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.FloorDiv: "fdiv",
                               ast.Div: "truediv", ast.Mod: "mod", ast.LShift: "shl", ast.RShift: "shr"}
_PY_CMPOPS: dict[type, str] = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
                               ast.NotEq: "!="}


def binary(name: str, a: Expr, b: Expr, text: str = "") -> Expr:
    """Builds +, -, *, divisions, %, shifts; shifts by constants become * or / by powers of 2."""
    if name == "sub":
        return op("add", a, op("neg", b, text=f"-{b.show()}"), text=text)
    if name in ("shl", "shr"):
        k = evaluate(b)
        if k is None or not 0 <= k < 63:
            return op(name, a, b, text=text)
        return op("mul", a, const(1 << k), text=text) if name == "shl" \
            else make_div("tdiv", a, const(1 << k), text)
    if name in ("fdiv", "tdiv", "truediv"):
        return make_div(name, a, b, text)
    return op(name, a, b, text=text)


def rounding(name: str, arg: Expr, text: str = "") -> Expr:
    """ceil / floor / int() of an expression: of a true division they are integer divisions."""
    if arg.op == "truediv":
        a, b = arg.args
        if name == "ceil":
            return op("cdiv", a, b, text=text)
        return make_div("fdiv", a, b, text)
    if name == "trunc":
        return with_text(arg, text) if text else arg
    return op(name, arg, text=text)


@dataclass
class PyDef:
    position: tuple[int, int]
    value: ast.expr | None
    index: int | None  # element of a tuple unpacking
    operator: str  # "=", "+", "-", "*", ...
    containers: tuple[ast.AST, ...]  # conditional statements around the definition


class PyScope:
    """Names of one Python function (or lambda), resolved to expressions at a position."""

    def __init__(self, geo: GeometryAnalysis, function: ast.AST | None, *,
                 parent: PyScope | None = None, bound: dict[str, Expr] | None = None,
                 meta: str | None = None, meta_values: dict[str, Expr] | None = None) -> None:
        self.geo = geo
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
            for name_field in ("test", "value", "iter") if self.geo.walrus else ():
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
        return self.geo.module_value(name, text or name)

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
            receiver = self.geo.code(node.value)
            return sym(f"{receiver}.size({index})", "size", f"{receiver}.shape[{index}]")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "size" and not node.args:
            receiver = self.geo.code(node.func.value)
            return sym(f"{receiver}.size({index})", "size", f"{receiver}.size({index})")
        return unknown("tuple element of a value kaudit does not follow", self.geo.code(node))

    def expr(self, node: ast.AST, at: tuple[int, int]) -> Expr:  # noqa: C901 - one case per form
        # Source text is kept for names, constants and calls (messages quote them); operators
        # render from their operands.
        if isinstance(node, ast.Name):
            return self.resolve(node.id, at, node.id)
        text = "" if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.BoolOp)) \
            else self.geo.code(node)
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
                return self.geo.self_attribute(self.function, parts[1], text)
            if node.attr == "ndim":
                return sym(f"{self.geo.code(node.value)}.dim()", "size", text)
            return unknown(f"`{text}` is an attribute kaudit does not follow", text)
        return unknown(f"`{text[:40]}` is not an integer expression kaudit follows", text)

    def _call(self, node: ast.Call, at: tuple[int, int], text: str) -> Expr:
        func = node.func
        parts = dotted_parts(func) or []
        resolved = self.geo.model.bindings.resolve(func) or ".".join(parts)
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
        if resolved in ("min", "max") and len(args) >= 2 and "min" not in self.geo.model.functions \
                and "max" not in self.geo.model.functions:
            return op(resolved, *(self.expr(a, at) for a in args), text=text)
        if resolved.endswith("next_power_of_2") and len(args) == 1:
            return op("np2", self.expr(args[0], at), text=text)
        if resolved == "len" and len(args) == 1:
            return sym(f"len({self.geo.code(args[0])})", "size", text)
        if len(parts) == 1 and parts[0] in self.geo.model.functions \
                and parts[0] not in self.geo.model.triton_kernels:
            inlined = self.geo.inline_python(self.geo.model.functions[parts[0]], node, self, at)
            if inlined is not None:
                return with_text(inlined, text)
        return unknown(f"`{text[:50]}` is computed by a call kaudit does not follow", text)

    def _tensor_size(self, receiver: ast.expr, method: str, args: list[ast.expr],
                     text: str) -> Expr | None:
        name = self.geo.code(receiver)
        if method in ("numel", "nelement") and not args:
            return sym(f"{name}.numel()", "size", text)
        if method in ("size", "stride") and len(args) == 1:
            index = self.geo.code(args[0])
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
            return sym(f"{self.geo.code(value.value)}.size({self.geo.code(index)})", "size", text)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and value.func.attr == "size" and not value.args:
            return sym(f"{self.geo.code(value.func.value)}.size({self.geo.code(index)})", "size",
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


# =============================================================================================
# C++/CUDA expressions (host functions that launch, kernel bodies)
# =============================================================================================

Node = tree_sitter.Node
BUILTIN_OBJECTS = frozenset({"blockIdx", "threadIdx", "blockDim", "gridDim"})
_AXES = {"x": 0, "y": 1, "z": 2}
_AXIS_NAMES = "xyz"
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
_INTEGRAL_TYPES = ("int", "long", "short", "size_t", "int64_t", "int32_t", "uint32_t", "uint64_t",
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
_KERNEL_KINDS = ("declaration", "assignment_expression", "call_expression", "for_statement",
                 "while_statement", "do_statement", "binary_expression", "field_expression")
_ALL_KINDS = tuple(dict.fromkeys(_DEF_KINDS + _KERNEL_KINDS + ("if_statement", "preproc_def",
                                                                "preproc_function_def")))


@functools.cache
def _query() -> tree_sitter.Query:
    return tree_sitter.Query(cuda_language(), " ".join(f"({kind}) @{kind}" for kind in _ALL_KINDS))
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


def c_tokens(node: Node, src: Source) -> set[str]:
    """Identifiers an expression reads, with builtins as `blockIdx.x`; callee names left out."""
    out: set[str] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        kind = current.type
        if kind == "field_expression":
            argument = current.child_by_field_name("argument")
            if argument is not None and argument.type == "identifier" \
                    and src.text_of(argument) in BUILTIN_OBJECTS:
                out.add(src.text_of(current).replace(" ", ""))
                continue
            if argument is not None:
                stack.append(argument)
            continue
        if kind == "identifier":
            out.add(src.text_of(current))
            continue
        if kind == "call_expression":
            arguments = current.child_by_field_name("arguments")
            function = current.child_by_field_name("function")
            if arguments is not None:
                stack.append(arguments)
            if function is not None and function.type == "field_expression":
                stack.append(function)  # x.size(0): the receiver is read
            continue
        if kind in ("string_literal", "type_descriptor", "template_argument_list", "sizeof_expression"):
            continue
        stack.extend(current.children)
    return out


def _number(text: str) -> tuple[int | None, bool]:
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

    def __init__(self, geo: GeometryAnalysis, unit: CudaUnit, function: CppFunction | None, *,
                 kernel: bool = False, bound: dict[str, Expr] | None = None) -> None:
        self.geo = geo
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
            name_node, pointer = _declarator_name(parameter.child_by_field_name("declarator"))
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
                name_node, _ = _declarator_name(parameter.child_by_field_name("declarator"))
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
        for node in self.geo.c_nodes(unit, _DEF_KINDS, body):
            kind = node.type
            if kind == "declaration":
                type_node = node.child_by_field_name("type")
                type_text = unit.text_of(type_node) if type_node is not None else ""
                for child in node.children_by_field_name("declarator"):
                    if child.type == "init_declarator":
                        name_node, _ = _declarator_name(child.child_by_field_name("declarator"))
                        if name_node is not None:
                            add(unit.text_of(name_node), CDef(
                                child.start_byte, child.child_by_field_name("value"), "=", type_text,
                                child, body))
                    else:
                        name_node, _ = _declarator_name(child)
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
        return self.geo.c_constant(name, text)

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

    # --- expressions --------------------------------------------------------------------------

    def expr(self, node: Node, at: int, src: Source | None = None) -> Expr:  # noqa: C901
        src = src or self.unit
        text = src.text_of(node)
        kind = node.type
        if kind == "number_literal":
            value, is_float = _number(text)
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
            if head in BUILTIN_OBJECTS and axis in _AXES:
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
        if any(t in compact for t in _INTEGRAL_TYPES) or compact in ("auto",):
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
        inlined = self.geo.inline_c(short, arg_nodes, self, at, src)
        if inlined is not None:
            return with_text(inlined, text)
        return unknown(f"`{text[:50]}` is computed by a call kaudit does not follow", text)


def _is_float(e: Expr) -> bool:
    return e.op in ("float", "truediv")


def _strip_float(e: Expr) -> Expr:
    return e.args[0] if e.op == "float" else e


def _declarator_name(declarator: Node | None) -> tuple[Node | None, bool]:
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


@dataclass
class Dims:
    """A grid or block: up to three expressions, how many were written, and how it was written."""

    exprs: list[Expr]
    explicit: int
    text: str
    name: str = ""  # the variable it came from, if any
    unknown_reason: str = ""
    definition: str = ""  # what that variable was set to

    def shown(self) -> str:
        """`grid` as written, with its definition when it is a variable."""
        if self.definition and self.definition != self.text:
            return f"`{clip(self.text)}` (= `{clip(self.definition)}`)"
        return f"`{clip(self.text)}`"

    def get(self, axis: int) -> Expr:
        return self.exprs[axis] if axis < len(self.exprs) else const(1)

    def implicit(self, axis: int) -> bool:
        return axis >= self.explicit and not self.unknown_reason


# =============================================================================================
# What a kernel indexes with
# =============================================================================================


@dataclass
class Store:
    """A write to global memory: `out[i] = ...`, `*(out + i) = ...`, `atomicAdd(&out[i], v)`,
    `tl.store(ptr + offs, v)`."""

    text: str
    location: Location
    guarded: bool  # a bound check, mask or loop condition on its index
    tokens: frozenset[str]  # what the index depends on, transitively
    extents: tuple[Expr, ...] = ()  # Triton: the `tl.arange` extents in the pointer


@dataclass
class ConstBound:
    """A bound check of a global index against an integer literal (`i < 4096`)."""

    text: str
    literal: int
    location: Location


@dataclass
class KernelFacts:
    name: str
    lang: str  # "cuda" or "triton"
    params: list[str]
    size_params: list[str]  # integral (CUDA) or non-constexpr scalar (Triton) parameters
    block_axes: set[int]  # blockIdx / program_id axes the stored indices depend on
    thread_axes: set[int]  # threadIdx axes the stored indices depend on (CUDA)
    loop_axes: set[int]  # axes a loop walks over the whole size (grid-stride, persistent loops)
    stride_axes: set[int]  # axes with a loop stepping by gridDim / num_programs
    coverage_source: Callable[[], dict[int, list[Expr]]]  # computes `coverage` when first asked
    stores: list[Store]
    const_bounds: list[ConstBound]
    shared: list[tuple[str, int | None]]  # static __shared__ arrays and their bytes
    template_params: list[str] = field(default_factory=list)
    constexpr: set[str] = field(default_factory=set)

    _coverage: dict[int, list[Expr]] | None = None

    @property
    def coverage(self) -> dict[int, list[Expr]]:
        """Elements each block (program) covers along an axis, in kernel terms."""
        if self._coverage is None:
            try:
                self._coverage = self.coverage_source()
            except RecursionError:
                self._coverage = {}
        return self._coverage


def _closure_fn(deps: dict[str, set[str]]) -> Callable[[Iterable[str]], frozenset[str]]:
    cache: dict[str, frozenset[str]] = {}

    def of_name(name: str) -> frozenset[str]:
        if name in cache:
            return cache[name]
        seen = {name}
        pending = [name]
        while pending:
            current = pending.pop()
            for token in deps.get(current, ()):
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


def _axes(tokens: Iterable[str], prefix: str) -> set[int]:
    out = set()
    for token in tokens:
        if prefix in ("pid", "nprog"):
            if token.startswith(prefix) and token[len(prefix):].isdigit():
                out.add(int(token[len(prefix):]))
        elif token.startswith(prefix + ".") and token[-1] in _AXES:
            out.add(_AXES[token[-1]])
    return out


_EXIT_STATEMENTS = frozenset({"return_statement", "break_statement", "continue_statement"})


def _exits(node: Node) -> bool:
    if node.type in _EXIT_STATEMENTS:
        return True
    if node.type == "compound_statement":
        return any(c.type in _EXIT_STATEMENTS for c in node.named_children)
    return False


def cuda_kernel_facts(geo: GeometryAnalysis, function: CppFunction) -> KernelFacts:  # noqa: C901
    unit = function.unit
    scope = CScope(geo, unit, function, kernel=True)
    body = function.body
    deps = {name: set().union(*(c_tokens(d.value, unit) for d in defs if d.value is not None))
            for name, defs in scope.defs.items()}
    closure = _closure_fn(deps)
    globals_ = set(scope.pointer_params)
    shared: list[tuple[str, int | None]] = []
    local_pointers: list[tuple[str, set[str]]] = []
    stores_raw: list[tuple[Node, set[str], Node]] = []  # (statement, index tokens, index node)
    loops: list[Node] = []
    comparisons: list[Node] = []
    builtins: set[str] = set()
    for node in geo.c_nodes(unit, _KERNEL_KINDS, body) if body is not None else []:
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
    def coverage() -> dict[int, list[Expr]]:
        found: dict[int, list[Expr]] = {}
        for name, defs in scope.defs.items():
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
    bounds = []
    for comparison in comparisons:
        bound = _const_bound(comparison, unit, closure, ("blockIdx.", "threadIdx."))
        if bound is not None:
            bounds.append(bound)
    size_params = [name for name, type_text in scope.params.items()
                   if name not in scope.pointer_params
                   and any(t in type_text for t in _INTEGRAL_TYPES)]
    return KernelFacts(
        function.name, "cuda", scope.param_names, size_params,
        _axes(store_tokens, "blockIdx"), _axes(store_tokens, "threadIdx"), loop_axes, stride_axes,
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
            name_node, pointer = _declarator_name(inner)
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
            for inner in _walk(node):
                if inner.type == "init_declarator":
                    name_node, _ = _declarator_name(inner.child_by_field_name("declarator"))
                    if name_node is not None:
                        variables.add(unit.text_of(name_node))
                elif inner.type in ("assignment_expression", "update_expression"):
                    target = inner.child_by_field_name("left") or inner.child_by_field_name("argument")
                    if target is not None and target.type == "identifier":
                        variables.add(unit.text_of(target))
    condition_tokens = c_tokens(condition, unit)
    if not variables:  # while / do: the condition's names assigned inside the loop
        body = loop.child_by_field_name("body")
        assigned = {unit.text_of(n.child_by_field_name("left") or n) for n in _walk(body)
                    if n.type == "assignment_expression"} if body is not None else set()
        variables = condition_tokens & assigned
    if not variables:
        return set(), set()
    bound = {t for t in condition_tokens - variables if "." not in t}
    reach = closure(variables)
    covered = _axes(reach, "blockIdx") if bound else set()
    strided = _axes(reach, "gridDim")
    return covered | strided, strided


def _walk(node: Node) -> Iterator[Node]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)


def _add_coverage(coverage: dict[int, list[Expr]], e: Expr, prefix: str) -> None:
    if unknown_in(e) and not any(s.op == "sym" and str(s.value).startswith(prefix) for s in walk_expr(e)):
        return
    for axis in range(3):
        atom = f"{prefix}{_AXIS_NAMES[axis]}" if prefix.endswith(".") else f"{prefix}{axis}"
        if not any(s.op == "sym" and s.value == atom for s in walk_expr(e)):
            continue
        p = coefficient(e, atom)
        if p:
            found = poly_expr(p)
            if not any(equal(found, c) for c in coverage.get(axis, [])):
                coverage.setdefault(axis, []).append(found)


def _const_bound(comparison: Node, unit: CudaUnit,
                 closure: Callable[[Iterable[str]], frozenset[str]],
                 prefixes: tuple[str, str]) -> ConstBound | None:
    left = comparison.child_by_field_name("left")
    right = comparison.child_by_field_name("right")
    operator = comparison.child_by_field_name("operator")
    if left is None or right is None or operator is None:
        return None
    sign = unit.text_of(operator)
    for index_side, literal_side, upper in ((left, right, sign in ("<", "<=", ">=", ">")),
                                            (right, left, True)):
        if literal_side.type != "number_literal" or not upper:
            continue
        value, is_float = _number(unit.text_of(literal_side))
        if value is None or is_float or value < 2:
            continue
        reach = closure(c_tokens(index_side, unit))
        if all(any(t.startswith(p) for t in reach) for p in prefixes):
            return ConstBound(" ".join(unit.text_of(comparison).split()), value,
                              unit.location(comparison))
    return None


# --- Triton ---------------------------------------------------------------------------------

_TL = "triton.language."


class TritonKernelScope(PyScope):
    """A Triton kernel's names: locals assigned once are replaced by their value; parameters are
    symbols the launch fills in; `tl.program_id(a)` is `pid<a>`, `tl.arange` a symbol per call."""

    def __init__(self, geo: GeometryAnalysis, function: ast.FunctionDef,
                 values: dict[str, ast.expr | None], aranges: dict[int, int]) -> None:
        super().__init__(geo, function)
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
        return self.geo.module_value(name, text)

    def _call(self, node: ast.Call, at: tuple[int, int], text: str) -> Expr:
        resolved = self.geo.model.bindings.resolve(node.func) or ""
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


_PLAIN_NODES = frozenset({ast.Name, ast.Constant, ast.Load, ast.Store, ast.Del, ast.FunctionDef,
                          ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda})


def _push_children(node: ast.AST, stack: list[ast.AST]) -> None:
    for name in node._fields:
        value = getattr(node, name, None)
        if type(value) is list:
            stack.extend(v for v in reversed(value) if isinstance(v, ast.AST))
        elif isinstance(value, ast.AST) and name != "ctx":
            stack.append(value)


def _parents(nodes: list[ast.stmt]) -> dict[int, ast.AST]:
    return {id(node): parent for node, parent in _walk_code(nodes) if parent is not None}


def _walk_code(nodes: Iterable[ast.AST]) -> Iterator[tuple[ast.AST, ast.AST | None]]:
    """(node, parent) under `nodes`, not entering nested functions or classes."""
    stack: list[tuple[ast.AST, ast.AST | None]] = [(n, None) for n in reversed(list(nodes))]
    while stack:
        node, parent = stack.pop()
        yield node, parent
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend((child, node) for child in reversed(list(ast.iter_child_nodes(node))))


def triton_kernel_facts(geo: GeometryAnalysis, kernel: TritonKernel) -> KernelFacts:  # noqa: C901
    function = kernel.node
    model = geo.model
    params = [a.arg for a in function.args.posonlyargs + function.args.args]
    constexpr = {a.arg for a in function.args.posonlyargs + function.args.args
                 if a.annotation is not None and geo.code(a.annotation).endswith("constexpr")}
    values: dict[str, list[ast.expr]] = {}
    parents: dict[int, ast.AST] = {}
    calls: list[tuple[ast.Call, str]] = []
    loops: list[ast.AST] = []
    compares: list[ast.Compare] = []
    aranges: dict[int, int] = {}
    arange_nodes: list[ast.Call] = []
    stack: list[ast.AST] = list(reversed(function.body))
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind not in _PLAIN_NODES:
            _push_children(node, stack)
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

    token_cache: dict[int, set[str]] = {}

    def tokens(node: ast.AST) -> set[str]:
        key = id(node)
        if key not in token_cache:
            token_cache[key] = _tokens(node)
        return token_cache[key]

    tl_calls = {id(call): short for call, short in calls}

    def _tokens(node: ast.AST) -> set[str]:
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
                _push_children(current, stack)
        return out

    deps = {name: set().union(*(tokens(v) for v in vs)) for name, vs in values.items()}
    closure = _closure_fn(deps)
    single = {name: (vs[0] if len(vs) == 1 and not isinstance(vs[0], _Opaque) else None)
              for name, vs in values.items()}
    scope = TritonKernelScope(geo, function, single, aranges)
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
        stores.append(Store(geo.code(call).split("\n")[0][:80], model.location(call), guarded,
                            reach, extents))
    all_pids = {f"pid{_triton_axis(c)}" for c, short in calls if short == "program_id"}
    store_tokens = frozenset().union(*(s.tokens for s in stores)) if stores else frozenset(all_pids)
    loop_axes, stride_axes = set(), set()
    for loop in loops:
        covered, strided = _py_loop_axes(loop, closure, tokens, constexpr, model)
        loop_axes |= covered
        stride_axes |= strided
    def coverage() -> dict[int, list[Expr]]:
        found: dict[int, list[Expr]] = {}
        for name, vs in values.items():
            if len(vs) == 1 and not isinstance(vs[0], _Opaque) \
                    and any(t.startswith("pid") for t in closure([name])):
                _add_coverage(found, scope.resolve(name, (0, 0)), "pid")
        for call, short in calls:
            if (short == "store" or short.startswith("atomic_")) and call.args:
                if any(t.startswith("pid") for t in tokens(call.args[0])):
                    _add_coverage(found, scope.expr(call.args[0], (0, 0)), "pid")
        return found
    bounds = []
    for compare in compares:
        bound = _py_const_bound(compare, closure, tokens, geo)
        if bound is not None:
            bounds.append(bound)
    compared = {t for c in compares for t in tokens(c)}
    size_params = [p for p in params if p not in constexpr and "ptr" not in p.lower()
                   and not p.lower().startswith("stride")
                   and (p in compared or _SIZE_NAME.match(p) is not None)]
    return KernelFacts(kernel.name, "triton", params, size_params, _axes(store_tokens, "pid"), set(),
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
    return unknown("arange", scope.geo.code(call))


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
        covered = _axes(start_reach, "pid") if sized else set()
        strided = _axes(step_reach, "nprog")
        if covered and step is not None and not isinstance(step, ast.Constant):
            strided |= covered
        return covered | strided, strided
    if isinstance(loop, ast.While):
        variables = {n.id for n in ast.walk(loop.test) if isinstance(n, ast.Name)}
        reach = closure(variables)
        bound = variables - {n.target.id for n in ast.walk(loop) if isinstance(n, ast.AugAssign)
                             and isinstance(n.target, ast.Name)}
        covered = _axes(reach, "pid") if bound else set()
        strided = _axes(reach, "nprog")
        return covered | strided, strided
    return set(), set()


def _py_const_bound(compare: ast.Compare, closure: Callable[[Iterable[str]], frozenset[str]],
                    tokens: Callable[[ast.AST], set[str]], geo: GeometryAnalysis) -> ConstBound | None:
    if len(compare.ops) != 1 or not isinstance(compare.ops[0], (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
        return None
    for index_side, literal_side in ((compare.left, compare.comparators[0]),
                                     (compare.comparators[0], compare.left)):
        if isinstance(literal_side, ast.Constant) and isinstance(literal_side.value, int) \
                and not isinstance(literal_side.value, bool) and literal_side.value >= 2:
            reach = closure(tokens(index_side))
            if any(t.startswith("pid") for t in reach) and any(t.startswith("arange") for t in reach):
                return ConstBound(geo.code(compare), literal_side.value, geo.model.location(compare))
    return None


# =============================================================================================
# Launches
# =============================================================================================

_CHECK_CALLS = frozenset({"TORCH_CHECK", "AT_ASSERT", "TORCH_INTERNAL_ASSERT", "assert", "AT_CHECK",
                          "CHECK", "TORCH_CHECK_EQ", "AT_ASSERTM", "static_assert", "CHECK_EQ"})
INDIRECT_LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchCooperativeKernel", "cuLaunchKernel",
                               "cudaLaunchKernelEx", "cuLaunchKernelEx"})


@dataclass
class Precondition:
    text: str
    divisors: list[Expr]  # the `B` of each `X % B` in the check


@dataclass
class LaunchGeometry:
    """One kernel launch with its grid, block, the launched kernel's facts and the host context."""

    geo: GeometryAnalysis
    lang: str  # "cuda" or "triton"
    kernel_name: str
    location: Location
    text: str  # the launch as written, first line
    kernel: KernelFacts | None
    grid: Dims
    block: Dims | None
    shared: Expr | None
    num_warps: list[tuple[Expr, str]]
    params: dict[str, Expr]  # kernel parameter (and blockDim.x, ...) -> value at this launch
    host: Any  # the function holding the launch (tail launches are looked for there)
    expanded: str  # the launch's text plus the definitions of the names it uses
    host_sizes: bool  # the host derives sizes from tensors around the launch
    _dims: dict[int, DimClass] = field(default_factory=dict)

    @property
    def python(self) -> bool:
        return self.lang == "triton"

    def dim(self, axis: int) -> DimClass:
        if axis not in self._dims:
            if self.grid.unknown_reason:
                self._dims[axis] = DimClass("unknown", reason=self.grid.unknown_reason)
            else:
                self._dims[axis] = classify_dim(self.grid.get(axis))
        return self._dims[axis]

    def coverage(self, axis: int) -> list[Expr]:
        """Elements each block (program) covers along `axis`, in host terms."""
        if self.kernel is None:
            return []
        try:
            return [substitute(c, self.params) for c in self.kernel.coverage.get(axis, [])]
        except RecursionError:
            return []

    def covered_by_loop(self, axis: int) -> bool:
        return self.kernel is not None and axis in self.kernel.loop_axes

    def coverage_matches(self, axis: int, den: Expr) -> Expr | None:
        """The per-block coverage equal to a grid divisor, when the kernel has one."""
        den_value = evaluate(den)
        for c in self.coverage(axis):
            if equal(c, den) or (den_value is not None and evaluate(c) == den_value):
                return c
        return None

    def has_precondition(self, den: Expr) -> Precondition | None:
        return self.geo.precondition_for(den)

    def tail_launch(self) -> LaunchGeometry | None:
        """Another launch in the same host function that handles what this one leaves over."""
        for other in self.geo.launches:
            if other is self or other.host is not self.host or self.host is None:
                continue
            if "%" in other.expanded or (self.grid.name and _mentions(other.expanded, self.grid.name)):
                return other
            division = next((self.dim(a).division for a in range(3) if self.dim(a).division), None)
            if division is not None and _mentions(other.expanded, division.num.show()) \
                    and _mentions(other.expanded, division.den.show()):
                return other
        return None

    def handles_tail(self) -> bool:
        """This launch is the tail launch of another one in the same host function."""
        return any(other is not self and other.host is self.host and other.tail_launch() is self
                   for other in self.geo.launches)

    def element_axes(self) -> set[int]:
        """Axes along which the kernel stores per element (the index also depends on the
        thread: `threadIdx` / `tl.arange`), as opposed to one value per block (`out[blockIdx.x]`)."""
        if self.kernel is None:
            return set()
        out: set[int] = set()
        for store in self.kernel.stores:
            axes, per_element = store_axes(self.kernel, store)
            if per_element:
                out |= axes
        return out


def _mentions(text: str, name: str) -> bool:
    return bool(name) and re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", text) is not None


class GeometryAnalysis:
    """Launch geometry facts for one file; built once per model and shared by the KA2xx rules."""

    def __init__(self, model: SourceModel) -> None:
        self.model = model
        self._module_values: dict[str, ast.expr] | None = None
        self._problem_names: set[str] | None = None
        self._module_memo: dict[str, Expr] = {}
        self._c_constants: dict[str, tuple[str, Any, Any]] | None = None
        self._c_memo: dict[str, Expr] = {}
        self._kernel_facts: dict[int, KernelFacts] = {}
        self._preconditions: list[Precondition] | None = None
        self._inline_depth = 0
        self._py_functions: list[ast.AST] | None = None
        self._scopes: dict[int, Any] = {}
        self._c_node_index: dict[int, dict[str, tuple[list[int], list[Node]]]] = {}
        self.walrus = ":=" in model.text
        self.launches: list[LaunchGeometry] = []
        self.indirect: list[tuple[Location, str]] = []
        self._build()

    @classmethod
    def of(cls, model: SourceModel) -> GeometryAnalysis:
        return model.memo("geometry", lambda: cls(model))

    def code(self, node: ast.AST) -> str:
        try:
            return self.model.code_of(node)
        except (AttributeError, IndexError):
            return ast.unparse(node) if isinstance(node, ast.AST) else ""

    # --- module-level Python -------------------------------------------------------------------

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

    # --- C file scope --------------------------------------------------------------------------

    def c_constant(self, name: str, text: str) -> Expr:
        if self._c_constants is None:
            self._c_constants = {}
            for unit in self.model.cuda_units:
                self._collect_c_constants(unit)
        entry = self._c_constants.get(name)
        if entry is None:
            return unknown(f"`{name}` is not defined where kaudit can see it", text)
        if name not in self._c_memo:
            self._c_memo[name] = unknown(f"`{name}` is defined in terms of itself", name)
            kind, value, unit = entry
            if kind == "macro":
                snippet = _Snippet(value)
                result = CScope(self, unit, None).expr(snippet.value, 0, snippet) \
                    if snippet.value is not None else unknown(f"macro `{name}`", name)
            else:
                result = CScope(self, unit, None).expr(value, 0)
            self._c_memo[name] = result
        return with_text(self._c_memo[name], text)

    def _collect_c_constants(self, unit: CudaUnit) -> None:
        assert self._c_constants is not None
        for node in self.c_nodes(unit, ("preproc_def", "preproc_function_def", "declaration")):
            kind = node.type
            name_node = node.child_by_field_name("name")
            if kind == "preproc_def":
                value_node = node.child_by_field_name("value")
                if name_node is not None and value_node is not None:
                    self._c_constants.setdefault(unit.text_of(name_node),
                                                 ("macro", unit.text_of(value_node).strip(), unit))
            elif kind == "preproc_function_def":
                if name_node is not None:
                    self._c_constants.setdefault(unit.text_of(name_node), ("function", node, unit))
            elif node.parent is not None and node.parent.type in _FILE_SCOPE:
                qualifiers = {unit.text_of(c) for c in node.children if c.type == "type_qualifier"}
                if qualifiers & {"const", "constexpr"}:
                    for declarator in node.children_by_field_name("declarator"):
                        value = declarator.child_by_field_name("value")
                        name_node, _ = _declarator_name(declarator.child_by_field_name("declarator"))
                        if declarator.type == "init_declarator" and value is not None \
                                and name_node is not None:
                            self._c_constants.setdefault(unit.text_of(name_node), ("value", value, unit))

    def inline_c(self, name: str, arg_nodes: list[Node], caller: CScope, at: int,
                 src: Source) -> Expr | None:
        if self._inline_depth > 4:
            return None
        if self._c_constants is None:
            self.c_constant("", "")
        assert self._c_constants is not None
        args = [caller.expr(a, at, src) for a in arg_nodes]
        entry = self._c_constants.get(name)
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

    # --- preconditions -------------------------------------------------------------------------

    def preconditions(self) -> list[Precondition]:
        if self._preconditions is None:
            try:
                self._preconditions = self._python_preconditions() + self._c_preconditions()
            except RecursionError:
                self._preconditions = []
        return self._preconditions

    def precondition_for(self, den: Expr) -> Precondition | None:
        den_value = evaluate(den)
        for check in self.preconditions():
            for divisor in check.divisors:
                value = evaluate(divisor)
                if equal(divisor, den) or is_multiple(divisor, den) or (
                        value is not None and den_value is not None and den_value > 0
                        and value % den_value == 0):
                    return check
        return None

    def _python_preconditions(self) -> list[Precondition]:
        out = []
        for node in self.model.nodes:
            test = None
            if isinstance(node, ast.Assert):
                test = node.test
            elif isinstance(node, ast.If) and any(isinstance(s, ast.Raise) for s in node.body):
                test = node.test
            if test is None:
                continue
            scope = self.python_scope(self.enclosing_function(node))
            at = (node.lineno, node.col_offset)
            divisors = [scope.expr(n.right, at) for n in ast.walk(test)
                        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)]
            out.append(Precondition(self.code(test), divisors))
        return out

    def _c_preconditions(self) -> list[Precondition]:
        out = []
        if not self.model.cuda_units:
            return out
        index = CppIndex.of(self.model)
        for call in index.calls:
            if call.name in _CHECK_CALLS and call.args and call.function is not None:
                out.append(self._c_precondition(call.args[0], call.unit, call.function))
        for function in index.functions:
            if function.qualifier == "global" or function.body is None:
                continue
            for node in self.c_nodes(function.unit, ("if_statement",), function.body):
                consequence = node.child_by_field_name("consequence")
                condition = node.child_by_field_name("condition")
                if consequence is None or condition is None:
                    continue
                text = function.unit.text_of(consequence)
                if any(word in text for word in ("throw", "TORCH_CHECK", "AT_ERROR", "abort",
                                                  "TORCH_INTERNAL_ASSERT")):
                    out.append(self._c_precondition(condition, function.unit, function))
        return out

    def _c_precondition(self, node: Node, unit: CudaUnit, function: CppFunction) -> Precondition:
        scope = self.c_scope(unit, function)
        divisors = []
        for inner in _walk(node):
            if inner.type == "binary_expression":
                operator = inner.child_by_field_name("operator")
                right = inner.child_by_field_name("right")
                if operator is not None and unit.text_of(operator) == "%" and right is not None:
                    divisors.append(scope.expr(right, inner.start_byte))
        return Precondition(unit.text_of(node), divisors)

    # --- C node index -------------------------------------------------------------------------

    def c_nodes(self, unit: CudaUnit, kinds: tuple[str, ...], within: Node | None = None) -> list[Node]:
        """The nodes of the given types in a unit (inside `within` when given), in source order;
        one tree-sitter query per unit finds them all."""
        index = self._c_node_index.get(id(unit))
        if index is None:
            captures = tree_sitter.QueryCursor(_query()).captures(unit.tree.root_node)
            index = {}
            for kind, nodes in captures.items():
                nodes = sorted(nodes, key=lambda n: n.start_byte)
                index[kind] = ([n.start_byte for n in nodes], nodes)
            self._c_node_index[id(unit)] = index
        out: list[Node] = []
        for kind in kinds:
            starts, nodes = index.get(kind, ([], []))
            if within is None:
                out.extend(nodes)
            else:
                lo = bisect.bisect_left(starts, within.start_byte)
                hi = bisect.bisect_left(starts, within.end_byte)
                out.extend(nodes[lo:hi])
        if len(kinds) > 1:
            out.sort(key=lambda n: n.start_byte)
        return out

    # --- scopes -------------------------------------------------------------------------------

    def enclosing_function(self, node: ast.AST) -> ast.AST | None:
        if self._py_functions is None:
            self._py_functions = []
            module = self.model.module
            pending: list[ast.AST] = list(module.body) if module is not None else []
            while pending:  # statements only: functions are defined by statements
                statement = pending.pop()
                if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self._py_functions.append(statement)
                for name in ("body", "orelse", "finalbody", "handlers"):
                    block = getattr(statement, name, None)
                    if isinstance(block, list):
                        pending.extend(block)
        position = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        best = None
        for function in self._py_functions:
            if (function.lineno, function.col_offset) <= position <= (
                    function.end_lineno or 0, function.end_col_offset or 0):
                if best is None or function.lineno >= best.lineno:
                    best = function
        return best

    def python_scope(self, function: ast.AST | None) -> PyScope:
        key = id(function)
        if key not in self._scopes:
            self._scopes[key] = PyScope(self, function)
        return self._scopes[key]

    def c_scope(self, unit: CudaUnit, function: CppFunction | None) -> CScope:
        key = id(function) if function is not None else id(unit)
        if key not in self._scopes:
            self._scopes[key] = CScope(self, unit, function)
        return self._scopes[key]

    def kernel_facts_cuda(self, function: CppFunction) -> KernelFacts:
        if id(function) not in self._kernel_facts:
            self._kernel_facts[id(function)] = cuda_kernel_facts(self, function)
        return self._kernel_facts[id(function)]

    def kernel_facts_triton(self, kernel: TritonKernel) -> KernelFacts:
        if id(kernel) not in self._kernel_facts:
            self._kernel_facts[id(kernel)] = triton_kernel_facts(self, kernel)
        return self._kernel_facts[id(kernel)]

    # --- building -----------------------------------------------------------------------------

    def _build(self) -> None:
        if self.model.module is None:
            return
        if self.model.cuda_units:
            index = CppIndex.of(self.model)
            for launch in index.launches:
                try:
                    self.launches.append(self._cuda_launch(index, launch))
                except RecursionError:  # pathological nesting: leave this launch alone
                    continue
            for call in index.calls:
                if call.short_name in INDIRECT_LAUNCHES:
                    target = " ".join(call.unit.text_of(call.args[0]).split()) if call.args else "?"
                    self.indirect.append((call.unit.location(call.node),
                                          f"{call.short_name}({target}, ...)"))
        for launch in self.model.triton_launches:
            try:
                geometry = self._triton_launch(launch)
            except RecursionError:
                continue
            if geometry is not None:
                self.launches.append(geometry)

    def _cuda_launch(self, index: CppIndex, launch: KernelLaunch) -> LaunchGeometry:
        unit = launch.unit
        scope = self.c_scope(unit, launch.function)
        at = launch.node.start_byte
        config = launch.config
        grid = self.c_dims(config[0], scope, at) if config else Dims([], 0, "", unknown_reason="no grid")
        block = self.c_dims(config[1], scope, at) if len(config) > 1 else None
        shared = scope.expr(config[2], at) if len(config) > 2 else None
        function = next((f for f in index.functions if f.name == launch.kernel
                         and f.qualifier == "global"), None)
        facts = self.kernel_facts_cuda(function) if function is not None else None
        params: dict[str, Expr] = {}
        if facts is not None:
            for name, arg in zip(facts.params, launch.args):
                params[name] = scope.expr(arg, at)
            callee = launch.node.child_by_field_name("function")
            if callee is not None and callee.type == "template_function":
                targs = callee.child_by_field_name("arguments")
                values = [a for a in targs.named_children] if targs is not None else []
                for name, arg in zip(facts.template_params, values):
                    params[name] = scope.expr(arg.named_children[0] if arg.type == "type_descriptor"
                                              and arg.named_children else arg, at)
        if block is not None:
            for axis in range(3):
                params[f"blockDim.{_AXIS_NAMES[axis]}"] = block.get(axis)
        for axis in range(3):
            if not grid.unknown_reason:
                params[f"gridDim.{_AXIS_NAMES[axis]}"] = grid.get(axis)
        pieces = [unit.text_of(c) for c in config] + [unit.text_of(a) for a in launch.args]
        expanded = self._expand_c(" ".join(pieces), launch, scope, at)
        text = " ".join(unit.text_of(launch.node).split())
        host_text = unit.text_of(launch.function.node) if launch.function is not None else ""
        return LaunchGeometry(
            self, "cuda", launch.kernel, unit.location(launch.node), text[:120], facts, grid, block,
            shared, [], params, launch.function, expanded,
            any(w in host_text for w in (".numel()", ".size(", "sizes()", "numel(")))

    def _expand_c(self, text: str, launch: KernelLaunch, scope: CScope, at: int) -> str:
        out = [text]
        for name in set(_identifiers(text)):
            chosen, _ = scope.select(name, at)
            for definition in chosen:
                if definition.value is not None:
                    out.append(launch.unit.text_of(definition.value))
        return "\n".join(out)

    def c_dims(self, node: Node, scope: CScope, at: int, depth: int = 0) -> Dims:
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
                    dims = self.c_dims(first.value, scope, first.start, depth + 1)
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

    def _triton_launch(self, launch: TritonLaunch) -> LaunchGeometry | None:
        kernel = self.model.triton_kernels.get(launch.kernel)
        if kernel is None:
            return None
        facts = self.kernel_facts_triton(kernel)
        call = launch.call
        function = self.enclosing_function(call)
        scope = self.python_scope(function)
        at = (call.lineno, call.col_offset)
        params: dict[str, Expr] = {}
        for name, arg in zip(facts.params, call.args):
            params[name] = scope.expr(arg, at)
        kwargs = {k.arg: scope.expr(k.value, at) for k in call.keywords if k.arg}
        params.update({k: v for k, v in kwargs.items() if k in facts.params})
        for name in facts.constexpr:
            params.setdefault(name, sym(f"meta.{name}", "meta", name))
        meta_values = {k: v for k, v in params.items()}
        grid = self.py_grid(launch.grid, scope, at, meta_values)
        num_warps: list[tuple[Expr, str]] = []
        if "num_warps" in kwargs:
            num_warps.append((kwargs["num_warps"], "the launch"))
        for decorator in kernel.node.decorator_list:
            for node in ast.walk(decorator):
                if isinstance(node, ast.keyword) and node.arg == "num_warps":
                    num_warps.append((PyScope(self, None).expr(node.value, (0, 0)),
                                      f"a `triton.Config` (line {node.value.lineno})"))
        pieces = [self.code(launch.grid)] + [self.code(a) for a in call.args] + \
            [self.code(k.value) for k in call.keywords]
        expanded = "\n".join(pieces + self._expand_py(" ".join(pieces), scope, at))
        text = self.code(call).split("\n")[0]
        host_text = self.code(function) if function is not None else ""
        return LaunchGeometry(
            self, "triton", launch.kernel, self.model.location(call), text[:120], facts, grid,
            None, None, num_warps, params, function, expanded,
            any(w in host_text for w in (".numel()", ".shape", ".size(")))

    def _expand_py(self, text: str, scope: PyScope, at: tuple[int, int]) -> list[str]:
        out = []
        for name in set(_identifiers(text)):
            chosen, _ = scope.select(name, at)
            for definition in chosen:
                if definition.value is not None:
                    out.append(self.code(definition.value))
        return out

    def py_grid(self, node: ast.AST, scope: PyScope, at: tuple[int, int],
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
            return self.py_grid(node.body, inner, at, meta_values, depth + 1)
        if isinstance(node, ast.Name):
            chosen, reason = scope.select(node.id, at)
            if reason:
                return Dims([], 0, text, node.id, reason)
            if chosen:
                first = chosen[0]
                if len(chosen) > 1 or first.value is None or first.index is not None:
                    return Dims([], 0, text, node.id, f"`{node.id}` is reassigned")
                dims = self.py_grid(first.value, scope, first.position, meta_values, depth + 1)
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
                    return self.py_grid(body[0].value, inner, (body[0].lineno, body[0].col_offset),
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
        dims = self.py_grid(returns[0].value, inner, at, meta_values, depth + 1)
        return Dims(dims.exprs, dims.explicit, text, text, dims.unknown_reason)


def _is_dim3_call(node: Node, unit: CudaUnit) -> bool:
    if node.type != "call_expression":
        return False
    function = node.child_by_field_name("function")
    return function is not None and unit.text_of(function).replace(" ", "") in ("dim3", "::dim3")


def _identifiers(text: str) -> list[str]:
    return re.findall(r"(?<![\w.])[A-Za-z_]\w*", text)


def axis_index_name(launch: LaunchGeometry, axis: int) -> str:
    """`blockIdx.y` or `tl.program_id(1)`."""
    return f"tl.program_id({axis})" if launch.python else f"blockIdx.{_AXIS_NAMES[axis]}"


def grid_dim_name(launch: LaunchGeometry, axis: int) -> str:
    """`grid`, `grid.y` or `grid[1]` (how a message names one dimension of the launch's grid)."""
    if launch.python:
        return f"grid[{axis}]" if launch.grid.explicit > 1 or axis else "grid"
    return "grid" if launch.grid.explicit <= 1 and axis == 0 else f"grid.{_AXIS_NAMES[axis]}"


def store_axes(kernel: KernelFacts, store: Store) -> tuple[set[int], bool]:
    """The block/program axes a store's index depends on, and whether it also depends on the
    thread (`threadIdx`, `tl.arange`), i.e. is an element index rather than a per-block one."""
    if kernel.lang == "cuda":
        return _axes(store.tokens, "blockIdx"), any(t.startswith("threadIdx.") for t in store.tokens)
    return _axes(store.tokens, "pid"), any(t.startswith("arange#") for t in store.tokens)


def show_value(e: Expr) -> str:
    """A number when the expression evaluates to one (`256` for `threads`), else its text."""
    value = evaluate(e)
    return str(value) if value is not None else e.show()


def remainder_text(division: Division) -> str:
    return f"{_paren_text(division.num)} % {_paren_text(division.den)}"


# =============================================================================================
# Small entry points for tests and rules
# =============================================================================================


def parse_python_expr(text: str, env: dict[str, str] | None = None) -> Expr:
    """An expression written in Python (`(n + 255) // 256`, `triton.cdiv(n, BLOCK)`), evaluated
    at module level after `import math, triton` and the assignments in `env` (name -> Python
    source). Free names are size symbols. For tests and examples."""
    lines = ["import math", "import triton"] + [f"{k} = {v}" for k, v in (env or {}).items()]
    source = "\n".join(lines + [f"__kaudit_e = {text}", ""])
    model = SourceModel("<expr>", source)
    geo = GeometryAnalysis(model)
    tree = model.module.body[-1].value  # type: ignore[union-attr,attr-defined]
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - set(env or {}) \
        - {"min", "max", "int", "len", "math", "triton"}
    bound = {n: sym(n, "size", n) for n in names}
    return PyScope(geo, None, bound=bound).expr(tree, (len(lines) + 1, 0))


def parse_c_expr(text: str, prelude: str = "") -> Expr:
    """An expression written in C++ (`(n + 255) / 256`), evaluated inside a host function whose
    body starts with `prelude` (declarations such as `const int threads = 256;`). Free names are
    size symbols."""
    source = (f"void __kaudit_host(int n, int m, int rows, int cols) {{ {prelude}\n"
              f" long __kaudit_e = ({text}); }}")
    model = SourceModel("<expr>", "x = 0\n")
    from kaudit.source import LineIndex
    unit = CudaUnit("cuda", source, cuda_parser().parse(source.encode("utf-8")), "<expr>",
                    LineIndex(source), None, ast.Constant(""))
    geo = GeometryAnalysis(model)
    index = CppIndex()
    index._add_unit(unit)
    function = index.functions[0]
    scope = CScope(geo, unit, function)
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
