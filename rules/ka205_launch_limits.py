from collections.abc import Iterator

from kaudit.findings import Finding, Level, Precision
from kaudit.geometry import LaunchGeometry, LaunchRule, evaluate
from kaudit.source import SourceModel

MAX_THREADS = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID_YZ = 65535
STATIC_SHARED = 48 * 1024
OPT_IN_SHARED = 227 * 1024  # per-block opt-in limit of H100 / H200 (sm_90)
MAX_WARPS = 32
_AXES = "xyz"


class LaunchLimits(LaunchRule):
    """A launch configuration over the hardware's limits, so the launch fails.

    ## What it does
    Evaluates the constant parts of each launch and reports:
    - a block of more than 1024 threads (the product of its dimensions), or a block dimension
      over its own limit (x, y 1024; z 64), or a grid `y`/`z` over 65535;
    - static `__shared__` arrays of a kernel totalling more than 48 KiB (the static limit; the
      opt-in attribute does not raise it);
    - dynamic shared memory (`<<<g, b, bytes>>>`) over 48 KiB without a
      `cudaFuncSetAttribute(..., cudaFuncAttributeMaxDynamicSharedMemorySize, ...)` in the
      sources, or static plus dynamic over 227 KiB (the H100/H200 per-block opt-in limit)
      regardless;
    - Triton `num_warps` above 32 at a launch or in a `triton.Config` of the kernel's autotuner.

    Sizes come from literals, `const`/`constexpr` values, `#define`s and `sizeof` of the usual
    element types; values kaudit cannot evaluate are not reported.

    ## Why is this bad?
    Such a launch fails with "invalid configuration argument" or "too many resources requested".
    Kernels generated for benchmarks rarely check `cudaGetLastError()`, so the failure is silent:
    the output keeps the bits that were in memory, which can be the reference's result, and the
    "kernel" is timed as the cost of a failed launch.

    ## Example
    ```python
    import torch
    from torch.utils.cpp_extension import load_inline

    cuda_src = '''
    __global__ void copy_kernel(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i];
    }
    torch::Tensor copy(torch::Tensor x) {
        auto y = torch::empty_like(x);
        int n = x.numel();
        copy_kernel<<<(n + 2047) / 2048, 2048>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
        return y;
    }
    '''
    ext = load_inline(name="copy", cpp_sources="torch::Tensor copy(torch::Tensor x);",
                      cuda_sources=cuda_src, functions=["copy"])

    class ModelNew(torch.nn.Module):
        def forward(self, x):
            return ext.copy(x)
    ```
    """

    code = "KA205"
    name = "launch-limits"
    level = Level.ERROR
    precision = Precision.VERY_HIGH
    tags = ("launch-geometry", "silent-failure")

    needs_kernel = False  # a launch fails on its configuration alone

    def check_launch(self, model: SourceModel, launch: LaunchGeometry) -> Iterator[Finding]:
        if launch.python:
            message = _warps(launch)
        else:
            message = _block(launch) or _grid(launch) \
                or _shared(launch, launch.geo.dynamic_shared_opt_in())
        if message is not None:
            yield self.report(model, launch.location, message)


def _block(launch: LaunchGeometry) -> str | None:
    block = launch.block
    if block is None or block.unknown_reason:
        return None
    values = [evaluate(block.get(axis)) for axis in range(3)]
    for axis, value in enumerate(values):
        if value is not None and value > MAX_BLOCK[axis]:
            return (f"block {block.shown()} has {value} threads along {_AXES[axis]}, over the limit "
                    f"of {MAX_BLOCK[axis]}: the launch of `{launch.kernel_name}` fails")
    if all(v is not None for v in values):
        threads = values[0] * values[1] * values[2]  # type: ignore[operator]
        if threads > MAX_THREADS:
            return (f"block {block.shown()} has {threads} threads, over the limit of {MAX_THREADS} "
                    f"per block: the launch of `{launch.kernel_name}` fails")
    return None


def _grid(launch: LaunchGeometry) -> str | None:
    grid = launch.grid
    for axis in (1, 2):
        if axis < grid.explicit:
            value = evaluate(grid.get(axis))
            if value is not None and value > MAX_GRID_YZ:
                return (f"grid {grid.shown()} has {value} blocks along {_AXES[axis]}, over the limit "
                        f"of {MAX_GRID_YZ}: the launch of `{launch.kernel_name}` fails")
    return None


def _shared(launch: LaunchGeometry, opted_in: bool) -> str | None:
    kernel = launch.kernel
    static = sum(b for _, b in kernel.shared if b is not None) if kernel is not None else 0
    if static > STATIC_SHARED:
        names = ", ".join(f"`{n}` {b} B" for n, b in kernel.shared if b)  # type: ignore[union-attr]
        return (f"kernel `{launch.kernel_name}` declares {static} bytes of static `__shared__` "
                f"memory ({names}), over the 48 KiB static limit (only dynamic shared memory can "
                f"be raised with cudaFuncSetAttribute)")
    dynamic = evaluate(launch.shared) if launch.shared is not None else None
    if dynamic is None:
        return None
    if static + dynamic > OPT_IN_SHARED:
        return (f"the launch asks for {dynamic} bytes of dynamic shared memory"
                f"{f' plus {static} static' if static else ''}, over the 227 KiB per-block limit "
                f"of H100/H200: the launch of `{launch.kernel_name}` fails")
    if dynamic > STATIC_SHARED and not opted_in:
        written = launch.shared.show()  # type: ignore[union-attr]
        return (f"the launch asks for {dynamic} bytes of dynamic shared memory (`{written}`), "
                f"over 48 KiB, without cudaFuncSetAttribute(..., "
                f"cudaFuncAttributeMaxDynamicSharedMemorySize, ...): the launch of "
                f"`{launch.kernel_name}` fails")
    return None


def _warps(launch: LaunchGeometry) -> str | None:
    for value, where in launch.num_warps:
        warps = evaluate(value)
        if warps is not None and warps > MAX_WARPS:
            return (f"num_warps = {warps} in {where} is over Triton's limit of {MAX_WARPS} "
                    f"({MAX_WARPS * 32} threads): the launch of `{launch.kernel_name}` fails")
    return None
