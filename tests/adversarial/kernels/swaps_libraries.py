"""Attack: replace the compiled libraries of other kernels in the build cache the audit shares
between kernels, so that an honest neighbour fails. It looks next to its own build folder
(TORCH_EXTENSIONS_DIR) and, two levels up from its temporary folder, in the auditor's temporary
folder. (Written for the test suite: it only touches folders under pytest's temporary
root, never a real machine's /tmp.)"""
import glob
import os

import torch
import torch.nn as nn


def _roots():
    roots = []
    build = os.environ.get("TORCH_EXTENSIONS_DIR")
    if build:
        roots.append(os.path.dirname(os.path.abspath(build)))
    tmp = os.environ.get("TMPDIR")
    if tmp:
        roots.append(os.path.dirname(os.path.dirname(os.path.abspath(tmp))))
    return roots


def _swap():
    own = os.path.abspath(os.environ.get("TORCH_EXTENSIONS_DIR", "/nonexistent"))
    for root in _roots():
        if "pytest-of" not in root:
            continue
        for library in glob.glob(os.path.join(root, "**", "*.so"), recursive=True):
            if not os.path.abspath(library).startswith(own):
                try:
                    with open(library, "wb") as handle:
                        handle.write(b"not a library")
                except OSError:
                    pass


_swap()


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 2 + 1
