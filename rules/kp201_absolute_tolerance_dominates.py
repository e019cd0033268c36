from kaudit.dynamic.probe_rule import ProblemRule
from kaudit.findings import Level, Precision


class AbsoluteToleranceDominates(ProblemRule):
    """The correctness check is dominated by its absolute tolerance at this output's scale.

    ## What it does
    For the first seed's reference output `y`, computes the share of elements where
    `atol > rtol*|y|` and the relative error the check allows at the median element,
    `(atol + rtol*median|y|) / median|y|`. The rule fires when the absolute part wins on at least
    half of the elements and the median element's allowed relative error is at least 10 times
    `rtol` (always, if `rtol` is 0). The message gives max|y|, the share and a scale-invariant
    replacement: a relative L2 error threshold and a max|error|/max|y| threshold, each 10 times
    the gap between the native-dtype and float64 references (on the first seed's inputs), and at
    least 10 machine epsilons of the output dtype.

    ## Why is this bad?
    `allclose` with a fixed `atol` is meant for outputs of order one. On small outputs it accepts
    kernels that are wrong by orders of magnitude: a kernel for KernelBench level 2 problem 23 was
    accepted at tolerance 1e-4 with a relative L2 error of 74, because the reference's largest
    magnitude is 3e-8. A relative threshold scaled to the reference's own rounding error judges
    every output scale alike.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        # Softmax over 1024 normal logits: most probabilities are far below 1e-2.

        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.softmax(x, dim=-1)


    def get_inputs():
        return [torch.randn(16, 1024)]


    def get_init_inputs():
        return []
    ```
    (with `--tolerance kernelbench-v0`: atol 1e-2 outweighs rtol*|y| on every element)
    """

    code = "KP201"
    name = "absolute-tolerance-dominates"
    level = Level.WARNING
    precision = Precision.MEDIUM
    tags = ("benchmark-problem", "tolerance", "numerics")
