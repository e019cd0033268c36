import ast
from collections.abc import Iterable

from kaudit.branches import exclusive_alternatives
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
            for node in walk_code(function.body):
                if isinstance(node, ast.ExceptHandler):
                    ops = analysis.reference_ops_reached(node.body, owner)
                    if ops:
                        yield self.report(
                            model, model.header_location(node),
                            f"this `except` falls back to {ops[0].description} "
                            f"(line {model.line_of(ops[0].node)}) when the custom path raises")
            for node, first, second in exclusive_alternatives(function.body):
                kinds = (analysis.kinds_reached(first, owner), analysis.kinds_reached(second, owner))
                for fallback in (0, 1):
                    if kinds[fallback] & REFERENCE_KINDS \
                            and OpKind.CUSTOM_KERNEL not in kinds[fallback] \
                            and OpKind.CUSTOM_KERNEL in kinds[1 - fallback]:
                        ops = analysis.reference_ops_reached((first, second)[fallback], owner)
                        which = "holds" if fallback == 0 else "fails"
                        where = model.header_location(node) if isinstance(node, ast.If) else node
                        yield self.report(
                            model, where,
                            f"when this condition {which}, the reference runs instead of the "
                            f"custom kernel: {ops[0].description} (line {model.line_of(ops[0].node)})")
                        break
