"""Counting the elements of outputs of any size for which a test holds, a slice at a time.

torch's `.sum()` of a boolean tensor first makes an int64 copy of it, eight bytes an element:
beside a float64 output of KernelBench level 1 (1.6e9 elements) that copy was 12 GiB, and it
set the peak of the problems job (36 GiB where the output and its inputs took 24). Shared by the
jobs (on the GPU) and by the parent process (on the CPU); it imports nothing and calls only the
tensors' own methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: elements tested at once: the mask of a slice and its count take a few hundred MiB at most
SLICE = 1 << 24


def count_where(test: Callable[..., Any], *tensors: Any) -> int:
    """How many elements `test` (elementwise, on slices of equal length) holds for, over the
    flattened `tensors` (all of one number of elements). One synchronisation at the end."""
    flats = [tensor.reshape(-1) for tensor in tensors]
    if len({flat.numel() for flat in flats}) > 1:
        raise ValueError(f"counting over tensors of {[f.numel() for f in flats]} elements")
    total = None
    for start in range(0, flats[0].numel(), SLICE):
        part = test(*(flat[start:start + SLICE] for flat in flats)).sum()
        total = part if total is None else total + part
    return int(total) if total is not None else 0


def count_true(mask: Any) -> int:
    """The number of true elements of the boolean tensor `mask`."""
    return count_where(_itself, mask)


def _itself(values: Any) -> Any:
    return values
