from kaudit.dynamic.probe_rule import ProblemRule
from kaudit.findings import Level, Precision


class DegenerateReference(ProblemRule):
    """The problem's reference output is degenerate: NaN/Inf, all zero, constant, or noise.

    ## What it does
    Looks at the reference outputs of all seeds and reports any of: NaN or Inf values; an output
    that is all zeros; an output whose elements all have one value (outputs of one element
    excepted); outputs that do not change between seeds (differences below 1e-6 of max|y|);
    `get_inputs()` returning the same inputs for every seed; and an output that is rounding
    noise, where the native-dtype and float64 references differ by more than 10 % (relative L2).

    ## Why is this bad?
    NaN never compares equal, so no kernel can pass (or, with `equal_nan`, any NaN-producing
    kernel does). An all-zero, constant or input-independent output is passed by trivial kernels.
    A reference that is rounding noise (e.g. the mean of a normalised tensor, about 1e-8) has no
    right answer: a real kernel was accepted on such a problem with 7400 % relative error.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        # Log of a difference of two uniform tensors: NaN wherever a < b.

        def __init__(self):
            super().__init__()

        def forward(self, a, b):
            return torch.log(a - b)


    def get_inputs():
        return [torch.rand(64, 64), torch.rand(64, 64)]


    def get_init_inputs():
        return []
    ```
    """

    code = "KP104"
    name = "degenerate-reference"
    level = Level.WARNING
    precision = Precision.HIGH
    tags = ("benchmark-problem", "correctness")
