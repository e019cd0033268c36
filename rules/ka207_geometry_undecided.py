from collections.abc import Iterator

from kaudit.findings import Finding, Level, Precision
from kaudit.geometry import (
    GeometryAnalysis,
    LaunchGeometry,
    LaunchRule,
    axis_index_name,
    grid_dim_name,
)
from kaudit.source import SourceModel


class GeometryUndecided(LaunchRule):
    """kaudit could not decide whether a launch's grid covers the kernel's output.

    ## What it does
    Notes a launch (once) when the static analysis of its grid stops short: the grid comes from
    a helper function, a parameter, an attribute or a device query (`grid = self.grid`,
    `get_grid(n)`, `cudaDevAttrMultiProcessorCount`), it is capped (`min(cdiv(n, 256), 1024)`)
    without a grid-stride loop, it rounds with a term too small to cover the remainder
    (`(n + 127) / 256`), or it divides by a number kaudit cannot tie to what each block of the
    kernel writes (also a window each block only reads, `ih = oh * ks + di`: floor-mode pooling
    drops the tail on purpose, a reduction should not); also a kernel launched indirectly (`cudaLaunchKernel`) or not found in the sources.
    Launches whose geometry is decided (rounded up, sized, covered by a loop, or reported by
    KA201-KA206) get no note.

    ## Why is this bad?
    It is not bad in itself: it marks where the dynamic pass must measure write coverage (by
    filling outputs with sentinels) before the kernel's results are believed.

    ## Example
    ```python
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def inc_kernel(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)

    class ModelNew(torch.nn.Module):
        def __init__(self, grid):
            super().__init__()
            self.grid = grid

        def forward(self, x):
            inc_kernel[self.grid](x, x.numel(), BLOCK=256)  # grid decided elsewhere
            return x
    ```
    """

    code = "KA207"
    name = "geometry-undecided"
    level = Level.NOTE
    precision = Precision.LOW
    tags = ("launch-geometry", "dynamic-pass")

    needs_kernel = False  # a kernel missing from the sources is undecided too

    def check(self, model: SourceModel) -> Iterator[Finding]:
        yield from super().check(model)
        for location, text in GeometryAnalysis.of(model).indirect:
            yield self.report(model, location, f"`{text}` launches a kernel indirectly; its grid "
                                               "is not checked statically")


    def check_launch(self, model: SourceModel, launch: LaunchGeometry) -> Iterator[Finding]:
        reason = _undecided(launch)
        if reason is not None:
            yield self.report(model, launch.location,
                              f"launch of `{launch.kernel_name}`: {reason}; the dynamic pass "
                              "must decide whether the output is covered")


def _undecided(launch: LaunchGeometry) -> str | None:
    kernel = launch.kernel
    if kernel is None:
        return f"kernel `{launch.kernel_name}` is not defined in the analysed sources"
    for axis in sorted(kernel.block_axes):
        if launch.covered_by_loop(axis):
            continue
        if launch.grid.unknown_reason:
            return f"the grid {launch.grid.shown()} is not decided: {launch.grid.unknown_reason}"
        if axis >= launch.grid.explicit:
            continue
        dim = launch.dim(axis)
        where = grid_dim_name(launch, axis)
        if dim.kind == "unknown":
            return f"{where} `{launch.grid.get(axis).show()}` is not decided: {dim.reason}"
        if dim.kind == "param":
            return f"{where} `{launch.grid.get(axis).show()}` is not decided: {dim.reason}"
        if dim.kind == "capped":
            return (f"{where} is capped (`{dim.reason}`) and the kernel has no grid-stride loop "
                    f"over {axis_index_name(launch, axis)}")
        if dim.kind in ("partial", "product") and dim.division is not None:
            return (f"{where} = `{dim.division.expr.show()}` rounds with a term kaudit cannot "
                    f"prove covers the remainder")
        if dim.kind == "floor" and dim.division is not None:
            division = dim.division
            if launch.coverage_matches(axis, division.den, output_only=True) is None \
                    and launch.has_precondition(division.den) is None \
                    and launch.tail_launch() is None:
                read = launch.coverage_matches(axis, division.den) is not None
                return (f"{where} = {division.describe(launch.python)} rounds down, and kaudit "
                        f"cannot tie {division.den.show()} to the elements each block of the kernel "
                        f"{'writes' if read else 'covers'} along {axis_index_name(launch, axis)}"
                        + (" (it reads that many, as a floor-mode pooling window does: whether "
                           "the tail should be read depends on the reference)" if read else ""))
    return None
