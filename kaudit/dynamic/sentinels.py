"""Sentinel bit patterns for the write-coverage probe (KD101/KD102), shared by the candidate child
(which fills fresh allocations with them) and the kaudit process (which looks for them in outputs).

Run 0 and the repeat run (3) use a NaN with a rare payload, run 1 a large negative and run 2 a
large positive finite value, per floating dtype; integer dtypes get distinctive values (a 0x5A
byte pattern, min + 3, max - 3). bool and complex tensors are not poisoned. Outputs are compared
as integer bit patterns (`as_bits`), so a NaN payload is matched exactly.
"""

from __future__ import annotations

import functools

import torch

#: poisoned runs: 0, 1, 2 with three sentinels, 3 repeats run 0's sentinel
RUNS = 4
REPEAT_OF = {3: 0}
#: guard zone on each side of a guarded allocation (KD103, `kaudit.dynamic.poison`); a multiple
#: of 512 bytes, so the handed-out middle keeps the caching allocator's alignment
GUARD_BYTES = 16 * 1024
_NAN_BITS = {torch.float64: 0x7FFA5A5A5A5A5A5A, torch.float32: 0x7FDA5A5A,
             torch.float16: 0x7E5A, torch.bfloat16: 0x7FDA}
_INT_OF_SIZE = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
#: share of the dtype's largest finite value used as the finite sentinels
_FINITE_SHARE = 0.6180339887


def sentinel_run(run: int) -> int:
    return REPEAT_OF.get(run, run)


def bits_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """The integer dtype of the same width, for bit views of floating tensors."""
    if dtype.is_floating_point:
        return _INT_OF_SIZE.get(torch.empty(0, dtype=dtype).element_size())
    return None


@functools.cache
def fill_value(dtype: torch.dtype, run: int) -> int | None:
    """What `fill_` writes for `run`: bits (through an integer view) for floating dtypes, the value
    itself for integer dtypes; None for dtypes that are not poisoned."""
    run = sentinel_run(run)
    if dtype.is_floating_point:
        if dtype not in _NAN_BITS:
            return None  # float8 and friends
        if run == 0:
            return _to_signed(_NAN_BITS[dtype], torch.empty(0, dtype=dtype).element_size())
        value = torch.finfo(dtype).max * _FINITE_SHARE * (-1 if run == 1 else 1)
        return int(torch.tensor([value], dtype=dtype).view(bits_dtype(dtype))[0])
    if dtype.is_complex or dtype == torch.bool:
        return None
    try:
        info = torch.iinfo(dtype)
    except TypeError:
        return None
    if run == 0:
        size = torch.empty(0, dtype=dtype).element_size()
        value = int.from_bytes(b"\x5a" * size, "little")
        return value if info.min < 0 else min(value, info.max)
    return info.min + 3 if run == 1 else info.max - 3


def fill(tensor: torch.Tensor, run: int) -> bool:
    """Fill a freshly allocated tensor with run's sentinel; False when its dtype is not poisoned."""
    if tensor.numel() == 0:
        return False
    value = fill_value(tensor.dtype, run)
    if value is None:
        return False
    target = tensor.view(bits_dtype(tensor.dtype)) if tensor.dtype.is_floating_point else tensor
    target.fill_(value)
    return True


def as_bits(tensor: torch.Tensor) -> torch.Tensor:
    """An integer tensor holding the elements' bit patterns (integers: the values)."""
    tensor = tensor.detach().contiguous()
    if tensor.dtype.is_floating_point and bits_dtype(tensor.dtype) is not None:
        return tensor.view(bits_dtype(tensor.dtype))
    if tensor.dtype == torch.bool:
        return tensor.to(torch.uint8)
    if tensor.is_complex():
        return torch.view_as_real(tensor).contiguous().view(
            _INT_OF_SIZE[tensor.element_size() // 2]).reshape(*tensor.shape, 2)[..., 0]
    return tensor


def _to_signed(value: int, size: int) -> int:
    bits = 8 * size
    return value - (1 << bits) if value >= 1 << (bits - 1) else value
