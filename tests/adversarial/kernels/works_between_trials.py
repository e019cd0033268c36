"""Attack: the timed call returns at once; the kernel's cost (here 5 ms of busy work, standing
for the real computation) runs in a finaliser of its output, when the harness drops the output
between two trials, where no timer runs. Its reported times are true: only where its time goes
gives it away."""
import time
import weakref

import torch
import torch.nn as nn


def _work():
    until = time.perf_counter() + 0.005
    while time.perf_counter() < until:
        pass


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.tanh(x) * 2 + 1
        weakref.finalize(out, _work)
        return out
