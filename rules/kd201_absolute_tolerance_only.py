from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class AbsoluteToleranceOnly(DynamicRule):
    """The output passes the check only through its absolute tolerance.

    ## What it does
    Compares the kernel's output with the reference problem's output on the same inputs. Reported
    when the preset's `torch.allclose` (`--tolerance`, or `--atol`/`--rtol`) passes but a
    scale-invariant check fails: the relative L2 error or the largest error divided by the largest
    |reference| exceeds the limit for the output dtype (fp32: 1e-3 and 1e-2; fp16: 1e-2 and 5e-2;
    bf16: 5e-2 and 1e-1; fp64: 1e-6 and 1e-5). The numbers are in the message and `metrics`.
    A warning; an error when the relative L2 error is 0.5 or more: the output then carries none
    of the reference's signal (an output of zeros has 1.0), whatever the tolerance accepted.
    Unless the reference has no signal either: its reference job also runs the problem in
    float64 on the same inputs, and where the reference output is 0.5 or more (relative L2) from
    that run, it is rounding noise around an exact answer of zero (a GroupNorm's mean), and the
    finding is a warning that says the output cannot be judged.

    ## Why is this bad?
    When the reference output is tiny (~1e-8), `atol` alone accepts almost anything, including an
    output of zeros or one with a relative error of thousands of percent.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            return torch.zeros_like(x)  # the reference is ~1e-8: atol 1e-4 accepts zeros
    ```
    """

    code = "KD201"
    name = "absolute-tolerance-only"
    level = Level.WARNING
    precision = Precision.MEDIUM
    tags = ('dynamic', 'correctness', 'tolerance')
