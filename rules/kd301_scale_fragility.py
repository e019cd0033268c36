from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class ScaleFragility(DynamicRule):
    """Correct at the benchmark's input scale, wrong at another one the problem handles well.

    ## What it does
    When the kernel passes at the default scale, runs it again with its floating inputs multiplied
    by each of `--scales` (default 1e-3 and 1e3; parameters unchanged), next to the reference in
    its own dtype and a float64 copy of the reference model. Reported when the kernel's relative L2
    error or max error / max|reference| against the float64 output exceeds the dtype's limits (and
    ten times the native reference's own error), while the native reference stays within them: the
    problem is well conditioned at that scale, the kernel is not. Scales where the float64 copy
    cannot run, or where the reference itself loses accuracy, are skipped.

    ## Why is this bad?
    Benchmarks draw inputs from one distribution, usually `torch.randn`. A kernel tuned to that
    scale (an exponential without the max subtracted, a hard-coded epsilon or clamp, a half-precision
    intermediate that overflows) passes there and fails on real data.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            e = torch.exp(x)  # overflows for inputs above ~88
            return e / e.sum(dim=1, keepdim=True)
    ```
    """

    code = "KD301"
    name = "scale-fragility"
    level = Level.WARNING
    precision = Precision.MEDIUM
    tags = ('dynamic', 'numerics', 'correctness')
