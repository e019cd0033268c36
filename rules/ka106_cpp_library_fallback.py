from collections.abc import Iterable

from kaudit.cpp_library import LibraryCall, library_calls
from kaudit.custom_work import CustomWork
from kaudit.findings import Finding, Level, Precision
from kaudit.graph import KernelGraph
from kaudit.rule import Rule
from kaudit.source import SourceModel


class CppLibraryFallback(Rule):
    """The extension's C++ host code computes with ATen, cuBLAS, cuDNN or Python.

    ## What it does
    Looks at the host (CPU-side) functions of the C++/CUDA sources handed to `load_inline` or
    `load` and reports calls that do the work with a library instead of a custom kernel:
    ATen/libtorch compute ops (`at::matmul`, `torch::mm`, `at::native::softmax`,
    `torch::nn::functional::linear`, `at::cuda::blas::gemm`, also through `namespace F = ...`
    aliases and `using namespace at;`), compute methods on values that are clearly tensors
    (`x.matmul(w)`, `y.sum()` where `x` is a `torch::Tensor` parameter or was built by an
    `at::`/`torch::` call), cuBLAS/cuBLASLt compute calls (`cublasSgemm`, `cublasGemmEx`,
    `cublasLtMatmul`), cuDNN compute calls (`cudnnConvolutionForward`, `cudnnSoftmaxForward`),
    cuFFT/cuSPARSE execution calls, and calls back into Python (`py::module_::import(...)`,
    `obj.attr("matmul")(...)`, calling a `py::object`, `PyObject_Call*`). Allocation and shape
    helpers (`torch::empty_like`, `zeros`, `view`, `reshape`, `contiguous`, `transpose`,
    `copy_`, `data_ptr`, `size`), `TORCH_CHECK`, `AT_DISPATCH_*`, stream and handle setup
    (`cublasCreate`, `cublasSetStream`, `cudnnCreate`) are not reported. Host functions that
    nothing reachable from `forward` or `__init__` calls, exported or not (KA104 lists them),
    and code run once at module import (the body of `PYBIND11_MODULE` outside its lambdas,
    namespace-scope initialisers), are not reported.

    Under the default `--policy kernelbench` the calls are errors only when no custom kernel on
    the forward path does real work: the extension wraps the library, and the kernels it
    launches, if any, only copy or fill. A bias add after the kernel, `torch::rsqrt` on
    statistics a kernel computed, or `losses.mean()` finishing a kernel's reduction are then a
    partial replacement, listed by KA108. Under `--policy strict` every call is an error.

    ## Why is this bad?
    The Python side looks clean -- `forward` calls only the compiled extension -- while the
    extension itself hands the real computation to cuBLAS, cuDNN or PyTorch. The claimed custom
    kernel is then either a decoy or a small part of the work, and the speedup is PyTorch's own.

    ## Example
    ```python
    from torch.utils.cpp_extension import load_inline

    source = '''
    #include <torch/extension.h>
    torch::Tensor fused_linear(torch::Tensor x, torch::Tensor w) {
        return at::matmul(x, w.t());
    }
    '''
    ext = load_inline(name="fused_linear", cpp_sources=source, functions=["fused_linear"])

    class ModelNew(nn.Module):
        def forward(self, x, w):
            return ext.fused_linear(x, w)
    ```
    """

    code = "KA106"
    name = "cpp-library-fallback"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("fallback", "correctness", "cpp")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        calls = _running(model, library_calls(model))
        if not calls:
            return
        why = ""
        if model.policy == "kernelbench":
            work = CustomWork.of(model)
            if work.real_work:
                return  # a partial replacement: KA108 lists what stays in the library
            why = f" ({work.describe()})"
        for call in calls:
            yield self.report(model, call.call.unit.location(call.call.node),
                              f"{call.place} computes with {call.evidence} instead of a custom "
                              f"kernel{why}", category=call.category)


def _running(model: SourceModel, calls: list[LibraryCall]) -> list[LibraryCall]:
    """The calls whose host function can run: reached from the entry point, `__init__` or a
    `backward`. An exported function nothing calls (KA104's finding) replaces nothing; code the
    kernel graph does not hold (`PYBIND11_MODULE` lambdas) counts."""
    if not calls:
        return []
    graph = KernelGraph.of(model)
    if graph.forward is None:
        return calls
    used = graph.used()
    return [call for call in calls if call.call.function is None
            or f"cpp:{call.call.function.name}" not in graph.graph
            or f"cpp:{call.call.function.name}" in used]
