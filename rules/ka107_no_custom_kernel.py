from collections.abc import Iterable

from kaudit.findings import Finding, Level, Precision
from kaudit.graph import KERNEL_KINDS, KernelGraph
from kaudit.rule import Rule
from kaudit.source import SourceModel


class NoCustomKernel(Rule):
    """The file claims a custom kernel, but `forward` launches none.

    ## What it does
    Reports `ModelNew.forward` when the file defines custom code (a `load_inline`/`load`
    extension, a `__global__` kernel or a `@triton.jit` function) yet no path in the kernel graph
    from `forward` reaches a `__global__` kernel, a Triton launch or a `torch.ops` custom op: the
    extension functions it calls launch nothing (they only wrap ATen or cuBLAS), or the kernels
    exist only as stubs. Stays silent when part of the path cannot be seen (sources built at run
    time, extension functions whose C++ is not in the file).

    ## Why is this bad?
    This is the backend-presence check done right. A file with a `__global__` stub satisfies
    checkers that search for one, while every number it produces comes from PyTorch.

    ## Example
    ```python
    import torch
    from torch.utils.cpp_extension import load_inline

    ext = load_inline(name="mm", cpp_sources="torch::Tensor mm(torch::Tensor a, torch::Tensor b);",
                      cuda_sources='''
    __global__ void unused_stub() {}
    torch::Tensor mm(torch::Tensor a, torch::Tensor b) { return a.mm(b); }
    ''', functions=["mm"])

    class ModelNew(torch.nn.Module):
        def forward(self, a, b):
            return ext.mm(a, b)
    ```
    """

    code = "KA107"
    name = "no-custom-kernel"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("fallback", "graph")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        graph = KernelGraph.of(model)
        claims = [graph.label(n) for n in graph.nodes_of_kind("kernel", "triton", "extension")]
        if graph.forward is None or not claims or model.unresolved_sources:
            return
        reached = graph.reachable_from(graph.forward)
        if any(graph.graph.nodes[n]["kind"] in KERNEL_KINDS for n in reached):
            return
        called = [n for n in reached if graph.graph.nodes[n]["kind"] == "extension"]
        if any(not any(True for _ in graph.graph.successors(n)) for n in called):
            return  # an extension function whose C++ kaudit cannot see: undecided
        path = ", ".join(f"`{graph.label(n)}`" for n in sorted(called)) or "no extension function"
        yield self.report(model, model.header_location(graph.analysis.forward),
                          f"the file defines custom code ({', '.join(sorted(set(claims))[:4])}) but "
                          f"{model.entry_name} launches no kernel: it calls {path}")
