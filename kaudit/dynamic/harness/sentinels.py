"""Keyed sentinel patterns for the write-coverage probe (KD101/KD102), shared by the candidate job
(which fills fresh allocations with them) and the parent process (which regenerates them from the
same key to find them in outputs).

Each poisoned run r has, per dtype, a palette of PALETTE bit patterns drawn from a generator seeded
by the scan's key: for floating dtypes a third NaNs with random payloads, a third large negative
and a third large positive finite values (the classes); for integer dtypes random values. Runs 0,
1 and 2 have disjoint palettes; run 3 repeats run 0 exactly. An allocation is filled from a tile
of TILE values, rotated by an offset drawn from the key and the allocation's number: every tile
position holds a value of a different class in each of runs 0, 1 and 2 (a random permutation per
position), so that an accumulator started from fresh memory shows its dependence in some run
(a running maximum in the run where it started from a large negative value), while no run's fresh
memory is one repeated value, nor all NaN, nor the same sequence twice. The parent, knowing the
key, knows every value a run can leave behind.

An output element that holds a value of run r's palette in every run r was never written: a written
element holds the same value in every run, and no value is in two palettes. bool and complex
tensors, and float8 types, are not poisoned. Outputs are compared as integer bit patterns
(`as_bits`), so a NaN payload is matched exactly.
"""

from __future__ import annotations

import functools
import hashlib

import torch

#: poisoned runs: 0, 1, 2 with three palettes, 3 repeats run 0
RUNS = 4
REPEAT_OF = {3: 0}
#: guard zone on each side of a guarded allocation (KD103, `poison`); a multiple of 512 bytes, so
#: the handed-out middle keeps the caching allocator's alignment
GUARD_BYTES = 16 * 1024
#: values per run and dtype; indices in a fill tile
PALETTE = 48
TILE = 4096
_INT_OF_SIZE = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
#: (exponent bits, mantissa bits) of the poisoned floating dtypes
_FLOAT_LAYOUT = {torch.float64: (11, 52), torch.float32: (8, 23), torch.float16: (5, 10),
                 torch.bfloat16: (8, 7)}


def sentinel_run(run: int) -> int:
    return REPEAT_OF.get(run, run)


def bits_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """The integer dtype of the same width, for bit views of floating tensors."""
    if dtype.is_floating_point:
        return _INT_OF_SIZE.get(torch.empty(0, dtype=dtype).element_size())
    return None


def poisoned(dtype: torch.dtype) -> bool:
    if dtype.is_floating_point:
        return dtype in _FLOAT_LAYOUT
    return not (dtype.is_complex or dtype == torch.bool)


def _seed(key: str, *parts: object) -> int:
    text = "\0".join([key, *map(str, parts)]).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") & ((1 << 63) - 1)


@functools.lru_cache(maxsize=256)
def palettes(dtype: torch.dtype, key: str) -> tuple[torch.Tensor, ...] | None:
    """Per distinct run (0, 1, 2), PALETTE distinct bit patterns (a CPU tensor of `bits_dtype`,
    or of `dtype` itself for integers), no pattern in two runs; None for dtypes not poisoned."""
    if not poisoned(dtype):
        return None
    generator = torch.Generator().manual_seed(_seed(key, "palette", dtype))
    taken: set[int] = set()
    runs = []
    for _ in range(3):
        values: list[int] = []
        while len(values) < PALETTE:
            candidate = _draw(dtype, generator, len(values) % 3)
            if candidate not in taken:
                taken.add(candidate)
                values.append(candidate)
        storage = bits_dtype(dtype) if dtype.is_floating_point else dtype
        runs.append(torch.tensor(values, dtype=storage))
    return tuple(runs)


def _draw(dtype: torch.dtype, generator: torch.Generator, kind: int) -> int:
    """One candidate pattern: kind 0 a NaN with a random payload, 1 a large negative, 2 a large
    positive finite value (floating dtypes); a random value (integers)."""
    def bits(count: int) -> int:
        return int(torch.randint(0, 1 << count, (1,), generator=generator)) if count else 0

    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        width = info.bits
        value = bits(min(width, 62)) | (bits(width - 62) << 62 if width > 62 else 0)
        return value + info.min if info.min < 0 else value
    exponent_bits, mantissa_bits = _FLOAT_LAYOUT[dtype]
    top = (1 << exponent_bits) - 1
    if kind == 0:  # quiet NaN, random sign and payload
        sign, exponent = bits(1), top
        mantissa = (1 << (mantissa_bits - 1)) | bits(mantissa_bits - 1)
    else:  # finite, exponent in the top quarter of the range
        sign = 1 if kind == 1 else 0
        quarter = max(1, top // 4)
        exponent = top - 1 - bits(max(1, quarter.bit_length() - 1))
        mantissa = bits(mantissa_bits)
    width = 1 + exponent_bits + mantissa_bits
    raw = (sign << (width - 1)) | (exponent << mantissa_bits) | mantissa
    return raw - (1 << width) if raw >= 1 << (width - 1) else raw  # as the signed bits dtype


def palette(dtype: torch.dtype, run: int, key: str) -> torch.Tensor | None:
    found = palettes(dtype, key)
    return None if found is None else found[sentinel_run(run)]


@functools.lru_cache(maxsize=256)
def _tile(dtype: torch.dtype, run: int, key: str, device: str) -> torch.Tensor | None:
    """Two copies of run's fill tile, back to back (so any rotation is one slice)."""
    values = palette(dtype, run, key)
    if values is None:
        return None
    run = sentinel_run(run)
    classes = torch.argsort(torch.rand(TILE, 3, generator=torch.Generator().manual_seed(
        _seed(key, "classes", dtype))), dim=1)[:, run]
    generator = torch.Generator().manual_seed(_seed(key, "tile", run, dtype))
    within = torch.randint(0, PALETTE // 3, (TILE,), generator=generator)
    tile = values[3 * within + classes]
    return torch.cat([tile, tile]).to(device)


#: the dtypes whose fill tiles are made on a run's device before its calls (`warm_tiles`)
COMMON_DTYPES = (*_FLOAT_LAYOUT, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def warm_tiles(run: int, key: str, device: torch.device) -> None:
    """Make run's fill tiles on `device` before its calls: a tile made during a CUDA graph
    capture is copied from host memory, which a capture does not permit; the capture is then
    invalid and the kernel fails (KD501) through no fault of its own."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    for dtype in COMMON_DTYPES:
        _tile(dtype, sentinel_run(run), key, str(device))


def fill(tensor: torch.Tensor, run: int, key: str, salt: int = 0) -> bool:
    """Fill a freshly allocated tensor with run's pattern, rotated by `salt` (the allocation's
    number: the same allocation gets the same rotation in every run); False when its dtype is
    not poisoned."""
    if tensor.numel() == 0:
        return False
    tile = _tile(tensor.dtype, sentinel_run(run), key, str(tensor.device))
    if tile is None:
        return False
    target = tensor.view(bits_dtype(tensor.dtype)) if tensor.dtype.is_floating_point else tensor
    flat = target.reshape(-1) if target.is_contiguous() else None
    offset = _seed(key, "offset", salt) % TILE
    pattern = tile[offset:offset + TILE]
    if flat is None:  # a strided allocation: element-wise, through a contiguous copy
        count = target.numel()
        whole = pattern.repeat(-(-count // TILE))[:count]
        target.copy_(whole.view(target.shape))
        return True
    count = flat.numel()
    rows = count // TILE
    if rows:
        flat[:rows * TILE].view(rows, TILE).copy_(pattern.expand(rows, TILE))
    if count - rows * TILE:
        flat[rows * TILE:].copy_(pattern[:count - rows * TILE])
    return True


def in_palette(bits: torch.Tensor, dtype: torch.dtype, run: int, key: str) -> torch.Tensor:
    """Bool mask: which elements of `bits` (from `as_bits` of a `dtype` tensor) hold a value of
    run's palette (all False for dtypes not poisoned)."""
    values = palette(dtype, run, key)
    if values is None:
        return torch.zeros(bits.shape, dtype=torch.bool, device=bits.device)
    return torch.isin(bits, values.to(bits.device))


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
