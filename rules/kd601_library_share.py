from kaudit.dynamic.kernel_rule import DynamicRule
from kaudit.findings import Level, Precision


class LibraryShare(DynamicRule):
    """Most of forward's GPU time is spent in library kernels, not in the submission's own.

    ## What it does
    On CUDA, for a kernel that passed the dynamic checks, a separate plain run records a few calls
    of `forward` with `torch.profiler` (CPU and CUDA activity) and attributes every GPU kernel
    forward launched: the submission's own (a `__global__` kernel of its extension sources or a
    `@triton.jit` function of the file, by name; or a kernel of no known library launched by the
    submission's code rather than by an ATen op) or a library's (ATen `at::native`, cuBLAS and
    cuBLASLt `gemm` / `xmma` / `nvjet`, CUTLASS, cuDNN, Triton kernels the file does not define,
    copies and fills). The message gives the library share of forward's GPU time and the top
    kernels; `metrics` holds the table (name, class, microseconds, launches, share).

    When the file claims a custom kernel (it builds an extension or defines a CUDA or Triton
    kernel) and its own kernels take under 10 % of forward's GPU time, the real work is a
    fallback, however it was spelled: an error under `--policy strict`, a warning under
    `--policy kernelbench` (which allows library calls beside a custom kernel: a cuBLAS GEMM with
    a fused epilogue is an honest level-2 answer, and the share alone cannot tell it from a token
    kernel). Otherwise, when libraries take 5 % or more: a warning under
    `--policy strict` (no library compute allowed); under `--policy kernelbench`, for a file that
    claims a custom kernel, a note naming the share (a partial replacement KernelBench allows).
    Kernels launched during forward by other threads count for KD602, not here.

    ## Why is this bad?
    A static reading of the source sees what the file says; the profiler sees what the GPU ran. A
    token kernel (a bias add, a copy) next to a cuBLAS matmul or a cuDNN convolution passes a
    presence check, and its speedup is the library's. Atrex-Bench found much of the apparent pass
    rate of generated kernels came from PyTorch fallbacks.

    ## Example
    ```python
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def add_bias_kernel(x_ptr, b_ptr, n, N: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(x_ptr + offs, x + tl.load(b_ptr + offs % N, mask=mask), mask=mask)


    class ModelNew(nn.Module):
        def forward(self, a, w, b):
            out = a @ w  # the matmul the kernel claims: cuBLAS, 99 % of the GPU time
            add_bias_kernel[(triton.cdiv(out.numel(), 1024),)](out, b, out.numel(),
                                                              N=out.shape[1], BLOCK=1024)
            return out
    ```
    """

    code = "KD601"
    name = "library-share"
    level = Level.WARNING
    precision = Precision.MEDIUM
    tags = ('dynamic', 'fallback', 'profiler')
