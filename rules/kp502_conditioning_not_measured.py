from kaudit.dynamic.probe_rule import ProblemRule
from kaudit.findings import Level, Precision


class ConditioningNotMeasured(ProblemRule):
    """The float64 reference or a scaled run could not be made, so thresholds are missing.

    ## What it does
    Notes a problem whose native runs worked but whose float64 twin (a deep copy of the model cast
    with `.to(torch.float64)`, fed float64 inputs) failed, returned a lower-precision output, or
    whose runs at a listed input scale failed or did not finish within `--timeout`. The probes
    KP101-KP104 are still reported; the recommended thresholds (KP201) and the conditioning probe
    (KP301) are missing where the message says.

    ## Why is this bad?
    Without a float64 reference the audit cannot say how precise a kernel must be, and the
    dynamic pass has no safe threshold for this problem. Typical causes: a model that casts to
    half precision inside `forward`, tensors kept as plain attributes (not parameters or buffers),
    ops without a float64 implementation on the device.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        # Matrix product computed in bfloat16 whatever the inputs' dtype.

        def __init__(self):
            super().__init__()

        def forward(self, a, b):
            return torch.matmul(a.to(torch.bfloat16), b.to(torch.bfloat16))


    def get_inputs():
        return [torch.randn(32, 64), torch.randn(64, 32)]


    def get_init_inputs():
        return []
    ```
    """

    code = "KP502"
    name = "conditioning-not-measured"
    level = Level.NOTE
    precision = Precision.HIGH
    tags = ("benchmark-problem", "numerics")
