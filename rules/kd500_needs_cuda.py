from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class NeedsCuda(DynamicRule):
    """The kernel was not run: it needs CUDA and this run has none.

    ## What it does
    Decided from the kernel's text before anything is compiled: `load_inline(..., cuda_sources=...)`,
    `cpp_extension.load` of `.cu` files, or Triton without `TRITON_INTERPRET=1`, while the dynamic
    pass runs on the CPU (`--device cpu`, or `auto` without a CUDA device). Also a Triton kernel
    that Triton's CPU interpreter cannot run because it needs a GPU driver (`@triton.autotune`
    benchmarks its configs on the device), seen when its job fails with Triton's "0 active
    drivers": the kernel is not at fault, so this is not KD501.

    ## Why is this bad?
    Nothing dynamic is known about a kernel that was not run; run the scan on a GPU machine.

    ## Example
    ```python
    import torch.nn as nn
    from torch.utils.cpp_extension import load_inline

    ext = load_inline(name="k", cpp_sources="torch::Tensor f(torch::Tensor x);",
                      cuda_sources="torch::Tensor f(torch::Tensor x) { return x; }",
                      functions=["f"])


    class ModelNew(nn.Module):
        def forward(self, x):
            return ext.f(x)
    ```
    """

    code = "KD500"
    name = "needs-cuda"
    level = Level.NOTE
    precision = Precision.HIGH
    tags = ('dynamic', 'not-run')
