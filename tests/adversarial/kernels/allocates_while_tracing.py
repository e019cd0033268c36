"""Attack: allocates its output inside a `torch.jit.trace` call, where kaudit's poisoning is off
(tracing runs with the dispatch modes off, or the tracer would record outputs as constants),
and writes only its first row: the rest is whatever the allocator hands back, unpoisoned."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        made = []

        def allocate(t):
            made.append(torch.empty_like(t))  # unpoisoned: inside the trace
            return t

        torch.jit.trace(allocate, x, check_trace=False)
        out = made[0]
        out[0] = torch.tanh(x[0]) * 2 + 1
        return out
