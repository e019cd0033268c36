from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class SideStreamOutput(DynamicRule):
    """The output is still being computed on another CUDA stream when forward returns.

    ## What it does
    On CUDA, in each poisoned run (outputs start as sentinels), copies forward's outputs on the
    current stream right after forward returns, then synchronises the device and compares. Elements
    that differ were written by work the current stream does not wait for: a kernel launched on a
    side stream without `current_stream().wait_stream(...)` or an event. The message gives the
    number of differing elements and in how many runs the race showed.

    That probe observes a race. For a kernel that passed it, the profiled plain run (see KD601)
    decides from the trace: a kernel forward launched on a stream other than the caller's current
    stream, with no event wait on the current stream recorded after its launch, and no stream,
    event or device synchronise after it, before forward returned. An error when the caller's
    stream is not the legacy default stream, or when the GPU ran the caller's next work before
    that kernel had finished; a warning otherwise (a stream created blocking is ordered with the
    legacy default stream, and the trace does not say how a stream was created). The kernels,
    their streams and the caller's stream are in `metrics`.

    ## Why is this bad?
    Benchmark timers record events on the current stream. Work on a side stream is not timed, so
    the speedup is fictitious; a caller that reads the output on the current stream (as every
    PyTorch program does) can read it half-written. The probe observes a race, so a side-stream
    kernel faster than the copy can escape it; the profiler's trace does not depend on timing, and
    the static rule KA301 looks for the code pattern.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.side = torch.cuda.Stream()

        def forward(self, x):
            with torch.cuda.stream(self.side):
                return torch.tanh(x)  # never waited for on the current stream
    ```
    """

    code = "KD403"
    name = "side-stream-output"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ('dynamic', 'streams', 'integrity')
