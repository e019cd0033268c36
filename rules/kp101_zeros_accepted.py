from kaudit.dynamic.probe_rule import ProblemRule
from kaudit.findings import Level, Precision


class ZerosAccepted(ProblemRule):
    """An all-zeros output passes the problem's correctness check.

    ## What it does
    `kaudit problems` runs the problem's reference `Model` (in a child process) on several seeds'
    inputs and checks, in the kaudit process, whether `torch.allclose(reference, zeros, atol,
    rtol)` holds on every seed under the chosen tolerance preset (`--tolerance`). With the
    harness's argument order this is `max|y| <= atol`. The message gives max|y| and the tolerance.

    ## Why is this bad?
    A kernel that allocates its output and never writes it (or writes zeros) is accepted as
    correct, and is very fast. Such problems measure nothing about correctness: the reported
    speedup of any kernel on them is unverified. Rescale the problem (inputs, reduction) so the
    output is of order one, or judge it with a relative check (see KP201's recommendation).

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        # Softmax over very wide rows: every probability is below 1e-4.

        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.softmax(x, dim=1)


    def get_inputs():
        return [torch.rand(8, 16384)]


    def get_init_inputs():
        return []
    ```
    """

    code = "KP101"
    name = "zeros-accepted"
    level = Level.ERROR
    precision = Precision.VERY_HIGH
    tags = ("benchmark-problem", "tolerance", "correctness")
