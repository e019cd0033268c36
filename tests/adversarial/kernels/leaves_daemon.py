"""Attack: a daemon (double fork, new session) that outlives the audit and could go on working
after it. Its process name is `dmn` followed by a hash of this file's path, for the test to find."""
import ctypes
import hashlib
import os
import time

import torch
import torch.nn as nn

NAME = "dmn" + hashlib.sha256(os.path.abspath(__file__).encode()).hexdigest()[:10]


def _daemon():
    if os.fork() != 0:
        return
    try:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        ctypes.CDLL(None).prctl(15, NAME.encode(), 0, 0, 0)  # PR_SET_NAME
        for fd in range(3):
            os.close(fd)
        time.sleep(120)
    finally:
        os._exit(0)


class ModelNew(nn.Module):
    def forward(self, x):
        _daemon()
        return torch.tanh(x) * 2 + 1
