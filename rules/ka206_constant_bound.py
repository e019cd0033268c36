from collections.abc import Iterator

from kaudit.findings import Finding, Level, Precision
from kaudit.geometry import LaunchGeometry, LaunchRule, evaluate
from kaudit.source import SourceModel


class ConstantBound(LaunchRule):
    """A bounds check or mask on the global index compares against a constant, not the input's size.

    ## What it does
    Reports a launch whose kernel bounds its global element index (built from `blockIdx` and
    `threadIdx`, or from `tl.program_id` and `tl.arange`) from above by a constant: an integer
    literal (`if (i < 4096)`, `if (idx >= 1048576) return;`, `mask = offs < 1024`) or a named
    constant of the file (`mask = cols < FEATURES` with `FEATURES = 1000` at module level,
    `#define N 4096`), while the kernel receives a size argument or the host code reads the
    tensor's size. Also reported: a kernel that bounds its index by a parameter (`cols < n_cols`)
    that the launch fills from a named constant (`kernel[grid](x, y, FEATURES)`) instead of the
    input's shape.

    Not reported: literals 0 and 1; bounds on `threadIdx` alone (`if (tid < 32)` in a
    reduction); lower bounds (`o >= 4 && o <= L - 4`, the interior of a padded window, is
    bounded by `L`); comparisons of values loaded from memory (`x > 20` on `x = tl.load(...)`);
    constants the host checks (`TORCH_CHECK(n == 4096)`, `assert x.shape[1] == FEATURES`).

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
        reads_sizes = bool(kernel.size_params) or launch.host_sizes
        bounds = (kernel.const_bounds if reads_sizes else []) + \
            (kernel.param_bounds if launch.constants else [])
        for bound in sorted(bounds, key=lambda b: (b.location.line, b.location.column)):
            where = f"(`{bound.text}`, line {bound.location.line})"
            if bound.param:
                constant = launch.constants.get(bound.param)
                known = evaluate(launch.params[bound.param]) if constant else None
                if known is None or known < 2 or _checked(launch, constant, known):
                    continue
                message = (f"kernel `{kernel.name}` bounds its global index by `{bound.param}` {where} "
                           f"and the launch passes the constant `{constant}` = {known} instead of "
                           f"the input's size")
                value = known
            else:
                if _checked(launch, bound.name, bound.literal):
                    continue
                size = f"the size argument `{kernel.size_params[0]}`" if kernel.size_params \
                    else "the tensor's size at the launch"
                constant = f"the constant `{bound.name}` = {bound.literal}" if bound.name \
                    else f"the literal {bound.literal}"
                message = f"kernel `{kernel.name}` bounds its global index by {constant} {where} instead of {size}"
                value = bound.literal  # type: ignore[assignment]
            yield self.report(model, launch.location,
                              f"{message}: other sizes are computed only in part or written out of "
                              f"bounds", literal=value)
            return


def _checked(launch: LaunchGeometry, name: str | None, value: int | None) -> bool:
    """The host checks the constant (`TORCH_CHECK(n == 4096)`, `assert x.shape[1] == FEATURES`)."""
    checked = " ".join(check.text for check in launch.geo.preconditions())
    return bool(name and name in checked) or str(value) in checked
