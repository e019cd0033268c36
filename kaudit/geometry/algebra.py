"""Symbolic integer expressions over sizes, in a polynomial normal form, with the recognisers
that tell a division rounding up from one rounding down.

Sizes are symbols (`x.numel()`, `x.size(0)`, a host parameter `n`); grids, blocks and a kernel's
per-block coverage become expressions over them, kept in a polynomial normal form so `threads`
bound to `256` equals `blockDim.x` launched with 256. Divisions are recognised as rounding up
(`(n + B - 1) / B`, `cdiv`, `-(-n // B)`, `(n - 1) / B + 1`, `ceil(n / (float)B)`, ...) or down
(`n / B`, `n // B`, `int(n / B)`, `n >> 8`). Nothing is executed; sympy is not needed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

#: symbol kinds: "size" (derived from a tensor), "problem" (a module constant the problem's
#: get_inputs uses), "param" (a parameter or attribute whose value is decided elsewhere), "meta"
#: (a Triton meta-parameter), "builtin" (blockIdx.x, tl.program_id(0), ...), "kparam" (a kernel
#: parameter, replaced by the launch's argument)
SIZE_KINDS = frozenset({"size", "problem"})
#: a size symbol: `x.size(1)` (also written `x.shape[1]`, `x.sizes()[1]`)
_SIZE_ATOM = re.compile(r"^(?P<tensor>.+)\.size\((?P<index>[^()]*)\)$")


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
    _poly: dict[tuple[str, ...], int] | None = field(default=None, init=False, repr=False)

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
Poly = dict[Monomial, int]  # integer coefficients: constants are integers, divisions are atoms


def poly(e: Expr) -> Poly:
    """Sum of products of atoms; divisions, modulo, min/max, ... are atoms keyed by the normal
    form of their arguments, so `(n + 255) / 256` and `(255 + n) / 256` are the same atom.
    Computed once per expression; callers must not modify the result."""
    cached = e._poly
    if cached is None:
        cached = _poly(e)
        object.__setattr__(e, "_poly", cached)
    return cached


def _poly(e: Expr) -> Poly:
    if e.op == "const":
        return {(): e.value} if e.value else {}
    if e.op == "add":
        out: Poly = {}
        for a in e.args:
            _accumulate(out, poly(a))
        return out
    if e.op == "neg":
        return {m: -c for m, c in poly(e.args[0]).items()}
    if e.op == "mul":
        result: Poly = {(): 1}
        for a in e.args:
            result = _multiply(result, poly(a))
        return result
    return {(atom_key(e),): 1}


def _accumulate(into: Poly, other: Poly, scale: int = 1) -> None:
    for m, c in other.items():
        value = into.get(m, 0) + c * scale
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
            factors.insert(0, const(c))
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
    if isinstance(value, Fraction):
        return int(value) if value.denominator == 1 else None
    return None if value is None else int(value)


Number = int | Fraction  # integers, exactly; fractions only below a true division


def _eval(e: Expr, env: dict[str, int]) -> Number | None:  # noqa: C901 - one case per op
    if e.op == "const":
        return e.value
    if e.op == "sym":
        return env.get(e.value, e.known)
    values = [_eval(a, env) for a in e.args]
    if any(v is None for v in values):
        if e.op == "cond" and values[0] is not None:
            return values[1] if values[0] else values[2]
        return None
    v: list[Number] = values  # type: ignore[assignment]
    try:
        if e.op == "add":
            return sum(v)
        if e.op == "mul":
            out: Number = 1
            for x in v:
                out *= x
            return out
        if e.op == "neg":
            return -v[0]
        if e.op in ("fdiv", "tdiv", "cdiv", "truediv"):
            q = Fraction(v[0], v[1]) if type(v[0]) is int and type(v[1]) is int \
                else Fraction(v[0]) / v[1]
            if e.op == "truediv":
                return q
            if e.op == "cdiv":
                return math.ceil(q)
            return math.floor(q) if e.op == "fdiv" or q >= 0 else math.ceil(q)
        if e.op == "mod":
            return v[0] % v[1]
        if e.op == "ceil":
            return math.ceil(v[0])
        if e.op in ("floor", "trunc"):
            return math.floor(v[0]) if v[0] >= 0 else math.ceil(v[0])
        if e.op == "min":
            return min(v)
        if e.op == "max":
            return max(v)
        if e.op == "np2":
            n = max(math.ceil(v[0]), 1)
            return 1 << (n - 1).bit_length()
        if e.op == "cmp":
            a, b = v
            return int({"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b,
                        "==": a == b, "!=": a != b}.get(e.value, False))
        if e.op == "cond":
            return v[1] if v[0] else v[2]
    except (ZeroDivisionError, ValueError, OverflowError, TypeError):
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
    if dc == 0:
        return False
    for m, c in poly(num).items():
        rest = list(m)
        missing = []
        for atom in dm:
            if atom in rest:
                rest.remove(atom)
            else:
                missing.append(atom)
        if missing and not _sizes_divide_numel(missing, rest):
            return False
        known = c
        for atom in rest:  # problem constants fold into the coefficient
            value = _known_value(num, atom)
            if value is not None:
                known *= value
        if known % dc:
            return False
    return True


def _sizes_divide_numel(sizes: list[str], atoms: list[str]) -> bool:
    """`x.numel()` among `atoms` is a multiple of the product of `sizes` when they are sizes of
    `x` along distinct dimensions: one size (`x.numel() / x.size(-1)` is the number of rows), or
    several literal dimensions of one sign (`x.size(0) * x.size(1)`)."""
    by_tensor: dict[str, list[str]] = {}
    for atom in sizes:
        match = _SIZE_ATOM.match(atom)
        if match is None:
            return False
        by_tensor.setdefault(match["tensor"], []).append(match["index"])
    for tensor, indices in by_tensor.items():
        if f"{tensor}.numel()" not in atoms:
            return False
        if len(indices) > 1:
            values = [int(i) if re.fullmatch(r"-?\d+", i) else None for i in indices]
            if None in values or len(set(values)) != len(values) \
                    or len({v < 0 for v in values}) != 1:  # type: ignore[operator]
                return False
    return True


def _known_value(e: Expr, name: str) -> int | None:
    return next((n.known for n in walk_expr(e) if n.op == "sym" and n.value == name), None)


# --- recognisers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Division:
    """A grid dimension that divides a size: rounded up (`ceil`), down (`floor`), exactly
    (`exact`: the numerator is a provable multiple), by a dimension of the data (`rows`: the
    number of rows, exact for well-formed inputs) or with a too-small rounding term (`partial`)."""

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


def remainder_text(division: Division) -> str:
    """`n % 256` for a division of `n` by 256 (what a floor division leaves over)."""
    return f"{_paren_text(division.num)} % {_paren_text(division.den)}"


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
            _accumulate(diff, poly(den), -1)
            _accumulate(diff, {(): 1})
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
    constants: list[int] = []
    den_poly = poly(den)
    for term in terms:
        p = poly(term)
        if not any(m for m in p):
            constants.append(p.get((), 0))
        elif _is_scaled(p, den_poly):
            _accumulate(rounding, p)
        else:
            sizes.append(term)
    positive = [c for c in constants if c > 0]
    if positive and any(c < 0 for c in constants):
        # `(W - 2 + 127) / 128`: the negative constants adjust the size, the largest positive one
        # is the rounding term.
        constants = [max(positive)]
    _accumulate(rounding, {(): sum(constants)})
    return sizes, rounding


def _is_scaled(p: Poly, q: Poly) -> bool:
    """`p` is a constant multiple of the non-constant polynomial `q` (`-threads` of `threads`)."""
    if not p or not any(m for m in q) or set(p) != set(q):
        return False
    ratios = {Fraction(p[m], q[m]) for m in q}
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


def counts_rows(den: Expr) -> bool:
    """`den` is a tensor size or a product of them (`x.size(-1)`, `C * H * W`, a problem
    constant): a grid dividing by it counts rows of the data, which is exact for any input of a
    consistent shape; a block size (`256`, `BLOCK`, `4 * x.size(-1)`) is not."""
    try:
        p = poly(den)
    except RecursionError:
        return False
    if len(p) != 1 or unknown_in(den):
        return False
    (monomial, coefficient_), = p.items()
    kinds = {s.value: s.kind for s in symbols(den)}
    return coefficient_ == 1 and bool(monomial) and all(kinds.get(a) in SIZE_KINDS for a in monomial)


def classify_division(e: Expr) -> Division | None:
    found = ceil_div(e)
    if found:
        return Division("ceil", _size_part(found[0], found[1]), found[1], e)
    found = floor_div(e)
    if found:
        kind = "exact" if is_multiple(*found) else "rows" if counts_rows(found[1]) else "floor"
        return Division(kind, found[0], found[1], e)
    if e.op in ("fdiv", "tdiv") and _has_size_term(e.args[0]):
        return Division("exact" if is_multiple(*e.args) else "partial", e.args[0], e.args[1], e)
    return None


@dataclass(frozen=True)
class DimClass:
    """What one grid dimension is: "ceil", "floor", "exact", "rows", "partial" (a Division), "const",
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
        if any(p.kind == "ceil" for p in parts) \
                and all(p.kind in ("ceil", "size", "const", "exact", "rows") for p in parts):
            return next(p for p in parts if p.kind == "ceil")
        if any(p.kind in ("floor", "partial") for p in parts):
            return DimClass("product", next(p.division for p in parts if p.division), reason=e.show())
        if all(p.kind in ("size", "const", "exact", "rows") for p in parts):
            return DimClass("size")  # `batch * (x.numel() / (batch * channels))`
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
