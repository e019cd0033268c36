from collections.abc import Iterable

from kaudit.findings import Finding, Level, Precision
from kaudit.forward import ForwardAnalysis, OpKind
from kaudit.rule import Rule
from kaudit.source import SourceModel


class LibraryFallback(Rule):
    """`ModelNew.forward` computes with PyTorch instead of the custom kernel.

    ## What it does
    Follows `ModelNew.forward` and every helper it calls (methods, module functions,
    `autograd.Function.apply`, submodules defined in the file) and reports each PyTorch compute
    op found there: `torch.*` and `torch.nn.functional.*` calls under any import alias, `nn`
    compute modules built in `__init__` and called in `forward` (also inside `nn.Sequential`),
    compute tensor methods such as `.matmul()` or `.softmax()`, and the `@` operator.
    Allocation, shape and view operations (`torch.empty_like`, `zeros`, `view`, `reshape`,
    `contiguous`, `cat`) are not reported, nor are calls into the compiled extension or Triton.

    ## Why is this bad?
    The speedup claimed for a custom kernel is meaningless when PyTorch (cuBLAS, cuDNN) does the
    work: the candidate is then the reference, or part of it, timed under another name.

    ## Example
    ```python
    import torch.nn.functional as fn

    class ModelNew(nn.Module):
        def forward(self, x):
            y = ext.scale_cuda(x, 2.0)
            return fn.softmax(y, dim=-1)  # the softmax the kernel claims to implement
    ```
    """

    code = "KA101"
    name = "library-fallback"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("fallback", "correctness")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        analysis = ForwardAnalysis.of(model)
        for function in analysis.reachable:
            place = (model.entry_name if function is analysis.forward
                     else f"`{function.name}` (reached from {model.entry_name})")
            for op in analysis.function_ops(function):
                if op.kind is OpKind.REFERENCE_OP:
                    yield self.report(model, op.node,
                                      f"{place} computes with {op.description}, a PyTorch op, "
                                      "instead of a custom kernel")
