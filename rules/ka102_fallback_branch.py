from collections.abc import Iterable, Sequence

import libcst as cst

from kaudit.findings import Finding, Level, Precision
from kaudit.forward import REFERENCE_KINDS, ForwardAnalysis, OpKind
from kaudit.rule import Rule
from kaudit.source import SourceModel


class FallbackBranch(Rule):
    """A `try`/`except` or `if`/`else` on a forward path whose other branch runs the reference.

    ## What it does
    Reports an `except` clause on a forward path whose handler runs a PyTorch compute op or the
    reference model, and an `if`/`elif` (or `a if c else b`) where one branch runs the reference
    without any custom kernel while the other branch (or, after an early `return`, the rest of
    the function) calls the custom kernel. Helpers are followed. A `try` around `load_inline` that
    re-raises, or a handler that only logs, is not reported.

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
            branches = _Branches()
            function.body.visit(branches)
            for handler in branches.handlers:
                ops = analysis.reference_ops_reached(handler.body, owner)
                if ops:
                    yield self.report(
                        model, handler,
                        f"this `except` falls back to {ops[0].description} "
                        f"(line {model.line_of(ops[0].node)}) when the custom path raises")
            for node, first, second in branches.alternatives:
                finding = self._judge(model, analysis, owner, node, first, second)
                if finding is not None:
                    yield finding

    def _judge(self, model: SourceModel, analysis: ForwardAnalysis, owner: cst.ClassDef | None,
               node: cst.CSTNode, first: Sequence[cst.CSTNode],
               second: Sequence[cst.CSTNode]) -> Finding | None:
        kinds = [_kinds(analysis, owner, first), _kinds(analysis, owner, second)]
        for fallback, custom in ((0, 1), (1, 0)):
            if kinds[fallback] & REFERENCE_KINDS and OpKind.CUSTOM_KERNEL not in kinds[fallback] \
                    and OpKind.CUSTOM_KERNEL in kinds[custom]:
                branch = (first, second)[fallback]
                ops = [op for part in branch for op in analysis.reference_ops_reached(part, owner)]
                which = "taken" if fallback == 0 else "not taken"
                return self.report(
                    model, node,
                    f"when this condition is {which}, the reference runs instead of the custom "
                    f"kernel: {ops[0].description} (line {model.line_of(ops[0].node)})")
        return None


def _kinds(analysis: ForwardAnalysis, owner: cst.ClassDef | None,
           nodes: Sequence[cst.CSTNode]) -> set[OpKind]:
    kinds: set[OpKind] = set()
    for node in nodes:
        kinds |= analysis.kinds_reached(node, owner)
    return kinds


def _ends_control(body: cst.BaseSuite) -> bool:
    """True when a block always leaves the function (its last statement returns or raises)."""
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    if not statements:
        return False
    last = statements[-1]
    if isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return bool(last.body) and isinstance(last.body[-1], (cst.Return, cst.Raise))
    return False


class _Branches(cst.CSTVisitor):
    """Collects except handlers and the two alternatives of each conditional in a function body."""

    def __init__(self) -> None:
        self.handlers: list[cst.ExceptHandler | cst.ExceptStarHandler] = []
        self.alternatives: list[tuple[cst.CSTNode, Sequence[cst.CSTNode], Sequence[cst.CSTNode]]] = []
        self._continuation: dict[cst.If, Sequence[cst.CSTNode]] = {}

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        for i, statement in enumerate(node.body):
            if isinstance(statement, cst.If):
                self._continuation[statement] = node.body[i + 1:]

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        self.handlers.append(node)

    def visit_ExceptStarHandler(self, node: cst.ExceptStarHandler) -> None:
        self.handlers.append(node)

    def visit_If(self, node: cst.If) -> None:
        if node.orelse is not None:
            other = node.orelse.body if isinstance(node.orelse, cst.Else) else node.orelse
            self.alternatives.append((node, [node.body], [other]))
        elif _ends_control(node.body) and node in self._continuation:
            self.alternatives.append((node, [node.body], self._continuation[node]))

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self.alternatives.append((node, [node.body], [node.orelse]))
