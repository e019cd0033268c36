from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class UnwrittenOutput(DynamicRule):
    """Part of the output is never written by the kernel.

    ## What it does
    Runs the kernel three times with every fresh allocation (`torch.empty*`, `at::empty*` from C++
    extensions, during construction and forward, on the calling thread and on Python threads
    started meanwhile) filled from a different palette of bit patterns drawn from a key made for
    each scan (NaNs with random payloads, large negative and large positive finite values, a
    different kind for each element in each run; random values for integer dtypes; no value in
    two palettes), plus a repeat of the first run. An output element is unwritten when it holds a
    value of its run's palette, bit for bit, in every run. The message gives the
    count, the fraction and where the unwritten elements lie (the tail, whole rows, whole columns,
    strided or scattered); `metrics` hold the same numbers, and with `--artifacts DIR` a picture
    of the output shows them. Memory from `malloc`/`cudaMalloc`, an operator's internal outputs and
    allocations of C++ threads or older thread pools are not poisoned (see
    `kaudit.dynamic.harness.poison`).

    ## Why is this bad?
    Unwritten elements hold whatever the allocator left there. A harness that allocates with
    `torch.empty` on a fresh GPU often sees zeros, or the reference output of the previous call left
    in a cached block, so a kernel that computes 0.02 % of its output can pass its correctness check.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            out = torch.empty_like(x)
            out[0] = torch.relu(x[0])  # only the first row is computed
            return out
    ```
    """

    code = "KD101"
    name = "unwritten-output"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ('dynamic', 'write-coverage', 'integrity')
