from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class NoGpuWork(DynamicRule):
    """forward launched no GPU kernel, while the reference problem's forward does.

    ## What it does
    On CUDA, in the profiled plain run of a kernel that passed the dynamic checks (see KD601), counts
    the GPU kernels launched (from any thread) between forward's call and its return, over a few
    calls, and the same for the reference problem. Reported when the reference launches kernels and
    the candidate none: its answer was copied into place (a `memcpy` is not a kernel), computed on
    the host, cached, or left to another thread. The message gives both counts and the copies the
    candidate made. A warning, not an error, when the reference gave the same answer, bit for
    bit, for both input sets: a problem whose answer does not depend on its inputs (CUDA-L1
    level 2 task 83 clamps `min(x, 0)` to [0, 1]: all zeros) is answered rightly without work,
    and the problem is at fault (`kaudit problems`, KP103).

    ## Why is this bad?
    A GPU benchmark times the kernels forward launches. A forward that launches none did its work
    somewhere the timer does not look: an answer cached from an earlier call, a result computed on
    the CPU and copied over, or a daemon thread that launches after forward returned. Its speedup
    measures nothing.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            # the work on the host, the answer copied to the GPU: no kernel runs
            return torch.relu(x.cpu()).to(x.device)
    ```
    """

    code = "KD602"
    name = "no-gpu-work"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ('dynamic', 'integrity', 'profiler')
