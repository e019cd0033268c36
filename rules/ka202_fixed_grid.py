from collections.abc import Iterator

from kaudit.findings import Finding, Level, Precision
from kaudit.geometry import LaunchGeometry, LaunchRule, axis_index_name, grid_dim_name
from kaudit.source import SourceModel


class FixedGrid(LaunchRule):
    """A launch grid fixed to a constant while the kernel indexes elements by block and never loops.

    ## What it does
    Reports a launch whose grid dimension is an integer constant, written at the launch or bound
    to one in the host code (`k<<<1, 256>>>`, `<<<128, 256>>>`, `const int blocks = 64;`,
    `#define BLOCKS 80`, `kernel[(1,)]`, `grid = (4,)`), when the kernel stores elements at an
    index built from `blockIdx` / `tl.program_id` along that dimension and from the thread
    (`threadIdx`, `tl.arange`), and no loop in the kernel walks the rest of the size (no
    grid-stride loop such as `i += blockDim.x * gridDim.x`, no persistent loop
    `for tile in range(pid, n_tiles, NUM_SMS)`). Not reported: a kernel that works in one block
    (`for (i = threadIdx.x; i < n; i += blockDim.x)`), one value per block (`out[blockIdx.x] =
    sum` in the last pass of a reduction), a launch handling the tail of another, and module
    constants the problem's `get_inputs` uses (they are the problem's sizes).

    ## Why is this bad?
    A constant grid covers a constant number of elements whatever the input size: on the
    benchmark's shapes it may happen to cover the output, or cover only its beginning while the
    rest of a `torch.empty` output keeps stale memory that happens to match. Either way the
    kernel is not computing the operation for the sizes it claims.

    ## Example
    ```python
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)

    class ModelNew(torch.nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            scale_kernel[(1,)](x, y, x.numel(), BLOCK=1024)  # one program, 1024 elements
            return y
    ```
    """

    code = "KA202"
    name = "fixed-grid"
    level = Level.WARNING
    precision = Precision.MEDIUM
    tags = ("launch-geometry", "correctness")

    def check_launch(self, model: SourceModel, launch: LaunchGeometry) -> Iterator[Finding]:
        if launch.handles_tail():
            return
        for axis in sorted(launch.element_axes()):
            if axis >= launch.grid.explicit or launch.covered_by_loop(axis):
                continue
            dim = launch.dim(axis)
            if dim.kind != "const" or dim.value is None:
                continue
            written = launch.grid.name or launch.grid.get(axis).show()
            named = f" (`{written}`)" if written != str(dim.value) else ""
            yield self.report(
                model, launch.location,
                f"{grid_dim_name(launch, axis)} = {dim.value}{named} is fixed: kernel "
                f"`{launch.kernel_name}` indexes its output with {axis_index_name(launch, axis)} "
                f"but the grid does not grow with the input size and no loop in the kernel "
                f"covers the rest", axis=axis, blocks=dim.value)
            return
