from collections.abc import Iterator

from kaudit.findings import Finding, Level, Precision
from kaudit.geometry import (
    LaunchGeometry,
    LaunchRule,
    axis_index_name,
    grid_dim_name,
    remainder_text,
    show_value,
)
from kaudit.source import SourceModel


class FloorDividedGrid(LaunchRule):
    """A launch grid computed by rounding the size down, so the last partial block never runs.

    ## What it does
    Reports a CUDA `<<<grid, block>>>` or Triton `kernel[grid](...)` launch whose grid dimension
    is a plain floor division of a size by the number of elements each block covers: `n / 256`
    (C++ integer division), `n // BLOCK`, `int(n / BLOCK)`, `n >> 8`, `max(n // B, 1)`, also when
    the grid goes through variables (`int blocks = n / threads;`, `dim3 grid(n / 256)`,
    `grid = lambda meta: (n // meta["BLOCK"],)`). The divisor must equal the kernel's own
    per-block coverage (`blockIdx.x * blockDim.x + threadIdx.x` with that block size,
    `tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)` with that `BLOCK`), so the loss is provable.

    Not reported: any rounding term (`(n + B - 1) / B`, `cdiv`, `triton.cdiv`, `-(-n // B)`,
    `(n - 1) / B + 1`, `ceil`, `n / B + (n % B != 0)`, `if (n % B) blocks++`), a grid-stride or
    persistent loop in the kernel, a precondition `TORCH_CHECK(n % B == 0)`, `assert n % B == 0`
    or `if n % B: raise`, a numerator that is provably a multiple of the divisor (`blocks * 256`
    of 256, `x.numel() / x.size(-1)`: a tensor's element count is a multiple of each of its
    sizes), a divisor that is itself a dimension of the data (`x.numel() / d` with
    `d = gamma.numel()`, `n // (C * H * W)`: the grid counts rows, exact for any input of a
    consistent shape; `x.numel() / (4 * d)` is a block of four rows and is reported), and a
    second launch in the same host function that handles the tail. When the divisor cannot be tied to
    the kernel's coverage the launch is left to KA207.

    ## Why is this bad?
    `n / 256` blocks of 256 threads cover `n - n % 256` elements; the rest of the output is never
    written. With `torch.empty` outputs the unwritten tail holds whatever the allocator handed
    back, often the reference's own result from the previous call, so the check passes on the
    benchmark's sizes and the kernel is reported faster than it is.

    ## Example
    ```python
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)

    class ModelNew(torch.nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            n = x.numel()
            relu_kernel[(n // 1024,)](x, y, n, BLOCK=1024)  # the last n % 1024 never run
            return y
    ```
    """

    code = "KA201"
    name = "floor-divided-grid"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("launch-geometry", "correctness")

    def check_launch(self, model: SourceModel, launch: LaunchGeometry) -> Iterator[Finding]:
        for axis in range(max(launch.grid.explicit, 1)):
            dim = launch.dim(axis)
            if dim.kind != "floor" or dim.division is None or launch.covered_by_loop(axis):
                continue
            division = dim.division
            coverage = launch.coverage_matches(axis, division.den)
            if coverage is None or launch.has_precondition(division.den) \
                    or launch.tail_launch() is not None:
                continue
            named = f" (`{launch.grid.name}`)" if launch.grid.name else ""
            unit = "program" if launch.python else "block"
            yield self.report(
                model, launch.location,
                f"{grid_dim_name(launch, axis)} = {division.describe(launch.python)}{named} "
                f"drops {remainder_text(division)} elements: kernel `{launch.kernel_name}` "
                f"covers {show_value(coverage)} elements per {unit} along "
                f"{axis_index_name(launch, axis)}, and there is no rounding term, no "
                f"grid-stride loop, no `{remainder_text(division)} == 0` check and no tail launch",
                axis=axis)
            return
