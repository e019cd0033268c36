from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class WrongOutput(DynamicRule):
    """The output does not match the reference problem's output.

    ## What it does
    Compares the kernel's output with the reference problem's output on the same inputs (same
    `get_init_inputs()`, same seed, `Model`'s weights copied into `ModelNew` where names and shapes
    match). Reported when the number, shape or dtype of the outputs differ, or when the output fails
    both the preset's `allclose` and the scale-invariant check (relative L2 error and max error / max
    |reference|, limits by dtype as in KD201). Not reported when KD101/KD102 already explain it.
    A warning, saying so, where the reference output is rounding noise (as in KD201). The first
    call on the second input set (inputs B, in new buffers) is held to the same two checks once
    inputs A's output passed: a kernel right on the first inputs it meets and wrong after fails
    there (`reason: inputs-b`).

    A warning too when the kernel is wrong with `Model`'s weights copied in but right on two
    input sets with its own initialisation, built as KernelBench builds it (same seed, nothing
    copied): an `__init__` that folds a constant into a parameter. The kernel is then judged, and
    run for the plain run, shape sweep and timing, on its own initialisation; the later-call,
    same-buffer and input-scale checks are not made for it, and the warning says so.

    ## Why is this bad?
    A kernel that computes something else is not a faster version of the reference, whatever its
    speed.

    ## Example
    ```python
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            return torch.sigmoid(x)  # the reference computes tanh
    ```
    """

    code = "KD202"
    name = "wrong-output"
    level = Level.ERROR
    precision = Precision.HIGH
    tags = ('dynamic', 'correctness')
