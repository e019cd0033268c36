from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class SpeedupNotReproduced(DynamicRule):
    """The speedup the benchmark run claims is not what kaudit measures.

    ## What it does
    With `--timing` (on by default with `--dynamic` on CUDA; `--timing on` on the CPU), times the
    reference problem and the kernel in one job on one device, the robust way: warm-up calls,
    fresh input buffers with new values for every trial, the L2 cache flushed before each call
    (CUDA), the whole device synchronised, CUDA events checked against the wall clock, reference
    and kernel alternating, the trial count chosen for a stable median. The speedup is the
    reference's median over the kernel's. Reported when the speedup the results tree claims (its
    `speedup`, or `--baseline-timings` over its runtime) exceeds the measured one by more than
    `--speedup-tolerance` (default 1.5x): a warning, an error when the claim is over 2x and the
    measurement under 1.1x by the medians, unless the claimed runtime is over 5x the measured
    one (the claim was timed on larger inputs, as KernelBenchX times at its template's sizes).
    On CUDA each kernel is timed alone on its GPU, holding its lock (`measured.alone`). Where
    it was not (no usable lock folder, the CPU), other work adds its time to the trials of both
    sides and pulls the medians' ratio towards 1, so the error also needs each side's fastest
    trial to show no speedup: a speedup that only the fastest trials show is a warning. The
    verdict's `measured` record holds the numbers (median and IQR in ms, trials, method,
    device, `fastest_speedup`, `alone`).

    ## Why is this bad?
    Speedups are what benchmark submissions are ranked by. A claim that does not reproduce came
    from a timing the kernel fooled (work on a side stream the timer did not wait for, outputs
    cached between the harness's identical trials, a warm cache), from another machine, or from
    noise; a paper that re-timed its kernels found most claims smaller, one of 283x wrote 0.3 % of
    its output. Different GPUs give different speedups: compare on the hardware of the claim.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        # claimed 5x in eval_results.json; the same operator, measured at 1.0x
        def forward(self, x):
            return torch.tanh(x)
    ```
    """

    code = "KD701"
    name = "speedup-not-reproduced"
    level = Level.WARNING
    precision = Precision.MEDIUM
    tags = ('dynamic', 'speed')
