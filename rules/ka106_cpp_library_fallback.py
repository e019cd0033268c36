import re
from collections.abc import Iterable

from kaudit.branches import guard_note
from kaudit.cpp import CppIndex
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
    partial replacement, listed by KA108. A library call on a branch that returns before any
    kernel of its host function runs (`if (cols > 1024) return torch::argmin(x, -1);`, `else
    return torch::max(...)`) is still an error: there the library answers instead of the kernel;
    a warning when the branch is only a guard no benchmark input takes, as in KA102 (`if
    (!x.is_cuda())`, a dtype test, `x.numel() == 0`). Under `--policy strict` every call is an
    error.

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
        reasons = {id(call): "" for call in calls}
        guards: dict[int, str] = {}  # calls on a branch only a guard chooses (warnings)
        if model.policy == "kernelbench":
            work = CustomWork.of(model)
            if work.real_work:
                # a partial replacement (KA108 lists what stays in the library), except where
                # the library answers on a branch that returns before the kernel would run
                branches = {id(call): _instead_of_kernel(model, call) for call in calls}
                reasons = {key: " (on a branch that returns it without launching the function's "
                                "kernel: a fallback, not an epilogue)"
                           for key, branch in branches.items() if branch is not None}
                guards = {key: kind for key, branch in branches.items()
                          if branch is not None and (kind := _guard(branch))}
            else:
                reasons = {id(call): f" ({work.describe()})" for call in calls}
        for call in calls:
            if id(call) not in reasons:
                continue
            guard = guards.get(id(call))
            yield self.report(model, call.call.unit.location(call.call.node),
                              f"{call.place} computes with {call.evidence} instead of a custom "
                              f"kernel{reasons[id(call)]}" + (guard_note(guard) if guard else ""),
                              level=Level.WARNING if guard else None, category=call.category)


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


_DEVICE = re.compile(r"\b(?:is_cuda|is_cpu|device|device_type|get_device)\b")
_DTYPE = re.compile(r"\b(?:scalar_type|dtype|ScalarType|kFloat\w*|kHalf|kBFloat16|kDouble)\b")
_EMPTY = re.compile(r"^\(?\s*[\w.>-]+(?:\.|->)(?:numel|size|dim)\(\s*\d*\s*\)\s*==\s*0\s*\)?$")


def _guard(branch) -> str | None:
    """What the `if` choosing the fallback tests when it is only a guard (KA102's kinds):
    "device", "dtype" or "emptiness"; None for sizes, flags and anything else."""
    condition = branch.child_by_field_name("condition")
    text = (condition.text or b"").decode("utf-8", "replace").strip() if condition else ""
    text = text.removeprefix("(").removesuffix(")").strip()
    parts = [part.strip() for part in re.split(r"&&|\|\|", text)]
    kinds = {"device" if _DEVICE.search(part) else "dtype" if _DTYPE.search(part)
             else "emptiness" if _EMPTY.match(part.lstrip("!")) else None for part in parts}
    return None if None in kinds or len(kinds) != 1 else kinds.pop()


def _instead_of_kernel(model: SourceModel, call: LibraryCall):
    """The `if` whose branch holds the call, when that branch returns and launches nothing, in a
    host function that launches a kernel on its other paths: `if (n > 1024) return
    torch::argmin(x, dim);`, `else { return torch::max(x, dim).values; }`; else None."""
    function = call.call.function
    if function is None or function.body is None:
        return None
    graph = KernelGraph.of(model)
    if not _reaches_kernel(graph, function.name):
        return None
    body = _span(function.body)
    child, parent = call.call.node, call.call.node.parent
    while parent is not None and _span(parent) != body:
        if parent.type == "if_statement" and child.type != "condition_clause" \
                and _span(child) != _span(parent.child_by_field_name("condition")):
            # a kernel launched before the `if` (chain) ran on this path too: an epilogue
            top = parent
            while top.parent is not None and top.parent.type == "else_clause" \
                    and top.parent.parent is not None and top.parent.parent.type == "if_statement":
                top = top.parent.parent
            before = (body[0], top.start_byte)  # type: ignore[index]
            taken = _returns(child) and not _launches(model, graph, _span(child)) \
                and not _launches(model, graph, before)
            return parent if taken else None
        child, parent = parent, parent.parent
    return None


def _span(node) -> tuple[int, int] | None:
    return None if node is None else (node.start_byte, node.end_byte)


def _reaches_kernel(graph: KernelGraph, host: str) -> bool:
    return any(graph.graph.nodes[node]["kind"] == "kernel"
               for node in graph.reachable_from(f"cpp:{host}"))


def _returns(branch) -> bool:
    stack = [branch]
    while stack:
        node = stack.pop()
        if node.type == "return_statement":
            return True
        if node.type != "lambda_expression":
            stack.extend(node.children)
    return False


def _launches(model: SourceModel, graph: KernelGraph, inside: tuple[int, int]) -> bool:
    """The code between two offsets launches a kernel or calls a host function that does."""
    index = CppIndex.of(model)

    def within(node) -> bool:
        return inside[0] <= node.start_byte and node.end_byte <= inside[1]

    return any(within(launch.node) for launch in index.launches) or any(
        within(other.node) and _reaches_kernel(graph, other.short_name) for other in index.calls)
