from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class UninitialisedDependence(DynamicRule):
    """The output depends on uninitialised memory.

    ## What it does
    In the same poisoned runs as KD101, reports output elements that are written but change with the
    pattern that fills fresh allocations, while the repeat run with the same pattern (the last of
    the poisoned runs, the first being the one it repeats, so that an output changing with the
    number of calls cannot pass for this) is bit-identical to the first (so the change is not
    nondeterminism): the kernel reads memory it never initialised, such as a running maximum whose
    accumulator comes from `torch.empty`. (An accumulator that is only added to keeps the pattern's
    NaN or huge value and shows as unwritten: KD101.) Not reported when KD101 already fires for the
    output or when the repeat run differs.

    ## Why is this bad?
    The answer depends on what the allocator happens to hand out: it can pass on one machine or
    call and fail on the next, and a check that passes says nothing about the kernel.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            acc = x.new_empty(x.size(0))  # never set to -inf
            for start in range(0, x.size(1), 32):
                acc = torch.maximum(acc, x[:, start:start + 32].amax(dim=1))
            return acc
    ```
    """

    code = "KD102"
    name = "uninitialised-dependence"
    level = Level.ERROR
    precision = Precision.MEDIUM
    tags = ('dynamic', 'write-coverage', 'integrity')
