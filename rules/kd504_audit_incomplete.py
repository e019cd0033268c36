from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class AuditIncomplete(DynamicRule):
    """The kernel's dynamic audit did not complete, through no fault of the kernel.

    ## What it does
    Reported when a job of the kernel's audit could not write its files because the disk (or a
    quota) was full or the scan's temporary files reached its limit (`--temp-limit`), or when
    kaudit itself failed while auditing the kernel (an error writing its own temporary files, an
    internal error), or when the kernel's job timed out where it compiles an extension (a
    kernel that compiles anew for every model it builds, six times in the candidate job, may
    not finish within `--timeout`: audit it with a longer one; a construction or import that
    never ends without an extension in the text is KD501). The message gives the reason. The
    scan goes on with
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
