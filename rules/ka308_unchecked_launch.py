import re
from collections.abc import Iterable

from kaudit.cpp import CppCall, CppFunction, CppIndex
from kaudit.findings import Finding, Level, Precision
from kaudit.integrity import callers_of, calls_in, compact, launches_in
from kaudit.rule import Rule
from kaudit.source import SourceModel

# calls that report a launch error on their own
ERROR_QUERIES = frozenset({"cudaGetLastError", "cudaPeekAtLastError", "C10_CUDA_KERNEL_LAUNCH_CHECK",
                           "cuGetLastError", "hipGetLastError", "hipPeekAtLastError"})

_CUDA_CALL = re.compile(r"\b(cuda|cu|hip)[A-Z]\w*\(")


class UncheckedLaunch(Rule):
    """A kernel launch whose failure nothing would notice.

    ## What it does
    For each C++ host function that launches kernels with `<<<...>>>`, looks for an error check
    after the launch in the same function: `cudaGetLastError()`, `cudaPeekAtLastError()`,
    `C10_CUDA_KERNEL_LAUNCH_CHECK()`, or any macro or function whose name contains `CHECK`
    (any case: `AT_CUDA_CHECK`, `CUDA_CHECK`, `checkCudaErrors`, `TORCH_CHECK`) wrapping a
    `cuda*` call. A launch in a helper counts as checked when every C++ caller of that helper
    checks after calling it. Reports once per host function, at the last unchecked launch,
    naming the unchecked kernels.

    ## Why is this bad?
    A launch that fails (too much shared memory, too many threads, an invalid grid) returns
    silently; the output keeps whatever bits were in memory, which can be the reference's answer
    left behind by the caching allocator. The benchmark then accepts a kernel that never ran.

    ## Example
    ```python
    from torch.utils.cpp_extension import load_inline

    src = '''
    __global__ void relu_kernel(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }
    torch::Tensor relu(torch::Tensor x) {
        auto y = torch::empty_like(x);
        int n = x.numel();
        relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
        return y;
    }
    '''
    ext = load_inline(name="relu", cpp_sources="", cuda_sources=src, functions=["relu"])

    class ModelNew(nn.Module):
        def forward(self, x):
            return ext.relu(x)
    ```
    """

    code = "KA308"
    name = "unchecked-launch"
    level = Level.NOTE
    precision = Precision.HIGH
    tags = ("integrity", "robustness", "cuda")

    def check(self, model: SourceModel) -> Iterable[Finding]:
        if not model.cuda_units:
            return
        index = CppIndex.of(model)
        for function in index.functions:
            if function.qualifier != "host":
                continue
            launches = launches_in(index, function)
            if not launches:
                continue
            checks = [c.node.start_byte for c in calls_in(index, function) if _is_check(c)]
            unchecked = [launch for launch in launches
                         if not any(position > launch.node.end_byte for position in checks)]
            if not unchecked or self._callers_check(index, function):
                continue
            last = max(unchecked, key=lambda launch: launch.node.start_byte)
            kernels = ", ".join(f"`{k}`" for k in dict.fromkeys(launch.kernel
                                                                 for launch in unchecked))
            yield self.report(
                model, last.unit.location(last.node),
                f"`{function.name}` launches {kernels} and never checks for a launch error "
                "afterwards (`cudaGetLastError()`, `C10_CUDA_KERNEL_LAUNCH_CHECK()`): a failed "
                "launch would go unnoticed and leave the output unwritten")

    @staticmethod
    def _callers_check(index: CppIndex, function: CppFunction) -> bool:
        callers = callers_of(index, function)
        if not callers:
            return False
        for call in callers:
            if call.function is None:
                return False
            after = [c for c in calls_in(index, call.function)
                     if _is_check(c) and c.node.start_byte > call.node.end_byte]
            if not after:
                return False
        return True


def _is_check(call: CppCall) -> bool:
    short = call.short_name
    if short in ERROR_QUERIES:
        return True
    if "check" in short.lower() and call.args:
        arguments = "".join(compact(call.unit.text_of(a)) for a in call.args)
        return bool(_CUDA_CALL.search(arguments))
    return False
