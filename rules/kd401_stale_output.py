from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class StaleOutput(DynamicRule):
    """A second call with new inputs returns the first call's answer.

    ## What it does
    After a first call that matches the reference, calls the same model with the inputs of another
    seed, first in new buffers and then copied into the first call's buffers. Reported when an answer
    matches the first inputs' reference but not the new inputs' (and the two references differ): the
    kernel replays a result cached by pointer, shape or call count (or a CUDA graph captured on the
    first call's buffers), or, in the first call's buffers, reads them before the caller's copy into
    them is done (work on a side stream that does not wait for the current one). The message names
    the buffers, and so which of these can explain it.

    ## Why is this bad?
    A harness that calls once per trial with inputs of the same shape at the same addresses cannot
    tell a replayed answer from a computed one, and the timing measures a copy.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.cache = {}

        def forward(self, x):
            key = x.data_ptr()
            if key not in self.cache:
                self.cache[key] = torch.tanh(x)
            return self.cache[key]
    ```
    """

    code = "KD401"
    name = "stale-output"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ('dynamic', 'caching', 'integrity')
