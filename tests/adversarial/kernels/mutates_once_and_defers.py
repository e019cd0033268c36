"""Attack: modifies its input on the first call only, and leaves a timer thread that writes the
output again 0.15 s after forward returned (here the same values: only the deferred work shows)."""
import threading

import torch
import torch.nn as nn

_calls = [0]


class ModelNew(nn.Module):
    def forward(self, x):
        _calls[0] += 1
        out = torch.tanh(x) * 2 + 1
        if _calls[0] == 1:
            x.mul_(0.5)
        answer = out.clone()
        threading.Timer(0.15, lambda: out.copy_(answer)).start()
        return out
