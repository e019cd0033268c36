import ast
from collections.abc import Iterable

from kaudit.branches import exclusive_alternatives, guard_note
from kaudit.findings import Finding, Level, Precision
from kaudit.forward import REFERENCE_KINDS, ForwardAnalysis, OpKind, walk_code
from kaudit.rule import Rule
from kaudit.source import SourceModel


class FallbackBranch(Rule):
    """A `try`/`except` or `if`/`else` on a forward path whose other branch runs the reference.

    ## What it does
    Reports an `except` clause on a forward path whose handler runs a PyTorch compute op or the
    reference model, and an `if`/`elif` (or `a if c else b`) where one branch runs the reference
    without any custom kernel while the other branch (or, after an early `return`, the rest of
    the function) calls the custom kernel. Helpers are followed, and so are extension handles set
    in `__init__` (also inside `try`, with `None` in the `except`); a fallback written with
    operators (`a * b`) counts, and so does a handler that swallows the error (`except: pass`,
    or a log line) when the `try` returns the kernel's answer and the code after it runs the
    reference. A `try` whose body computes with PyTorch and reaches no custom kernel has no
    custom path to fall back from (KA101 reports it). A `try` around `load_inline` that
    re-raises, a handler that logs and re-raises, a condition on a loop's position (`if i ==
    len(self.layers) - 1:` choosing `torch.mm` for the last layer) and one on the type of a
    loop's item (`for layer in self.body:` with `if isinstance(layer, nn.ReLU):` sending only the
    ReLUs to the kernel) are not reported: under `--policy kernelbench` KA108 lists what stays in
    PyTorch.

    A branch taken only for inputs a benchmark does not give is a warning, not an error: a guard
    on the device (`if not x.is_cuda:`, `x.device.type == "cpu"`), on the dtype (the `else` of
    `if x.dtype == torch.float32:`), or on an empty input (`x.numel() == 0`, `len(dim) == 0`).
    So is one that only pins the input's rank (`len(x.shape) == 3`, `x.dim() == 3`) or the axis
    the kernel reduces over (`dim == 1`, `self.dim == 1`), where the kernel does the problem's
    work and PyTorch covers the other ranks and axes a general module accepts: the benchmark's
    problem fixes both. The dynamic pass shows whether the kernel ran on the benchmark's inputs
    (KD601, KD602); a condition on sizes (`if n < 32:`) stays an error, since the benchmark's sizes
    may take it.

    ## Why is this bad?
    The custom kernel may fail to build, raise, or be skipped for the benchmark's device, dtype
    or shape, and the reference quietly produces the answer. The submission then passes every
    correctness check while its kernel never ran.

    ## Example
    ```python
    class ModelNew(nn.Module):
        def forward(self, a, b):
            try:
                return ext.matmul_cuda(a, b)
            except RuntimeError:
                return torch.matmul(a, b)
    ```
    """

    code = "KA102"
    name = "fallback-branch"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("fallback", "correctness")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        analysis = ForwardAnalysis.of(model)
        for function in analysis.reachable:
            owner = analysis.owner.get(function)
            for node in walk_code(function.body):
                if isinstance(node, ast.ExceptHandler):
                    path = _enclosing(function.body, node, [])
                    tried: set[OpKind] = set()  # what the `try` of this handler reaches
                    if path:
                        block, index = path[-1]
                        tried = analysis.kinds_reached(block[index].body, owner)
                    if tried & REFERENCE_KINDS and OpKind.CUSTOM_KERNEL not in tried:
                        continue  # PyTorch in both: no custom path to fall back from (KA101's)
                    ops = analysis.reference_ops_reached(node.body, owner)
                    after = "" if ops else " after it"
                    later = _after_swallowed(path, node)
                    if not ops and later is not None and OpKind.CUSTOM_KERNEL in tried:
                        # `except: pass`, and the reference after the `try`
                        ops = analysis.reference_ops_reached(later, owner)
                    if ops:
                        yield self.report(
                            model, model.header_location(node),
                            f"this `except` falls back to {ops[0].description} "
                            f"(line {model.line_of(ops[0].node)}){after} when the custom path "
                            "raises")
            for node, first, second in exclusive_alternatives(function.body):
                if _loop_position(node, function) or _layer_type_dispatch(node, function):
                    continue  # the last layer of a loop, or each layer by its type: by design
                kinds = (analysis.kinds_reached(first, owner), analysis.kinds_reached(second, owner))
                for fallback in (0, 1):
                    if kinds[fallback] & REFERENCE_KINDS \
                            and OpKind.CUSTOM_KERNEL not in kinds[fallback] \
                            and OpKind.CUSTOM_KERNEL in kinds[1 - fallback]:
                        ops = analysis.reference_ops_reached((first, second)[fallback], owner)
                        which = "holds" if fallback == 0 else "fails"
                        where = model.header_location(node) if isinstance(node, ast.If) else node
                        guard = _guard(node)
                        yield self.report(
                            model, where,
                            f"when this condition {which}, the reference runs instead of the "
                            f"custom kernel: {ops[0].description} (line {model.line_of(ops[0].node)})"
                            + (guard_note(guard) if guard else ""),
                            level=Level.WARNING if guard else None)
                        break


def _after_swallowed(path: list[tuple[list[ast.stmt], int]] | None,
                     handler: ast.ExceptHandler) -> list[ast.stmt] | None:
    """What runs after the `try` at the end of `path` (from `_enclosing`), when its handler lets
    the function go on (no return, raise, continue or break in it) while the `try` returns its
    answer: the statements after the `try` in its block and in every block around it. None
    otherwise."""
    if path is None:
        return None
    block, index = path[-1]
    escapes = (ast.Return, ast.Raise, ast.Continue, ast.Break)
    if any(isinstance(node, escapes) for node in walk_code(handler.body)) or \
            not any(isinstance(statement, ast.Return) for statement in block[index].body):
        return None
    return [statement for block, index in reversed(path) for statement in block[index + 1:]]


def _enclosing(body: list[ast.stmt], handler: ast.ExceptHandler,
               path: list[tuple[list[ast.stmt], int]]) -> list[tuple[list[ast.stmt], int]] | None:
    """(block, index) from the function's body down to the `try` holding `handler`."""
    for index, statement in enumerate(body):
        if isinstance(statement, ast.Try) and handler in statement.handlers:
            return [*path, (body, index)]
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        blocks = [getattr(statement, name) for name in ("body", "orelse", "finalbody")
                  if isinstance(getattr(statement, name, None), list)]
        blocks += [inner.body for inner in getattr(statement, "handlers", [])]
        for block in blocks:
            found = _enclosing(block, handler, [*path, (body, index)])
            if found is not None:
                return found
    return None


_DEVICE_ATTRIBUTES = frozenset({"is_cuda", "is_cpu", "device", "is_available"})
_EMPTY_PROBES = frozenset({"numel", "nelement", "dim", "ndimension", "ndim", "len"})
_RANK_METHODS = frozenset({"dim", "ndimension"})
_AXES = frozenset({"dim", "axis"})


def _guard(node: ast.AST) -> str | None:
    """What the branch's condition tests when it is only a guard: "device", "dtype",
    "emptiness", "rank" or "axis" (every part of an `and`/`or`); None when any part tests
    something else (sizes, flags, values)."""
    test = getattr(node, "test", None)
    return None if test is None else _guard_kind(test)


def _guard_kind(test: ast.AST) -> str | None:
    if isinstance(test, ast.BoolOp):
        kinds = [_guard_kind(value) for value in test.values]
        return kinds[0] if None not in kinds else None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _guard_kind(test.operand)
    names = {n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)} | \
        {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    if names & _DEVICE_ATTRIBUTES:
        return "device"
    if "dtype" in names:
        return "dtype"
    if names & _EMPTY_PROBES and isinstance(test, ast.Compare) and \
            isinstance(test.comparators[-1], ast.Constant) and test.comparators[-1].value == 0 \
            and isinstance(test.ops[-1], (ast.Eq, ast.LtE)):
        return "emptiness"
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and \
            isinstance(test.ops[0], (ast.Eq, ast.NotEq)) and \
            isinstance(test.comparators[0], ast.Constant) and \
            type(test.comparators[0].value) is int:
        if _is_rank(test.left):
            return "rank"
        if _axis_name(test.left) in _AXES:
            return "axis"
    return None


def _is_rank(node: ast.AST) -> bool:
    """`len(x.shape)`, `len(x.size())`, `x.dim()`, `x.ndimension()`, `x.ndim`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "ndim"
    if not isinstance(node, ast.Call):
        return False
    if isinstance(node.func, ast.Attribute):
        return node.func.attr in _RANK_METHODS and not node.args
    if isinstance(node.func, ast.Name) and node.func.id == "len" and len(node.args) == 1:
        inner = node.args[0]
        inner = inner.func if isinstance(inner, ast.Call) and not inner.args else inner
        return isinstance(inner, ast.Attribute) and inner.attr in ("shape", "size")
    return False


def _axis_name(node: ast.AST) -> str | None:
    """`dim` of `dim == 1`, or of `self.dim == 1`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
            node.value.id == "self":
        return node.attr
    return None


def _loop_targets(node: ast.AST, function: ast.AST) -> set[str]:
    """The names the loops around `node` bind (`i`, `layer` of `for i, layer in ...`)."""
    found: set[str] = set()
    for loop in ast.walk(function):
        if isinstance(loop, (ast.For, ast.AsyncFor)) and any(
                inner is node for statement in loop.body for inner in ast.walk(statement)):
            found.update(n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name))
    return found


def _layer_type_dispatch(node: ast.AST, function: ast.AST) -> bool:
    """The condition only asks the type of a loop's item (`if isinstance(layer, nn.ReLU):` in
    `for layer in self.body:`): the loop sends each kind of layer its own way, and the other
    branch runs the layers the kernel does not replace, not the ones it does (KA108 lists those)."""
    test = getattr(node, "test", None)
    items = _loop_targets(node, function)
    if test is None or not items:
        return False
    parts = test.values if isinstance(test, ast.BoolOp) else [test]
    return all(_asks_type(part.operand if isinstance(part, ast.UnaryOp) and
                          isinstance(part.op, ast.Not) else part, items) for part in parts)


def _asks_type(test: ast.AST, items: set[str]) -> bool:
    """`isinstance(item, T)`, `type(item) is T` (or `==`, `is not`, `!=`)."""
    def is_item(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id in items

    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and \
            test.func.id == "isinstance" and len(test.args) == 2:
        return is_item(test.args[0])
    return isinstance(test, ast.Compare) and len(test.ops) == 1 and \
        isinstance(test.ops[0], (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)) and \
        isinstance(test.left, ast.Call) and isinstance(test.left.func, ast.Name) and \
        test.left.func.id == "type" and len(test.left.args) == 1 and is_item(test.left.args[0])


def _loop_position(node: ast.AST, function: ast.AST) -> bool:
    """The condition depends only on the counters of the loops around it (`i == n - 1`,
    `is_last = i == len(self.layers) - 1`)."""
    test = getattr(node, "test", None)
    if test is None:
        return False
    counters = _loop_targets(node, function)
    if not counters:
        return False
    neutral = {"self", "len", "range", "min", "max", "abs"}
    derived = set(counters)
    assignments = [(t.id, n.value) for n in ast.walk(function) if isinstance(n, ast.Assign)
                   for t in n.targets if isinstance(t, ast.Name)]
    for _ in range(3):
        for name, value in assignments:
            names = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)} - neutral
            if names and names <= derived:
                derived.add(name)
    used = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)} - neutral
    probes = [n for n in ast.walk(test) if isinstance(n, ast.Attribute)
              and not (isinstance(n.value, ast.Name) and n.value.id == "self")]
    return bool(used) and used <= derived and not probes  # `chunk.is_cuda` is a device test
