from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class OnlyRightWhenWatched(DynamicRule):
    """The kernel gives the right answer only while it is being audited.

    ## What it does
    When the candidate job's calls gave the reference's answer, the kernel is run once more, as a
    benchmark harness would run it: a plain process (a small file that imports only torch; no
    poisoning, no guard zones, no checks between calls), a few calls on the first inputs. An output
    of that run that fails the scale-invariant check against the reference, or a plain run that
    fails, is reported with the call and the error.

    ## Why is this bad?
    A kernel can look for signs of an audit (fresh memory holding sentinel values, an auditor's
    modules, arguments or environment, patched functions) and compute the right answer only then.
    Its benchmark results are those of the plain run.

    ## Example
    ```python
    import sys

    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            if any("audit" in name for name in sys.modules):
                return torch.relu(x)
            return torch.zeros_like(x)
    ```
    """

    code = "KD406"
    name = "only-right-when-watched"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ('dynamic', 'integrity', 'evasion')
