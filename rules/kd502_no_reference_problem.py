from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class NoReferenceProblem(DynamicRule):
    """The kernel was not run: no reference problem was found for it.

    ## What it does
    Reported when none of the pairing rules finds a problem: `--problem FILE`; the reference a
    results tree names; a sibling `problem.py`, `ref_code.py` or `reference.py`; a KernelBench name
    `level_<L>_problem_<P>_...` (or `level_<L>/problem_<P>.py`) found as `ROOT/level<L>/<P>_*.py`
    under `--problems ROOT`.

    ## Why is this bad?
    Without the reference there is nothing to compare the kernel's output with.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):  # no problem.py next to it, no --problem
        def forward(self, x):
            return torch.relu(x)
    ```
    """

    code = "KD502"
    name = "no-reference-problem"
    level = Level.NOTE
    precision = Precision.HIGH
    tags = ('dynamic', 'not-run')
