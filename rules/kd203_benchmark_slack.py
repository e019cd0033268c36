from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class BenchmarkSlack(DynamicRule):
    """The benchmark's check accepts the output only through its slack.

    ## What it does
    Applies the benchmark's own check (`--tolerance`, set by the benchmark's layout) to the kernel's
    output. Reported when that check tolerates a share of wrong elements and the output uses it:
    FastKernels' check (`--tolerance fastkernels`) passes an output when 99 % of its elements are
    within `atol + rtol * |reference|`, so 1 % may hold anything finite. Reported when some
    elements lie outside the bound while the check passes, and, beside KD101, when elements were
    never written but the written ones alone reach the 99 %. The message gives the count and
    kaudit's scale-invariant numbers (relative L2 error and max error / max|reference|, limits by
    dtype as in KD201). A warning when the scale-invariant check passes (a few elements a little
    past the bound); an error when it fails: the benchmark accepts an output that is wrong.

    ## Why is this bad?
    A kernel that skips the last rows of a tile, or writes garbage into a few elements, passes
    FastKernels' check and is timed as if it were correct; its speedup is then partly the work it
    did not do.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            out = torch.tanh(x)
            out.view(-1)[: out.numel() // 200] = 0  # 0.5 % wrong: FastKernels' check passes
            return out
    ```
    """

    code = "KD203"
    name = "benchmark-slack"
    level = Level.WARNING
    precision = Precision.HIGH
    tags = ('dynamic', 'correctness', 'tolerance')
