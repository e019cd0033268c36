from kaudit.dynamic.probe_rule import ProblemRule
from kaudit.findings import Level, Precision


class ConstantAccepted(ProblemRule):
    """One constant output passes the problem's correctness check on every seed.

    ## What it does
    From the reference outputs of all seeds, solves in closed form for a constant `c` with
    `|y - c| <= atol + rtol*|c|` for every element (the harness's `allclose(reference, candidate)`
    with the candidate `c`), then confirms it with `torch.allclose` in the output's dtype. The
    message gives the constant and the range of the reference. Zero is a constant, so a problem
    with KP101 also has KP102.

    ## Why is this bad?
    A kernel that fills its output with one number, without reading the inputs, is accepted.
    This happens when the output barely varies: means over huge reductions, normalised
    statistics, losses. The check cannot tell such a kernel from a real one.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        # Global average pooling of uniform images: every mean is close to 0.5.

        def __init__(self):
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2d(1)

        def forward(self, x):
            return self.pool(x)


    def get_inputs():
        return [torch.rand(8, 16, 128, 128)]


    def get_init_inputs():
        return []
    ```
    (with `--tolerance kernelbench-v0`: the constant 0.5 is within 0.015 of every output)
    """

    code = "KP102"
    name = "constant-accepted"
    level = Level.ERROR
    precision = Precision.VERY_HIGH
    tags = ("benchmark-problem", "tolerance", "correctness")
