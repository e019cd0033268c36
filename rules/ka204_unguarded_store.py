from collections.abc import Iterator

from kaudit.findings import Finding, Level, Precision
from kaudit.geometry import (
    LaunchGeometry,
    LaunchRule,
    Store,
    evaluate,
    grid_dim_name,
    remainder_text,
    show_value,
    store_axes,
    substitute,
)
from kaudit.source import SourceModel


class UnguardedStore(LaunchRule):
    """A global store without a bounds check or mask, in a kernel whose grid provably rounds up.

    ## What it does
    Reports a launch whose grid rounds a size up to whole blocks (`(n + 255) / 256`,
    `triton.cdiv(n, BLOCK)`, any ceil-division spelling) when the kernel writes global memory at
    an element index built from the block and the thread (`out[i] = ...` with
    `i = blockIdx.x * blockDim.x + threadIdx.x`, `tl.store(y_ptr + offs, v)` with
    `offs = pid * BLOCK + tl.arange(0, BLOCK)`) and nothing bounds that index: no enclosing
    `if (i < n)`, no earlier `if (i >= n) return;`, no loop condition, no `mask=` (or
    `boundary_check=`) on `tl.store`. Also reported: an unmasked `tl.store` over
    `tl.arange(0, BLOCK)` where the launch passes `BLOCK = triton.next_power_of_2(size)` and the
    size is not a known power of two.

    It reports (at error level) only what is provable: the divisor equals, or is at most, the
    kernel's per-block coverage, there is no `n % B == 0` precondition and no grid-stride loop,
    and the index is not clamped (`min(i, n - 1)`, `i % n`). An unguarded store under a grid
    kaudit cannot decide is not reported; KA207 notes the launch when its grid is unknown.

    ## Why is this bad?
    The last block runs threads past the end of the output. Their writes land in whatever the
    caching allocator placed after the tensor (another tensor, the reference's buffers), or
    fault. Results then depend on memory layout: the benchmark may pass while other tensors are
    silently corrupted.

    ## Example
    ```python
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def neg_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, -tl.load(x_ptr + offs))  # no mask

    class ModelNew(torch.nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            n = x.numel()
            neg_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
            return y
    ```
    """

    code = "KA204"
    name = "unguarded-store"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("launch-geometry", "memory-safety")

    def check_launch(self, model: SourceModel, launch: LaunchGeometry) -> Iterator[Finding]:
        assert launch.kernel is not None
        for store in launch.kernel.stores:
            if store.guarded:
                continue
            message = self._rounded_grid(launch, store) or self._power_of_two_block(launch, store)
            if message is not None:
                yield self.report(model, launch.location, message)
                return

    @staticmethod
    def _rounded_grid(launch: LaunchGeometry, store: Store) -> str | None:
        axes, per_element = store_axes(launch.kernel, store)  # type: ignore[arg-type]
        if not per_element:
            return None
        for axis in sorted(axes):
            dim = launch.dim(axis)
            if dim.kind != "ceil" or dim.division is None or launch.covered_by_loop(axis):
                continue
            division = dim.division
            if launch.has_precondition(division.den):
                continue
            coverage = launch.coverage_matches(axis, division.den)
            if coverage is None:
                den = evaluate(division.den)
                coverage = next((c for c in launch.coverage(axis) if den is not None
                                 and (evaluate(c) or 0) >= den), None)
            if coverage is None:
                continue
            what = "has no `mask=`" if launch.python else "has no bounds check on its index"
            unit = "programs" if launch.python else "blocks"
            return (f"{grid_dim_name(launch, axis)} = {division.describe(launch.python)} rounds up to "
                    f"whole {unit} of {show_value(division.den)} elements, but `{store.text}` (line "
                    f"{store.location.line}) {what}: the last one writes past the end whenever "
                    f"{remainder_text(division)} != 0")
        return None

    @staticmethod
    def _power_of_two_block(launch: LaunchGeometry, store: Store) -> str | None:
        if not launch.python:
            return None
        for extent in store.extents:
            value = substitute(extent, launch.params)
            if value.op != "np2":
                continue
            size = value.args[0]
            known = evaluate(size)
            if known is not None and known > 0 and known & (known - 1) == 0:
                continue
            if any(size.show() in check.text for check in launch.geo.preconditions()):
                continue
            return (f"`{store.text}` (line {store.location.line}) has no `mask=` but its offsets span "
                    f"`tl.arange` over {extent.show()} = triton.next_power_of_2({size.show()}): "
                    f"unless {size.show()} is a power of two the store writes past it")
        return None
