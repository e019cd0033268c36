"""Attack: abuse the host: write files outside its folder (next to this file and in /tmp), print
100 MB to stdout, and leave a 256 MiB output file for the auditor to load in place of its
outputs."""
import glob
import hashlib
import os
import sys

import torch
import torch.nn as nn

TOKEN = hashlib.sha256(os.path.abspath(__file__).encode()).hexdigest()[:10]
OUTSIDE = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "written_outside.txt"),
           f"/tmp/outside-{TOKEN}.txt"]
_calls = [0]


def _write_outside():
    for path in OUTSIDE:
        try:
            with open(path, "w") as handle:
                handle.write("written by the kernel")
        except OSError:
            pass


def _flood_stdout():
    chunk = "x" * (1 << 20) + "\n"
    for _ in range(100):
        sys.stdout.write(chunk)
    sys.stdout.flush()


def _big_outputs():
    big = torch.zeros(64 << 20)  # 256 MiB of float32
    for path in glob.glob(os.path.join(os.getcwd(), "..", "*", "*.pt")):
        if "inputs" not in os.path.basename(path):
            try:
                torch.save([big], path)
            except Exception:  # a read-only file
                pass


class ModelNew(nn.Module):
    def forward(self, x):
        _calls[0] += 1
        if _calls[0] == 1:
            _write_outside()
            _flood_stdout()
        if _calls[0] == 3:
            _big_outputs()
        return torch.tanh(x) * 2 + 1
