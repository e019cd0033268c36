"""Resource limits of the child jobs on CPU runs: CPU time and address space (RLIMIT_AS).

RLIMIT_AS counts address space, not memory in use: torch alone maps gigabytes it never touches
(shared libraries, allocator arenas, thread stacks). So the default cap of a job is the machine's
whole physical memory, whatever `--jobs` says: one job may use most of the memory, and a job at its
cap holds less than that in RAM. `--memory-limit` sets another cap, or none."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

from kaudit.dynamic.runner import OOM, RunResult

#: smaller caps are typing mistakes ("16" meant 16G): torch alone needs more to start
MIN_MEMORY_LIMIT = 256 << 20
#: a smaller temporary-disk limit is a typing mistake: a job's harness copy alone takes 1 MiB
MIN_TEMP_LIMIT = 64 << 20
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)


def cpu_time_limit(timeout: float) -> float:
    """RLIMIT_CPU for a CPU job: its wall-clock timeout on every core, plus start-up."""
    return timeout * (os.cpu_count() or 1) + 30


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_memory_limit() -> int | None:
    """The address-space cap of one CPU job when none is given: the physical memory."""
    return physical_memory()


def parse_memory_limit(text: str) -> int:
    """`--memory-limit`: "24G", "512M", "1.5T", "24GiB" (binary units; bytes without one), or
    "none" (0: no cap). Raises ValueError with the option's usage."""
    return parse_size(text, "--memory-limit", MIN_MEMORY_LIMIT)


def parse_temp_limit(text: str) -> int:
    """`--temp-limit`: the scan's temporary disk, as `parse_memory_limit` reads sizes."""
    return parse_size(text, "--temp-limit", MIN_TEMP_LIMIT)


def parse_size(text: str, option: str, minimum: int) -> int:
    if text.strip().lower() in ("none", "0"):
        return 0
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{option}: not a size: {text!r} (e.g. 24G, 512M, or none)")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size < minimum:
        raise ValueError(f"{option}: {text!r} is under {format_size(minimum)}; "
                         "give a unit (e.g. 24G) or none")
    return size


def job_memory_limit(requested: int | None) -> int | None:
    """The cap each CPU job gets: `requested` (0: none), else the default."""
    if requested == 0:
        return None
    return requested or default_memory_limit()


def format_size(size: int) -> str:
    for unit, factor in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}iB"
    return f"{size} bytes"


def memory_note(result: RunResult, limit: int | None) -> str:
    """For a job that ran out of memory under a cap: the cap and the option that moves it."""
    if result.status != OOM or not limit:
        return ""
    return (f" (memory cap: {format_size(limit)} of address space per job; "
            "raise it with --memory-limit)")


@contextlib.contextmanager
def judging_threads(jobs: int) -> Iterator[None]:
    """torch's operator threads in kaudit's process while the outputs of `jobs` jobs at once
    are judged: its threads (the cores, or what the user set) shared out among them (at least
    one each), restored after.
    Uncapped, each judging thread's operators ran on a team of one thread per core: on the
    H200's 16-core host, 24 judging threads beside 12 problem jobs kept 28 threads runnable
    and the cores 23-35 % in the kernel. A thread takes the number when it first runs an
    operator: threads made after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, before // max(1, jobs)))
    try:
        yield
    finally:
        torch.set_num_threads(before)
