from collections.abc import Iterable

from kaudit.dataflow import Source, forward_flows
from kaudit.findings import Finding, Level, Precision
from kaudit.forward import ForwardAnalysis, OpKind
from kaudit.rule import Rule
from kaudit.source import SourceModel


class OutputNotFromKernel(Rule):
    """The tensor `forward` returns is not produced by a custom kernel.

    ## What it does
    Follows each `return` of `ModelNew.forward` back through assignments, views and helpers to the
    calls that produced it. When `forward` runs a custom kernel but no return depends on its
    output, it reports the returns: the value comes from PyTorch ops on the inputs alone, the
    custom result was overwritten or cancelled out (`c + (torch.matmul(a, b) - c)`), or the
    returned buffer is a fresh allocation (`torch.empty_like`) that no kernel is given to write.
    A PyTorch op applied to the kernel's output is KA101's finding, not this one.

    ## Why is this bad?
    The kernel runs, so "does it launch a kernel?" checks pass, yet the answer the harness compares
    is PyTorch's, or whatever memory the allocator hands back: an `empty_like` buffer often still
    holds the reference's result from the previous call.

    ## Example
    ```python
    import torch
    from torch.utils.cpp_extension import load_inline

    ext = load_inline(name="mm", cpp_sources=MM_DECLARATION, cuda_sources=MM_KERNEL,
                      functions=["matmul_cuda"])

    class ModelNew(torch.nn.Module):
        def forward(self, a, b):
            c = ext.matmul_cuda(a, b)
            return c + (torch.matmul(a, b) - c)  # the kernel's result cancels out
    ```
    """

    code = "KA105"
    name = "output-not-from-kernel"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("fallback", "dataflow", "correctness")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        analysis = ForwardAnalysis.of(model)
        if analysis.forward is None:
            return
        if OpKind.CUSTOM_KERNEL not in analysis.kinds_reached(analysis.forward.body, analysis.model_new):
            return  # no kernel runs at all: KA101/KA107 say so
        flows = forward_flows(analysis)
        if not flows or not all(flow.bypassing for flow in flows):
            return  # some path returns the kernel's result; other paths are KA102's business
        for flow in flows:
            producer = flow.bypassing[0]
            line = model.line_of(producer.node)
            if producer.source is Source.UNWRITTEN:
                message = (f"forward returns {producer.description} (line {line}), a buffer no "
                           "custom kernel writes: its contents are whatever the allocator left")
            else:
                message = (f"forward returns the result of {producer.description} (line {line}), "
                           "not of a custom kernel")
            yield self.report(model, flow.statement, message)
