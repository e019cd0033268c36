from kaudit.dynamic.probe_rule import ProblemRule
from kaudit.findings import Level, Precision


class ProblemNotRun(ProblemRule):
    """The problem could not be imported, built or run, so its check was not audited.

    ## What it does
    Reports a problem whose child process failed: the file does not import, is not a KernelBench
    problem (`Model`, `get_inputs`, `get_init_inputs`), `Model(*get_init_inputs())` or `forward`
    raises, `forward` returns something other than tensors or numbers, the output's shape changes
    with the seed, the run exceeds `--timeout`, runs out of memory or crashes (a signal), or its
    files take the scan's temporary disk over `--temp-limit`. On a GPU, a run that ran out of
    memory beside other jobs is first run again alone on the GPU (no other kaudit job of the user
    on it); only a second failure is reported, with the memory that was free. The message gives
    the phase and the error; the finding's metrics hold the tail of its stderr.
    The rest of the audit goes on.

    ## Why is this bad?
    Nothing is known about the check of a problem that does not run, and a benchmark problem that
    fails on its own reference cannot judge any kernel.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self, channels, groups):
            super().__init__()
            self.norm = nn.GroupNorm(groups, channels)  # 10 channels in 4 groups: ValueError

        def forward(self, x):
            return self.norm(x)


    def get_inputs():
        return [torch.rand(2, 10, 8, 8)]


    def get_init_inputs():
        return [10, 4]
    ```
    """

    code = "KP501"
    name = "problem-not-run"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ("benchmark-problem", "input")
