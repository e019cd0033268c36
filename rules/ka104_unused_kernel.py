from collections.abc import Iterable

from kaudit.findings import Finding, Level, Precision
from kaudit.graph import KernelGraph
from kaudit.rule import Rule
from kaudit.source import SourceModel


class UnusedKernel(Rule):
    """A kernel or compiled extension function that `ModelNew` never uses.

    ## What it does
    Reports, in the kernel graph, each `__global__` kernel and `@triton.jit` function that no path
    from `ModelNew.forward` (or `__init__`, or the `backward` of an autograd Function forward
    reaches) launches, and each compiled extension function (`functions=[...]` of `load_inline`,
    `m.def` bindings) that none of them calls.

    ## Why is this bad?
    A kernel that never runs proves nothing, but it makes a file look like a custom-kernel
    submission: checkers that only ask "is there a `__global__`?" are satisfied by an unused stub
    while PyTorch does the work. At best it is dead code that reviewers must read for nothing.

    ## Example
    ```python
    import torch
    from torch.utils.cpp_extension import load_inline

    ext = load_inline(name="relu", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                      cuda_sources="__global__ void relu_kernel(float* x, int n) {}",
                      functions=["relu"])

    class ModelNew(torch.nn.Module):
        def forward(self, x):
            return torch.clamp_min(x, 0.0)
    ```
    """

    code = "KA104"
    name = "unused-kernel"
    level = Level.WARNING
    precision = Precision.HIGH
    tags = ("fallback", "graph")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        graph = KernelGraph.of(model)
        if graph.forward is None:
            return
        used = graph.used()
        for node in graph.nodes_of_kind("kernel", "triton", "extension"):
            if node in used:
                continue
            kind = graph.graph.nodes[node]["kind"]
            what = {"kernel": "CUDA kernel", "triton": "Triton kernel",
                    "extension": "extension function"}[kind]
            verb = "calls" if kind == "extension" else "launches"
            yield self.report(model, graph.location(node),
                              f"{what} `{graph.label(node)}` is defined but nothing reachable from "
                              f"{model.entry_name} {verb} it")
