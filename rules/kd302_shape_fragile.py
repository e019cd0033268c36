from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class ShapeFragile(DynamicRule):
    """The kernel is right only at the benchmark's sizes.

    ## What it does
    For a kernel that passed the dynamic checks, reads the problem's module-level integer sizes
    (`batch_size = 16`, `dim = 128`: assignments of an integer of at least 8), makes each one larger
    (an odd size, no multiple of 32 or 128), and runs the reference problem with them (inputs,
    init inputs, outputs). Where the reference accepts them (it runs, and its inputs grow by at most
    2x), a plain run of the kernel on those inputs must give its answer: a crash, other output
    shapes or an output failing the scale-invariant check (KD201's limits) is reported, with the
    sizes in the message and `metrics`.

    ## Why is this bad?
    A kernel whose mask bound, row length or grid is a constant equal to the benchmark's size
    computes the operator at one shape only: any other input is read out of bounds or left
    unwritten. Benchmarks fix their sizes, so the result is not wrong for the benchmark (hence a
    warning), but it is not the kernel that was asked for.

    ## Example
    ```python
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl

    DIM = tl.constexpr(128)  # the benchmark's width, as a constant


    @triton.jit
    def scale_rows(x_ptr, out_ptr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * DIM + cols, mask=cols < DIM)
        tl.store(out_ptr + row * DIM + cols, x * 2.0, mask=cols < DIM)


    class ModelNew(nn.Module):
        def forward(self, x):
            out = torch.empty_like(x)
            scale_rows[(x.shape[0],)](x, out, BLOCK=128)
            return out
    ```
    """

    code = "KD302"
    name = "shape-fragile"
    level = Level.WARNING
    precision = Precision.MEDIUM
    tags = ('dynamic', 'correctness', 'shapes')
