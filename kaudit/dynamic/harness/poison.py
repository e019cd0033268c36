"""Keyed poisoning with guard zones, inside the candidate job (never the parent process).

`Poisoner(run, key).mode()` is a `TorchDispatchMode` that fills every tensor an allocation op
returns (`empty`, `empty_like`, `empty_strided`, `new_empty`, `new_empty_strided`,
`empty_permuted`, any overload) with run's keyed pattern (`sentinels`), for KD101/KD102. A
contiguous allocation of a poisoned dtype is made `sentinels.GUARD_BYTES` larger on each side
instead, the whole block filled and the middle handed out; the guards' contents are copied, and
after forward `check_guards()` finds guard elements that changed: writes out of bounds (KD103).
Guarded blocks are kept alive until `release()`, so that a freed block's guards are not reused by
the next allocation, up to `GUARD_BUDGET_BYTES` in all; later allocations are poisoned without
guards (counted). `Poisoner(run, key, poison_data=False)` adds the guard zones only, for runs that
must see memory as the allocator hands it out.

On CUDA, `poison_free_cuda_memory` also fills each free block of the caching allocator with a
32-bit value of the run's float32 palette before forward, reaching allocations the mode does not
see (an ATen operator's own outputs, tensors made on any thread or stream), as long as they reuse
cached memory; memory the allocator newly obtains from `cudaMalloc` is not filled.

Threads: while a mode is active (and only then), `threading.Thread.start` is wrapped so that a
thread started then runs under a mode of the same run (dispatch modes are thread-local), and
torch.jit's tracing runs with the modes off (under a dispatch mode it records outputs as
constants).

Covered by the mode: allocations through the PyTorch dispatcher on the thread that runs construction and
forward and on Python threads they start: `torch.empty*` from Python, `at::empty*` /
`torch::empty*` from C++ extensions, on CPU and CUDA. Not covered: memory obtained without the
dispatcher (`malloc`, `new[]`, `cudaMalloc`, `cudaMallocAsync`, Triton or CUDA scratch space),
outputs allocated inside an ATen operator's own implementation (that operator writes them),
threads started before the mode (thread pools) or by C++ (`std::thread`), and tensors created
before the mode was entered (module-level buffers allocated at import time). Guard zones catch
writes within `sentinels.GUARD_BYTES` of a guarded block; farther writes land in other memory
unseen.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from . import sentinels

ALLOCATION_OPS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                  "empty_permuted")
#: bytes of guarded blocks kept alive within one run before guards are no longer added
GUARD_BUDGET_BYTES = 2 << 30
_ALLOCATION_PACKETS = {getattr(torch.ops.aten, name) for name in ALLOCATION_OPS
                       if hasattr(torch.ops.aten, name)}


@dataclass
class Guarded:
    """One guarded allocation: `block` holds guard + data + guard elements."""

    block: torch.Tensor
    #: the guard zones' bit patterns when the block was handed out
    before: torch.Tensor
    after: torch.Tensor
    guard: int
    numel: int
    shape: list[int]
    dtype: torch.dtype
    phase: str
    order: int


@dataclass
class Poisoner:
    run: int
    #: the scan's key: which patterns this run writes
    key: str
    #: False: guard zones only, the data left as the allocator hands it out (the unpoisoned runs,
    #: which still need guards so that an out-of-bounds store cannot corrupt the heap unseen)
    poison_data: bool = True
    phase: str = "init"
    guarded: list[Guarded] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=lambda: {
        "allocations": 0, "poisoned": 0, "poisoned_bytes": 0, "guarded": 0, "unguarded": 0})
    _kept_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mode(self) -> TorchDispatchMode:
        return _PoisonMode(self)

    def allocate(self, result: torch.Tensor) -> torch.Tensor:
        """What an allocation op hands to the candidate: `result` poisoned, or a guarded block."""
        with self._lock:
            self.counters["allocations"] += 1
            order = self.counters["allocations"]
        if not sentinels.poisoned(result.dtype) or result.numel() == 0:
            return result
        size = result.numel() * result.element_size()
        guard = sentinels.GUARD_BYTES // result.element_size()
        block_bytes = size + 2 * sentinels.GUARD_BYTES
        with self._lock:
            if self.poison_data:
                self.counters["poisoned"] += 1
                self.counters["poisoned_bytes"] += size
            can_guard = result.is_contiguous() and \
                self._kept_bytes + block_bytes <= GUARD_BUDGET_BYTES
            if can_guard:
                self._kept_bytes += block_bytes
                self.counters["guarded"] += 1
            else:
                self.counters["unguarded"] += 1
        if not can_guard:
            if self.poison_data:
                sentinels.fill(result, self.run, self.key, order)
            return result
        block = torch.empty(result.numel() + 2 * guard, dtype=result.dtype, device=result.device)
        end = guard + result.numel()
        if self.poison_data:
            sentinels.fill(block, self.run, self.key, order)
        else:
            sentinels.fill(block[:guard], self.run, self.key, order)
            sentinels.fill(block[end:], self.run, self.key, -order)
        bits = sentinels.as_bits(block)
        record = Guarded(block, bits[:guard].clone(), bits[end:].clone(), guard, result.numel(),
                         list(result.shape), result.dtype, self.phase, order)
        with self._lock:
            self.guarded.append(record)
        return block[guard:guard + result.numel()].view(result.shape)

    def check_guards(self, outputs: list[torch.Tensor]) -> tuple[list[dict], dict[int, Any]]:
        """Guard elements written since allocation: one record per allocation, and for outputs
        that are guarded allocations, their (before, after) masks of written guard elements."""
        violations, masks = [], {}
        storages = {o.untyped_storage().data_ptr(): i for i, o in enumerate(outputs)}
        for record in self.guarded:
            bits = sentinels.as_bits(record.block)
            before = bits[:record.guard] != record.before
            after = bits[record.guard + record.numel:] != record.after
            written_before, written_after = int(before.sum()), int(after.sum())
            if not (written_before or written_after):
                continue
            output = storages.get(record.block.untyped_storage().data_ptr())
            violations.append({
                "output": output, "phase": record.phase, "order": record.order,
                "shape": record.shape, "dtype": str(record.dtype).removeprefix("torch."),
                "before": written_before, "after": written_after,
                # the farthest element written past the end (1 = the first element after it)
                "farthest_after": int(after.nonzero().max()) + 1 if written_after else 0,
                "farthest_before": record.guard - int(before.nonzero().min())
                if written_before else 0})
            if output is not None:
                masks[output] = (before.cpu(), after.cpu())
        return violations, masks

    def release(self) -> None:
        self.guarded.clear()
        self._kept_bytes = 0


class _PoisonMode(TorchDispatchMode):
    def __init__(self, poisoner: Poisoner) -> None:
        super().__init__()
        self.poisoner = poisoner

    def __enter__(self):
        if not _active:
            threading.Thread.start = _start  # type: ignore[method-assign]
            for owner, name, original in _TRACING:
                setattr(owner, name, _untraced(original))
        _active.append(self.poisoner)
        return super().__enter__()

    def __exit__(self, *exc):
        _active.remove(self.poisoner)
        if not _active:
            threading.Thread.start = _original_start  # type: ignore[method-assign]
            for owner, name, original in _TRACING:
                setattr(owner, name, original)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func.overloadpacket in _ALLOCATION_PACKETS and isinstance(result, torch.Tensor):
            return self.poisoner.allocate(result)
        return result


def poison_free_cuda_memory(run: int, key: str) -> int | None:
    """Fill each free block the CUDA caching allocator holds with a value of run's float32
    palette (32-bit words, through cuda-python's `cuMemsetD32`; a value drawn per block), so that
    memory handed out later without passing the dispatch mode (an ATen operator's own outputs, a
    side stream's results) starts poisoned too. Returns the bytes filled, or None without
    cuda-python."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python before 12.6
        except ImportError:
            return None
    words = [int(w) & 0xFFFFFFFF for w in sentinels.palette(torch.float32, run, key).tolist()]
    torch.cuda.synchronize()
    filled = 0
    for segment in torch.cuda.memory_snapshot():
        for block in segment.get("blocks", []):
            if block.get("state") == "inactive" and block.get("size", 0) >= 4:
                word = words[(block["address"] >> 9) % len(words)]
                (status,) = driver.cuMemsetD32(block["address"], word, block["size"] // 4)
                if int(status) != 0:
                    raise RuntimeError(f"cuMemsetD32 failed: {status}")
                filled += block["size"] // 4 * 4
    torch.cuda.synchronize()
    return filled


#: the free blocks `warm_cuda_cache` leaves: 32 small ones of 1 MiB and a large one
WARM_SMALL, WARM_LARGE = 32, 256 << 20
WARM_CACHE_BYTES = WARM_SMALL * (1 << 20) + WARM_LARGE


def warm_cuda_cache(device: torch.device) -> None:
    """Leave free blocks in both pools of the caching allocator (small blocks come from 2 MiB
    segments, large ones from split segments) for `poison_free_cuda_memory` to fill."""
    small = [torch.empty(1 << 20, dtype=torch.uint8, device=device) for _ in range(WARM_SMALL)]
    large = torch.empty(WARM_LARGE, dtype=torch.uint8, device=device)
    del small, large


#: poisoners whose mode is active on some thread (threads started meanwhile inherit the last)
_active: list[Poisoner] = []
_original_start = threading.Thread.start


def _start(thread: threading.Thread) -> None:
    if _active:
        poisoner, original_run = _active[-1], thread.run

        def run_poisoned() -> None:
            with poisoner.mode():
                original_run()

        thread.run = run_poisoned  # type: ignore[method-assign]
    _original_start(thread)


def _untraced(original: Any) -> Any:
    """`original` (torch.jit's tracing) run with the dispatch modes off: under any Python
    dispatch mode the tracer records forward's outputs as constants, and a kernel that traces
    itself at its first call (CUDA-L1 level 2 task 54: `torch.jit.trace`, then
    `optimize_for_inference`) returned that call's answer for ever after (a false KD401). The
    tracing call's own allocations go unpoisoned."""
    @functools.wraps(original)
    def traced(*args: Any, **kwargs: Any) -> Any:
        with _disable_current_modes():
            return original(*args, **kwargs)
    return traced


#: torch.jit's tracing, replaced while a mode is active (`trace` reaches `trace_module` through
#: its module, so a `trace` imported before is covered for modules too)
_TRACING = [(owner, name, getattr(owner, name)) for owner in (torch.jit, torch.jit._trace)
            for name in ("trace", "trace_module") if hasattr(owner, name)]

# it reads as the original to a look at its names (`is` tells them apart: the tamper check does)
_start.__module__, _start.__qualname__, _start.__name__ = "threading", "Thread.start", "start"
_start.__doc__ = _original_start.__doc__
#: what `Thread.start` is while a mode is active (or a thread started under one still runs it)
THREAD_START = _start
