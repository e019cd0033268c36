from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class InputMutation(DynamicRule):
    """forward modifies its inputs.

    ## What it does
    Compares the inputs after every call, bit for bit, with the inputs as `get_inputs()` produced
    them. Reported with the count of changed elements per input and the first call that changed
    them. An error; a warning when the reference problem's own forward modifies its inputs too
    (the reference job checks that), and nothing for an input the kernel leaves as the reference
    leaves it, within the tolerance (an `out=` buffer, an in-place operator the problem itself
    applies).

    ## Why is this bad?
    A harness that reuses its inputs for the reference, for a later trial or for timing runs then
    computes on different data; an input overwritten with the answer or with zeros can make a wrong
    kernel look right.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            out = torch.relu(x)
            x.zero_()
            return out
    ```
    """

    code = "KD402"
    name = "input-mutation"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ('dynamic', 'integrity')
