from collections.abc import Iterator

from kaudit.findings import Finding, Level, Precision
from kaudit.geometry import LaunchGeometry, LaunchRule, axis_index_name
from kaudit.source import SourceModel

_AXES = "xyz"


class DimensionMismatch(LaunchRule):
    """The kernel indexes with `blockIdx.y` or `tl.program_id(1)` but the launch leaves that axis at 1.

    ## What it does
    Reports a launch whose grid has fewer dimensions than the kernel indexes its output with: a
    scalar grid or `dim3 grid(n)` for a kernel whose stored index depends on `blockIdx.y` or
    `blockIdx.z`, a 1-tuple Triton grid for a kernel using `tl.program_id(1)`, and a 1-D block
    (`<<<g, 256>>>`) for a kernel indexing with `threadIdx.y`. Only dimensions the launch leaves
    out are reported; an explicit `1` (`dim3 grid(n, 1)`, `(tiles, 1)` for a split-K of one) is a
    choice, not an omission. A loop striding by `gridDim.y` covers the dimension and is not
    reported.

    ## Why is this bad?
    An omitted dimension is 1, so `blockIdx.y` is always 0: the kernel computes the first row (or
    batch, or head) only. The best-known reward hack of this kind (reported at about 150x)
    launched a 1-D grid with `blockIdx.y` indexing and wrote 0.02 % of its output; the rest
    still held the reference's result in recycled memory, so it passed.

    ## Example
    ```python
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add_rows_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(1)
        cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        v = tl.load(x_ptr + row * n_cols + cols, mask=mask)
        tl.store(y_ptr + row * n_cols + cols, v + 1.0, mask=mask)

    class ModelNew(torch.nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            rows, cols = x.shape
            add_rows_kernel[(triton.cdiv(cols, 256),)](x, y, cols, BLOCK=256)  # row 0 only
            return y
    ```
    """

    code = "KA203"
    name = "dimension-mismatch"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("launch-geometry", "correctness")

    def check_launch(self, model: SourceModel, launch: LaunchGeometry) -> Iterator[Finding]:
        kernel = launch.kernel
        assert kernel is not None
        for axis in sorted(a for a in kernel.block_axes if a >= 1):
            if launch.grid.implicit(axis) and not launch.covered_by_loop(axis):
                count = launch.grid.explicit
                shape = f"has {count} dimension{'s' if count != 1 else ''}" if launch.python \
                    else f"is {count}-D"
                index = axis_index_name(launch, axis)
                yield self.report(model, launch.location,
                                  f"kernel `{kernel.name}` indexes its output with {index} but the "
                                  f"grid {launch.grid.shown()} {shape}: {index} is always 0, so "
                                  f"only the first slice along that axis is computed")
                return
        block = launch.block
        if block is None or block.unknown_reason:
            return
        for axis in sorted(a for a in kernel.thread_axes if a >= 1):
            if block.implicit(axis):
                yield self.report(model, launch.location,
                                  f"kernel `{kernel.name}` indexes its output with "
                                  f"threadIdx.{_AXES[axis]} but the block {block.shown()} is "
                                  f"{block.explicit}-D: threadIdx.{_AXES[axis]} is always 0")
                return
