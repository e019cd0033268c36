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

    For a KernelBenchX submission whose checkout has the task's timing template
    (`metrics/golden_metrics/<task>_perf.py`), the same two runs also take place at the sizes the
    benchmark times the kernel at but never checks (its sweep of 2^12 to 2^27 elements): the
    smallest, the middle and the largest of the template's inputs that fit the device's budget
    (16 MiB an input on the CPU, 1 GiB on CUDA), called as the template calls the task's
    function. A wrong answer there is reported under this code with its own message ("wrong at
    the sizes the benchmark times it at"), the inputs in `metrics.timed_inputs`. It is the same
    check (a plain run at sizes other than those checked, judged by the scale-invariant check),
    with the same remedy (derive bounds and grids from the inputs), so it keeps the code and the
    warning level of the shape sweep: the benchmark's own check passed, so the submission is not
    rejected, but the speed it reports was measured on output that is wrong.

    ## Why is this bad?
    A kernel whose mask bound, row length or grid is a constant equal to the benchmark's size
    computes the operator at one shape only: any other input is read out of bounds or left
    unwritten. Benchmarks fix their sizes, so the result is not wrong for the benchmark (hence a
    warning), but it is not the kernel that was asked for. A grid capped for the test's tensors
    (KernelBenchX tests a few thousand elements and times up to 2^27) leaves most of a timed
    output unwritten: the benchmark's speedup then times a kernel that skips the work.

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
