from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class ReferenceFailed(DynamicRule):
    """The kernel was not run: its reference problem failed.

    ## What it does
    Reported when the reference problem's own child process fails (import error, an exception in
    `Model(*get_init_inputs())`, `get_inputs()` or `forward`, a crash or a timeout), or returns no
    tensors. The candidate is then not run. `kaudit problems` audits the problem itself.

    ## Why is this bad?
    Without a reference output there is nothing to compare the kernel's output with.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):  # paired with a problem.py whose Model raises
        def forward(self, x):
            return torch.relu(x)
    ```
    """

    code = "KD503"
    name = "reference-failed"
    level = Level.NOTE
    precision = Precision.HIGH
    tags = ('dynamic', 'not-run')
