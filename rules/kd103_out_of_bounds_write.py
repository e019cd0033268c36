from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class OutOfBoundsWrite(DynamicRule):
    """The kernel writes outside the memory it was given.

    ## What it does
    In every run of the candidate (the poisoned runs of the write-coverage probe and the
    unpoisoned ones), every contiguous allocation made through the PyTorch dispatcher
    (`torch.empty*`, `at::empty*` in C++ extensions) gets a guard zone of 16 KiB before and after
    it, filled with the run's pattern and copied. After forward, guard elements that differ from
    the copy were written out of bounds. The message names the allocation (an
    output, or a temporary with its shape and dtype), how many elements were written past its end or
    before its start and how far; with `--artifacts DIR` a picture shows them next to the output.

    ## Why is this bad?
    An out-of-bounds write corrupts whatever lies next to the buffer: another tensor, the
    allocator's bookkeeping, or in Triton's CPU interpreter the process heap. The result can be
    right in a benchmark and wrong in any program where something else lives there. A launch grid
    rounded up without a bounds check is the usual cause.

    ## Example
    ```python
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def relu_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        # no mask: the last block writes past the end when numel % BLOCK != 0
        tl.store(out_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets), 0.0))


    class ModelNew(nn.Module):
        def forward(self, x):
            out = torch.empty_like(x)
            relu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, BLOCK=256)
            return out
    ```
    """

    code = "KD103"
    name = "out-of-bounds-write"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ('dynamic', 'memory-safety', 'integrity')
