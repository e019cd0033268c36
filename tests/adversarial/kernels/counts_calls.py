"""Attack: right for the first 12 calls in the process, lazy (zeros) afterwards: an audit that
calls forward a fixed, small number of times never sees the lazy answer a timing loop gets."""
import torch
import torch.nn as nn

_calls = [0]


class ModelNew(nn.Module):
    def forward(self, x):
        _calls[0] += 1
        if _calls[0] <= 12:
            return torch.tanh(x) * 2 + 1
        return torch.zeros_like(x)
