from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class HarnessTamperingAtRun(DynamicRule):
    """The kernel changed, while it ran, what the harness relies on.

    ## What it does
    Before the kernel file is imported, the candidate job records what it relies on: its own
    functions and classes as `sys.modules` holds them, `torch.save`/`torch.load` and the
    serialisation and pickling behind them, the tensor methods and torch functions it calls,
    `threading.Thread.start`, `torch.nn.Module.__call__`, the builtins it uses. After every call it
    compares: anything rebound (in `sys.modules`, with `setattr`, by replacing a function's
    `__code__`), a dispatch or torch function mode left pushed, or a profile or trace hook set is
    reported, by name. The harness itself calls the references it captured first, so the kernel's
    replacement does not decide what is saved. Also reported: an output file of the job larger than
    the tensors it should hold (not loaded).

    In the timing run (`--timing`) the same for the timer, the events and the synchronise; and the
    job marks each trial's start and end on a socket it connected before the kernel was imported,
    stamped by the operating system as sent: marks that are not exactly the trials', or reported
    times outside the stamped brackets, are reported (the times were rewritten), and more time
    between two of the candidate's trials than between two of the reference's is a warning (work
    moved out of the timed calls).

    ## Why is this bad?
    A harness runs in the kernel's process; a kernel that replaces its save function, its
    comparison or its timer, or rewrites the times it was measured at, decides its own verdict
    and speedup, and one that patches `torch.save` or `Module.__call__` in a benchmark's process
    rewrites the reference's answer too.

    ## Example
    ```python
    import sys

    import torch
    import torch.nn as nn

    _real_save = torch.save
    setattr(sys.modules["torch"], "save", lambda obj, f, *a, **k: _real_save(obj, f, *a, **k))


    class ModelNew(nn.Module):
        def forward(self, x):
            return torch.zeros_like(x)
    ```
    """

    code = "KD405"
    name = "harness-tampering-at-run"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ('dynamic', 'integrity', 'tampering')
