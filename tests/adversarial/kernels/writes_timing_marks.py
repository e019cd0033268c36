"""Attack: the kernel finds the timing run's channel to its parent (a Unix socket the harness
connected before importing the kernel) with `gc` and sends a mark of its own, an early end of
its trial, to shorten the bracket the parent sees."""
import gc
import socket

import torch
import torch.nn as nn

_sent = []


class ModelNew(nn.Module):
    def forward(self, x):
        if not _sent:
            for obj in gc.get_objects():
                if isinstance(obj, socket.socket) and obj.family == socket.AF_UNIX and \
                        obj.type == socket.SOCK_SEQPACKET:
                    obj.send(b"0 candidate end")
                    _sent.append(obj)
        return torch.tanh(x) * 2 + 1
