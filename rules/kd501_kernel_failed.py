from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class KernelFailed(DynamicRule):
    """The kernel failed to compile, import, construct or run.

    ## What it does
    Reports a candidate child process that did not finish: a compile or import error, an exception
    in `ModelNew(...)` or `forward`, a crash (signal, illegal memory access), an out-of-memory error or
    a timeout (`--timeout`). On a GPU, a job that ran out of memory beside other jobs is first run
    again alone on the GPU (no other kaudit job of the user on it); only a second failure is
    reported, with the memory that was free. The message gives the phase and the captured error;
    `metrics` hold the status, the phase and the tail of stderr. The scan goes on with the next
    kernel.

    ## Why is this bad?
    A kernel that does not run on the problem's own inputs has no correct answer and no speed.

    ## Example
    ```python
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            raise NotImplementedError("TODO: write the kernel")
    ```
    """

    code = "KD501"
    name = "kernel-failed"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ('dynamic', 'crash')
