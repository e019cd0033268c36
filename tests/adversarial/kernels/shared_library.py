"""An honest CPU kernel: C code compiled once into its build folder (TORCH_EXTENSIONS_DIR) and
called through ctypes; a second kernel with the same text reuses the build."""
import ctypes
import os
import subprocess

import torch
import torch.nn as nn

SOURCE = r"""
#include <math.h>
void tanh2(const float* x, float* out, long n) {
    for (long i = 0; i < n; ++i) out[i] = tanhf(x[i]) * 2.0f + 1.0f;
}
"""


def _library():
    folder = os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR", "."), "tanh2")
    os.makedirs(folder, exist_ok=True)
    library = os.path.join(folder, "tanh2.so")
    if not os.path.exists(library):
        source = os.path.join(folder, "tanh2.c")
        with open(source, "w") as handle:
            handle.write(SOURCE)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", source, "-o", library, "-lm"], check=True)
    return ctypes.CDLL(library)


_tanh2 = _library().tanh2


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        _tanh2(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
               ctypes.c_long(x.numel()))
        return out
