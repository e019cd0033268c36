from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import tree_sitter

from kaudit.cpp import CppIndex, KernelLaunch
from kaudit.findings import Finding, Level, Precision
from kaudit.fix.edits import Edit, Fix, NoFix
from kaudit.geometry import (
    LaunchGeometry,
    LaunchRule,
    axis_index_name,
    grid_dim_name,
    remainder_text,
    show_value,
)
from kaudit.source import SourceModel, TritonLaunch

if TYPE_CHECKING:
    from kaudit.fix.editor import Editor


class FloorDividedGrid(LaunchRule):
    """A launch grid computed by rounding the size down, so the last partial block never runs.

    ## What it does
    Reports a CUDA `<<<grid, block>>>` or Triton `kernel[grid](...)` launch whose grid dimension
    is a plain floor division of a size by the number of elements each block covers: `n / 256`
    (C++ integer division), `n // BLOCK`, `int(n / BLOCK)`, `n >> 8`, `max(n // B, 1)`, also when
    the grid goes through variables (`int blocks = n / threads;`, `dim3 grid(n / 256)`,
    `grid = lambda meta: (n // meta["BLOCK"],)`). The divisor must equal the kernel's own
    per-block coverage (`blockIdx.x * blockDim.x + threadIdx.x` with that block size,
    `tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)` with that `BLOCK`), so the loss is provable.

    Not reported: any rounding term (`(n + B - 1) / B`, `cdiv`, `triton.cdiv`, `-(-n // B)`,
    `(n - 1) / B + 1`, `ceil`, `n / B + (n % B != 0)`, `if (n % B) blocks++`), a grid-stride or
    persistent loop in the kernel, a precondition `TORCH_CHECK(n % B == 0)`, `assert n % B == 0`
    or `if n % B: raise`, a numerator that is provably a multiple of the divisor (`blocks * 256`
    of 256, `x.numel() / x.size(-1)`: a tensor's element count is a multiple of each of its
    sizes), a divisor that is itself a dimension of the data (`x.numel() / d` with
    `d = gamma.numel()`, `n // (C * H * W)`: the grid counts rows, exact for any input of a
    consistent shape; `x.numel() / (4 * d)` is a block of four rows and is reported), and a
    second launch in the same host function that handles the tail. The divisor must be what each
    block covers of what the kernel stores: a grid `H // ks` whose blocks read a window
    `oh * ks + di` of the input but write one output row each (floor-mode pooling, whose output
    has exactly `H // ks` rows) drops only input the reference drops too. When the divisor cannot
    be tied to the kernel's output coverage the launch is left to KA207.

    ## Why is this bad?
    `n / 256` blocks of 256 threads cover `n - n % 256` elements; the rest of the output is never
    written. With `torch.empty` outputs the unwritten tail holds whatever the allocator handed
    back, often the reference's own result from the previous call, so the check passes on the
    benchmark's sizes and the kernel is reported faster than it is.

    ## Example
    ```python
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)

    class ModelNew(torch.nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            n = x.numel()
            relu_kernel[(n // 1024,)](x, y, n, BLOCK=1024)  # the last n % 1024 never run
            return y
    ```

    ## Fix
    `kaudit fix` rounds the division up where it is written (in the launch, or in the variable
    the grid comes from): `triton.cdiv(n, BLOCK)` in Python (through the file's own import of
    Triton, adding `import triton` if there is none), `(n + B - 1) / B` in C++/CUDA, edited inside
    the Python string that holds the code. The kernel then runs on the last partial block, so the
    fix is dropped when the kernel's stores are not guarded (KA204 would report them).
    """

    code = "KA201"
    name = "floor-divided-grid"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("launch-geometry", "correctness")

    def check_launch(self, model: SourceModel, launch: LaunchGeometry) -> Iterator[Finding]:
        for axis in range(max(launch.grid.explicit, 1)):
            dim = launch.dim(axis)
            if dim.kind != "floor" or dim.division is None or launch.covered_by_loop(axis):
                continue
            division = dim.division
            # the divisor must be what each program covers of the output: a pooling window
            # (`ih = oh * ks + di`) that is only read drops input, as floor-mode pooling does
            coverage = launch.coverage_matches(axis, division.den, output_only=True)
            if coverage is None or launch.has_precondition(division.den) \
                    or launch.tail_launch() is not None:
                continue
            named = f" (`{launch.grid.name}`)" if launch.grid.name else ""
            unit = "program" if launch.python else "block"
            yield self.report(
                model, launch.location,
                f"{grid_dim_name(launch, axis)} = {division.describe(launch.python)}{named} "
                f"drops {remainder_text(division)} elements: kernel `{launch.kernel_name}` "
                f"covers {show_value(coverage)} elements per {unit} along "
                f"{axis_index_name(launch, axis)}, and there is no rounding term, no "
                f"grid-stride loop, no `{remainder_text(division)} == 0` check and no tail launch",
                axis=axis, division=division.describe(launch.python))
            return

    def fix(self, editor: Editor, finding: Finding) -> Fix | None:
        model = editor.model
        axis = finding.metrics.get("axis", 0)
        described = finding.metrics.get("division", "")
        triton = next((launch for launch in model.triton_launches
                       if model.location(launch.call) == finding.location), None)
        if triton is not None:
            return _fix_python(editor, triton, axis, described)
        cuda = next((launch for launch in CppIndex.of(model).launches
                     if launch.unit.location(launch.node) == finding.location), None)
        if cuda is not None:
            return _fix_cuda(editor, cuda, axis, described)
        raise NoFix("the launch is no longer where it was reported")


# --- the fix: find the division the finding describes, then round it up ----------------------

_MAX_HOPS = 6  # names followed from the launch to the division (grid -> tuple -> blocks -> n // B)


def _pick(candidates: list, operands, described: str):
    """The candidate division the finding describes (`n // BLOCK`, `n / (threads * 4)`): the one
    whose numerator reads the same, and then its divisor too (the rule may show operands by
    their values: `n // 512` for `n // meta["BLOCK"]`); else the only division there is."""
    num, den = _split_division(described)
    scored = [(_same(b, den), c) for c in candidates for a, b in [operands(c)] if _same(a, num)]
    best = [c for exact, c in scored if exact] or [c for _, c in scored] or candidates
    if len(best) != 1:
        raise NoFix(f"`{described or 'the division'}` was not found as one division where the "
                    "grid is computed")
    return best[0]


def _split_division(described: str) -> tuple[str, str]:
    depth = 0
    for i, ch in enumerate(described):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        if depth == 0 and described.startswith((" // ", " / "), i):
            return described[:i], described[i:].split(" ", 2)[2]
    return described, ""


def _same(written: str, described: str) -> bool:
    def plain(text: str) -> str:
        text = "".join(text.split())
        while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
            text = text[1:-1]
        return text
    return plain(written) == plain(described)


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


# Python (Triton launches)


def _fix_python(editor: Editor, launch: TritonLaunch, axis: int, described: str) -> Fix:
    model = editor.model
    scope = _enclosing_function(model, launch.call)
    before = (launch.call.lineno, launch.call.col_offset)
    grid = _python_axis(model, scope, launch.grid, axis, before)
    if grid is None:
        raise NoFix("the grid is computed where kaudit does not follow it")
    candidates = _python_divisions(model, scope, grid, before, 0)

    def operands(node: ast.expr) -> tuple[str, str]:
        if isinstance(node, ast.Call):
            node = node.args[0]
        assert isinstance(node, ast.BinOp)
        if isinstance(node.op, ast.RShift):
            shift = node.right.value  # type: ignore[attr-defined]
            return model.code_of(node.left), str(1 << shift)
        return model.code_of(node.left), model.code_of(node.right)

    division = _pick(candidates, operands, described)
    cdiv, import_edits = editor.name_for("triton.cdiv")
    from kaudit.fix.editor import call  # libcst: the fix path only

    def rewrite(expression):
        if isinstance(division, ast.Call):  # int(n / B)
            expression = expression.args[0].value
        if isinstance(division.op if isinstance(division, ast.BinOp) else None, ast.RShift):
            import libcst as cst
            return call(cdiv, expression.left, cst.Integer(str(1 << division.right.value)))
        return call(cdiv, expression.left, expression.right)

    edit = editor.replace_expression(division, rewrite)
    return Fix(f"round the grid up: `{edit.replacement}`", (edit, *import_edits))


def _enclosing_function(model: SourceModel, node: ast.AST) -> ast.AST | None:
    line = node.lineno  # type: ignore[attr-defined]
    functions = [f for f in model.nodes if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and f.lineno <= line <= (f.end_lineno or f.lineno)]
    return max(functions, key=lambda f: f.lineno, default=None)


def _python_value(model: SourceModel, scope: ast.AST | None, name: str,
                  before: tuple[int, int]) -> ast.expr | None:
    """The expression last assigned to `name` before `before` in the function, else at module
    level (where all of it runs before any launch)."""
    for where in (scope, model.module):
        if where is None:
            continue
        local = where is scope
        nodes = ast.walk(where) if local else iter(model.module.body)  # type: ignore[union-attr]
        found = [node for node in nodes if isinstance(node, (ast.Assign, ast.AnnAssign))
                 and (not local or (node.lineno, node.col_offset) < before)
                 and node.value is not None
                 and [t.id for t in getattr(node, "targets", [getattr(node, "target", None)])
                      if isinstance(t, ast.Name)] == [name]]
        if found:
            return max(found, key=lambda n: (n.lineno, n.col_offset)).value
    return None


def _python_axis(model: SourceModel, scope: ast.AST | None, grid: ast.expr, axis: int,
                 before: tuple[int, int]) -> ast.expr | None:
    expr: ast.expr | None = grid
    for _ in range(_MAX_HOPS):
        if isinstance(expr, ast.Name):
            value = _python_value(model, scope, expr.id, before)
            function = model.functions.get(expr.id)
            if value is None and function is not None:  # def grid(meta): return (...)
                returns = [n for n in ast.walk(function) if isinstance(n, ast.Return) and n.value]
                value = returns[0].value if len(returns) == 1 else None
            expr = value
        elif isinstance(expr, ast.Lambda):
            expr = expr.body
        elif isinstance(expr, (ast.Tuple, ast.List)):
            return expr.elts[axis] if axis < len(expr.elts) else None
        else:
            return expr if axis == 0 else None
    return None


def _python_divisions(model: SourceModel, scope: ast.AST | None, expr: ast.expr,
                      before: tuple[int, int], hops: int) -> list[ast.expr]:
    found: list[ast.expr] = []
    for node in ast.walk(expr):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv) or \
                isinstance(node, ast.BinOp) and isinstance(node.op, ast.RShift) \
                and isinstance(node.right, ast.Constant) and type(node.right.value) is int or \
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "int" and len(node.args) == 1 and not node.keywords \
                and isinstance(node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Div):
            found.append(node)
    if hops < _MAX_HOPS:
        for node in ast.walk(expr):
            value = _python_value(model, scope, node.id, before) \
                if isinstance(node, ast.Name) else None
            if value is not None:
                found.extend(_python_divisions(model, scope, value, before, hops + 1))
    return found


# C++/CUDA (`<<<grid, block>>>` launches)

_PRIMARY = frozenset({"identifier", "number_literal", "call_expression", "field_expression",
                      "subscript_expression", "parenthesized_expression", "qualified_identifier",
                      "cast_expression"})
_ADDITIVE_OR_TIGHTER = frozenset({"*", "/", "%", "+", "-"})


def _fix_cuda(editor: Editor, launch: KernelLaunch, axis: int, described: str) -> Fix:
    unit = launch.unit
    if launch.function is None or not launch.config:
        raise NoFix("the launch is outside a host function")
    body = launch.function.body
    grid = _cuda_axis(launch, launch.config[0], axis)
    if grid is None or body is None:
        raise NoFix("the grid is computed where kaudit does not follow it")
    candidates = _cuda_divisions(launch, grid, 0)

    def operands(node: tree_sitter.Node) -> tuple[str, str]:
        return (unit.text_of(node.child_by_field_name("left")),
                _cuda_divisor_text(unit.text_of(node.child_by_field_name("right")),
                                   unit.text_of(node.child_by_field_name("operator"))))

    division = _pick(candidates, operands, described)
    left, right = division.child_by_field_name("left"), division.child_by_field_name("right")
    operator = unit.text_of(division.child_by_field_name("operator"))
    a = unit.text_of(left)
    if not (left.type in _PRIMARY or left.type == "binary_expression"
            and unit.text_of(left.child_by_field_name("operator")) in _ADDITIVE_OR_TIGHTER):
        a = f"({a})"
    b = unit.text_of(right)
    if operator == ">>":
        if not re.fullmatch(r"\d+", b):
            raise NoFix("the shift is not by a constant")
        rounded = f"({a} + {(1 << int(b)) - 1}) >> {b}"
    elif re.fullmatch(r"[1-9]\d*", b):
        rounded = f"({a} + {int(b) - 1}) / {b}"
    else:
        b = b if right.type in _PRIMARY else f"({b})"
        rounded = f"({a} + {b} - 1) / {b}"
    start, end = editor.cpp_span(unit, division)
    return Fix(f"round the grid up: `{rounded}`", (editor.cpp_edit(unit, start, end, rounded),))


def _cuda_divisor_text(text: str, operator: str) -> str:
    return str(1 << int(text)) if operator == ">>" and text.isdigit() else text


def _cuda_value(launch: KernelLaunch, name: str) -> tree_sitter.Node | None:
    """What `name` was last set to before the launch in its host function (`int blocks = ...`,
    `dim3 grid(...)`, `blocks = ...`)."""
    unit, body = launch.unit, launch.function.body  # type: ignore[union-attr]
    found = []
    for node in unit.walk(frozenset({"init_declarator", "assignment_expression"}), body):
        if node.start_byte >= launch.node.start_byte:
            continue
        target = node.child_by_field_name("declarator" if node.type == "init_declarator"
                                          else "left")
        value = node.child_by_field_name("value" if node.type == "init_declarator" else "right")
        operator = node.child_by_field_name("operator")
        if target is not None and target.type == "identifier" and unit.text_of(target) == name \
                and value is not None and (operator is None or unit.text_of(operator) == "="):
            found.append(value)
    return found[-1] if found else None


def _cuda_axis(launch: KernelLaunch, node: tree_sitter.Node | None, axis: int
               ) -> tree_sitter.Node | None:
    unit = launch.unit
    for _ in range(_MAX_HOPS):
        if node is None:
            return None
        if node.type == "identifier":
            node = _cuda_value(launch, unit.text_of(node))
        elif node.type == "call_expression" and "".join(unit.text_of(
                node.child_by_field_name("function")).split()) == "dim3":
            node = node.child_by_field_name("arguments")
        elif node.type in ("argument_list", "initializer_list"):
            values = node.named_children
            return values[axis] if axis < len(values) else None
        else:
            return node if axis == 0 else None
    return None


def _cuda_divisions(launch: KernelLaunch, expr: tree_sitter.Node, hops: int
                    ) -> list[tree_sitter.Node]:
    unit = launch.unit
    found = [node for node in unit.walk(frozenset({"binary_expression"}), expr)
             if unit.text_of(node.child_by_field_name("operator")) in ("/", ">>")]
    if hops < _MAX_HOPS:
        for node in unit.walk(frozenset({"identifier"}), expr):
            value = _cuda_value(launch, unit.text_of(node))
            if value is not None:
                found.extend(_cuda_divisions(launch, value, hops + 1))
    return found
