from collections.abc import Iterator

from kaudit.findings import Finding, Level, Precision
from kaudit.geometry import LaunchGeometry, LaunchRule
from kaudit.source import SourceModel


class ConstantBound(LaunchRule):
    """A bounds check or mask on the global index compares against an integer literal.

    ## What it does
    Reports a launch whose kernel bounds its global element index (built from `blockIdx` and
    `threadIdx`, or from `tl.program_id` and `tl.arange`) by an integer literal (`if (i < 4096)`,
    `if (idx >= 1048576) return;`, `mask = offs < 1024`) while the kernel receives a size
    argument or the host code reads the tensor's size. Literals 0 and 1, bounds on `threadIdx`
    alone (`if (tid < 32)` in a reduction) and literals the host checks
    (`TORCH_CHECK(n == 4096)`, `assert n == 4096`) are not reported.

    ## Why is this bad?
    The kernel is specialised to the benchmark's shape: on that shape the guard is right, on any
    other it computes too little (the rest of the output keeps stale memory) or writes past the
    end. A size the kernel is given but does not use for its bound is a sign the bound was tuned
    to pass the check rather than to be correct.

    ## Example
    ```python
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def sq_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < 1048576  # the benchmark's size, not n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) ** 2, mask=mask)

    class ModelNew(torch.nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            n = x.numel()
            sq_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
            return y
    ```
    """

    code = "KA206"
    name = "constant-bound"
    level = Level.WARNING
    precision = Precision.MEDIUM
    tags = ("launch-geometry", "specialisation")

    def check_launch(self, model: SourceModel, launch: LaunchGeometry) -> Iterator[Finding]:
        kernel = launch.kernel
        assert kernel is not None
        if not kernel.const_bounds or (not kernel.size_params and not launch.host_sizes):
            return
        checked = " ".join(check.text for check in launch.geo.preconditions())
        for bound in kernel.const_bounds:
            if str(bound.literal) in checked:
                continue
            size = f"the size argument `{kernel.size_params[0]}`" if kernel.size_params \
                else "the tensor's size at the launch"
            yield self.report(
                model, launch.location,
                f"kernel `{kernel.name}` bounds its global index by the literal {bound.literal} "
                f"(`{bound.text}`, line {bound.location.line}) instead of {size}: other sizes "
                f"are computed only in part or written out of bounds", literal=bound.literal)
            return
