from kaudit.dynamic.probe_rule import ProblemRule
from kaudit.findings import Level, Precision


class OtherInputAccepted(ProblemRule):
    """The reference output computed for other inputs passes the correctness check.

    ## What it does
    Runs the reference on the inputs of several seeds and checks every ordered pair: does seed
    j's output pass `allclose` against seed i's reference? The rule fires when every pair passes.
    The message gives how many pairs pass and the largest elementwise difference between seeds.
    When `get_inputs()` returns the same inputs for every seed, the pairs pass trivially and the
    message says so.

    ## Why is this bad?
    The check cannot tell whether the output depends on the input at all: a kernel that returns
    an output stored from one earlier run (or computed on the wrong data, a stale buffer, another
    batch) is accepted. Measured on KernelBench level 2 at tolerance 1e-2, this held for 24 of 100
    problems.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        # Global average pooling of uniform images: outputs hardly change between inputs.

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
    (with `--tolerance kernelbench-v0`)
    """

    code = "KP103"
    name = "other-input-accepted"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("benchmark-problem", "tolerance", "correctness")
