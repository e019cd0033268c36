from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class WorkAfterReturn(DynamicRule):
    """forward returns before its work is done, or returns something that is not a plain tensor.

    ## What it does
    Reports forward returning a `torch.Tensor` subclass or an object that is not a tensor (or a
    sequence of tensors); output elements that change during a random delay of 0.25-0.75 s after
    forward returned and the device was synchronised; and Python threads started during any call
    (a `threading.Timer`, a `_thread` thread, a thread of any module) that are still running when
    forward returns, less torch's and triton's own and idle thread-pool workers. The message names
    the returned type, the number of elements that changed and the threads.

    ## Why is this bad?
    A harness times forward and compares what it returns. A lazy tensor subclass can do its work, or
    fake the comparison, only when it is inspected; a thread can finish the output after the timer
    stopped. Either way the measured time is not the time of the computation.

    ## Example
    ```python
    import threading
    import time

    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            out = torch.zeros_like(x)

            def finish():
                time.sleep(0.02)
                torch.tanh(x, out=out)

            threading.Thread(target=finish).start()
            return out
    ```
    """

    code = "KD404"
    name = "work-after-return"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ('dynamic', 'timing', 'integrity')
