from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class AuditIncomplete(DynamicRule):
    """The kernel's dynamic audit did not complete, through no fault of the kernel.

    ## What it does
    Reported when a job of the kernel's audit could not write its files because the disk (or a
    quota) was full or the scan's temporary files reached its limit (`--temp-limit`), or when
    kaudit itself failed while auditing the kernel (an error writing its own temporary files, an
    internal error). The message gives the reason. The scan goes on with
    the next kernel; the kernel's static findings are kept.

    ## Why is this bad?
    A kernel whose dynamic audit did not complete has not been audited: its result must not be
    read as a pass. Free some space (or fix the error) and scan again.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):  # audited while the temporary folder's disk was full
        def forward(self, x):
            return torch.relu(x)
    ```
    """

    code = "KD504"
    name = "audit-incomplete"
    level = Level.WARNING
    precision = Precision.HIGH
    tags = ('dynamic', 'not-run')
