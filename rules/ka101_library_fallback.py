from collections.abc import Iterable

from kaudit.custom_work import CustomWork
from kaudit.findings import Finding, Level, Precision
from kaudit.forward import ForwardAnalysis, OpKind
from kaudit.rule import Rule
from kaudit.source import SourceModel


class LibraryFallback(Rule):
    """`ModelNew.forward` computes with PyTorch instead of the custom kernel.

    ## What it does
    Follows `ModelNew.forward` and every helper it calls (methods, module functions,
    `autograd.Function.apply`, submodules defined in the file, modules kept in attributes,
    `nn.Sequential`/`ModuleList`/`ModuleDict` containers and loops over them, `getattr`) and
    reports each PyTorch compute op found there: `torch.*` and `torch.nn.functional.*` calls
    under any import alias, `torch.ops.aten.*`, `nn` compute modules (also inside containers,
    behind `torch.jit.script`, or taken from a reference `Model` instance), models from libraries
    such as transformers, compute tensor methods such as `.matmul()` or `.softmax()`, the `@`
    operator and arithmetic operators on tensors (`A.unsqueeze(1) * B`). Allocation, shape and
    view operations (`torch.empty_like`, `zeros`, `view`, `reshape`, `contiguous`, `cat`) are not
    reported, nor are calls into the compiled extension or Triton.

    Under the default `--policy kernelbench`, KernelBench's rule applies: a submission may keep
    some operators in PyTorch when its custom kernels do real work, and then KA108 lists what
    remains. This rule reports the ops only when no custom kernel on the forward path computes:
    none runs, or the ones that run only copy, view or fill (`out[i] = in[i]`, a concatenation,
    `out[i] = 0`). Under `--policy strict` every PyTorch compute op on the forward path is
    reported.

    ## Why is this bad?
    The speedup claimed for a custom kernel is meaningless when PyTorch (cuBLAS, cuDNN) does the
    work: the candidate is then the reference, or part of it, timed under another name. A kernel
    that only copies the result of a PyTorch op into place is a decoy.

    ## Example
    ```python
    import torch
    import torch.nn.functional as fn
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    class ModelNew(torch.nn.Module):
        def forward(self, x):
            y = fn.softmax(x, dim=-1)  # the softmax the kernel claims to implement
            out = torch.empty_like(y)
            copy_kernel[(triton.cdiv(y.numel(), 1024),)](y, out, y.numel(), BLOCK=1024)
            return out
    ```
    """

    code = "KA101"
    name = "library-fallback"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("fallback", "correctness")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        analysis = ForwardAnalysis.of(model)
        why = ""
        if model.policy == "kernelbench" and analysis.reachable:
            work = CustomWork.of(model)
            if work.real_work:
                return  # a partial replacement: KA108 lists what stays in PyTorch
            why = f" ({work.describe()})"
        for function in analysis.reachable:
            owner = analysis.class_of(function)
            name = f"{owner.name}.{function.name}" if owner is not None else function.name
            place = (model.entry_name if function is analysis.forward
                     else f"`{name}` (reached from {model.entry_name})")
            for op in analysis.function_ops(function):
                if op.kind is OpKind.REFERENCE_OP:
                    yield self.report(model, op.node,
                                      f"{place} computes with {op.description}, a PyTorch op, "
                                      f"instead of a custom kernel{why}")
