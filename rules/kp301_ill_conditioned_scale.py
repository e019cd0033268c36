from kaudit.dynamic.probe_rule import ProblemRule
from kaudit.findings import Level, Precision


class IllConditionedScale(ProblemRule):
    """The reference is ill-conditioned when its inputs are scaled by a listed factor.

    ## What it does
    Runs the reference on the first seed's floating-point inputs multiplied by each factor of
    `--scales` (default 1e-3, 1, 1e3), once in the native dtype and once in float64 (model and
    inputs cast), and reports a scale where the two disagree beyond the thresholds recommended at
    scale 1 (see KP201), where the native output overflows to Inf/NaN while float64 stays finite,
    or where even the float64 reference is not finite.

    ## Why is this bad?
    At such a scale the reference itself is wrong in its own dtype (naive `exp`, `log(1 + x)`,
    cancellations), so a kernel that disagrees with it may be the more accurate one. The dynamic
    pass, which probes kernels with scaled inputs, must not blame kernels there; benchmark
    maintainers should know the problem's safe input range.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        # Softmax without subtracting the row maximum.

        def __init__(self):
            super().__init__()

        def forward(self, x):
            e = torch.exp(x)
            return e / e.sum(dim=-1, keepdim=True)


    def get_inputs():
        return [torch.rand(64, 16) * 0.25]


    def get_init_inputs():
        return []
    ```
    (at scale 1e3 float32 `exp` overflows, float64 does not)
    """

    code = "KP301"
    name = "ill-conditioned-scale"
    level = Level.NOTE
    precision = Precision.MEDIUM
    tags = ("benchmark-problem", "numerics")
