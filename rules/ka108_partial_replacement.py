from collections.abc import Iterable

from kaudit.cpp_library import library_calls
from kaudit.custom_work import CustomWork
from kaudit.findings import Finding, Level, Precision
from kaudit.forward import ForwardAnalysis, OpKind
from kaudit.rule import Rule
from kaudit.source import SourceModel

_SHOWN = 6


class PartialReplacement(Rule):
    """Custom kernels do part of the work and PyTorch or a library does the rest.

    ## What it does
    Under the default `--policy kernelbench`, when a custom kernel on the forward path does real
    work (it computes with what it loads, rather than only copying or filling), lists the PyTorch
    compute ops that remain on the forward path (what KA101 would report) and the ATen, cuBLAS or
    cuDNN calls in the extension's host code (what KA106 would report), in one finding on
    `ModelNew.forward`. Under `--policy strict` those ops are KA101 and KA106 errors instead, and
    this rule stays silent.

    ## Why is this bad?
    It is not a cheat: KernelBench's prompt lets a submission replace some operators and keep the
    rest, and a level-2 kernel that leaves the convolution to cuDNN and fuses the epilogue is
    honest. But the speedup then belongs partly to PyTorch, and a reader comparing kernels should
    know which part was replaced. The kernel's verdict is `suspicious`, not `trusted`.

    ## Example
    ```python
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def bias_relu_kernel(x_ptr, b_ptr, y_ptr, n, C, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        b = tl.load(b_ptr + offs % C, mask=mask)
        tl.store(y_ptr + offs, tl.maximum(x + b, 0.0), mask=mask)

    class ModelNew(torch.nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.linear = torch.nn.Linear(n_in, n_out, bias=False)  # kept in cuBLAS
            self.bias = torch.nn.Parameter(torch.zeros(n_out))

        def forward(self, x):
            y = self.linear(x)
            out = torch.empty_like(y)
            bias_relu_kernel[(triton.cdiv(y.numel(), 1024),)](
                y, self.bias, out, y.numel(), y.shape[-1], BLOCK=1024)
            return out
    ```
    """

    code = "KA108"
    name = "partial-replacement"
    level = Level.WARNING
    precision = Precision.HIGH
    tags = ("fallback", "policy")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        analysis = ForwardAnalysis.of(model)
        if model.policy != "kernelbench" or analysis.forward is None \
                or not CustomWork.of(model).real_work:
            return
        remaining: dict[str, int] = {}
        for function in analysis.reachable:
            for op in analysis.function_ops(function):
                if op.kind is OpKind.REFERENCE_OP:
                    remaining.setdefault(op.description, model.line_of(op.node))
        for call in library_calls(model):
            line = call.call.unit.location(call.call.node).line
            remaining.setdefault(f"{call.evidence} in {call.place}", line)
        if not remaining:
            return
        # in source order: the order they were found in varied between identical files
        ordered = sorted(remaining.items(), key=lambda item: (item[1], item[0]))
        shown = [f"{description} (line {line})" for description, line in ordered[:_SHOWN]]
        more = f" and {len(remaining) - _SHOWN} more" if len(remaining) > _SHOWN else ""
        yield self.report(model, model.header_location(analysis.forward),
                          f"custom kernels do part of the work; {len(remaining)} library op(s) "
                          f"remain on the forward path: {'; '.join(shown)}{more}",
                          ops=[description for description, _ in ordered])
