"""GPU memory shared by concurrent jobs and concurrent kaudit processes, decided in kaudit's
process, never in a job.

- `GpuSlots` hands each kernel (or problem) a visible GPU in turn, and each of its jobs a share
  of that GPU: `GPU_MEMORY_SHARE` divided by the jobs this process may run on it at once.
- Every job on a GPU holds a *shared* lock on that GPU's lock file while it runs
  (`holding`), in a per-user folder that every kaudit process of the user finds
  (`/tmp/kaudit-gpu-<uid>`, or `KAUDIT_GPU_LOCKS`); a sandboxed job has a private /tmp and never
  sees it. Locks are `flock` locks, which belong to an open file description, so two threads of
  one kaudit process conflict as two processes do. A gate lock taken around every acquisition
  lets a waiting exclusive lock in before shared ones that come after it.
- A job's cap (`torch.cuda.set_per_process_memory_fraction`, applied by the job) is its share,
  or less when less is free: the memory free when it starts is measured with NVML through
  `nvidia-smi` (no CUDA context in kaudit's process), so the cap does not assume this process
  owns the GPU.
- A job whose failure looks like running out of memory (`looks_oom`) runs again with a wider
  cap, `WIDE_SHARE` (half of what this process may take), beside this process's other jobs: it
  waits in this process's `Ledger` of that GPU until the jobs running leave it that much, and jobs that come
  after it wait behind it. KernelBench level 1 has dozens of problems that need more than an
  eighth of an H200 and fit in half of it; draining the whole GPU for each of them made the
  audit of the level run one problem at a time.
- A job that runs out even then runs once more holding the GPU's *exclusive* lock (no other
  kaudit job of this user on that GPU, in any process), capped only by what is free then; only
  that failure is reported, with the memory that was free.
- A timing job (`GpuClaim.alone`) runs alone on its GPU, in its GPU's `TimingLane`, which
  holds the exclusive lock for a batch of them (`kaudit.dynamic.timing_lane`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import re
import secrets
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaudit.dynamic.ledger import Ledger
from kaudit.dynamic.timing_lane import TimingLane

#: share of a GPU's memory the jobs of one kaudit process may take together (caching allocator)
GPU_MEMORY_SHARE = 0.9
#: the cap of a job's second run, after it ran out of memory at its share
WIDE_SHARE = GPU_MEMORY_SHARE / 2
#: the smallest cap handed to a job (a fraction of the GPU's memory)
MIN_FRACTION = 0.001
#: seconds a free-memory measurement is reused
MEASURE_TTL = 1.0
LOCKS_ENV = "KAUDIT_GPU_LOCKS"
_OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda_error_out_of_memory",
                "cudaerrormemoryallocation")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass
class GpuClaim:
    """The GPU of one kernel's (or problem's) jobs: `device` its CUDA_VISIBLE_DEVICES entry,
    `share` the most of the GPU's memory a job may take (a fraction) beside this process's other
    jobs. `step`: where on the ladder share, WIDE_SHARE, alone the next job starts; a job that
    ran out of memory lower leaves it where it ran, since the same kernel and problem need about
    as much again in the next job (each of the four jobs of an audit otherwise failed at its
    share before waiting for a wider one)."""

    device: str
    share: float = GPU_MEMORY_SHARE
    step: int = 0
    #: what the job was sized to need beforehand (a fraction; `kaudit problems`, and the jobs
    #: of `scan --dynamic`: `kernels.size_claim`), asked for
    #: first instead of `share` (at most WIDE_SHARE): a job that needs more does not first run
    #: out of memory at its share, and one that needs less leaves the rest to its neighbours (on
    #: KernelBench level 1, problems needing 3 GiB held 16 for 20 s); after running out, it asks
    #: twice that, then WIDE_SHARE
    need: float | None = None
    #: what a run also holds, taken first (`kaudit problems`: its turn among the -j problems on
    #: the GPU, taken in its gate once the job's process and CUDA context are made)
    turn: Callable[[], contextlib.AbstractContextManager] | None = None
    #: run alone on the GPU, in its `TimingLane` (a timing job): its own cap is what is free
    alone: bool = False


@dataclass(frozen=True)
class GpuMemory:
    """What NVML says of one GPU (bytes)."""

    uuid: str
    free: int
    total: int


class GpuSlots:
    """Hands each concurrent kernel a GPU: the visible GPUs in turn, as evenly as `jobs` allows.
    `take()` yields the `GpuClaim` of the kernel's jobs (None without a visible GPU)."""

    def __init__(self, jobs: int, visible: list[str] | None = None) -> None:
        self.gpus = visible if visible is not None else visible_gpus()
        self.jobs = max(1, jobs)
        self.busy = {gpu: 0 for gpu in self.gpus}
        self.lock = threading.Lock()
        #: the jobs that may run on one GPU at once
        self.jobs_per_gpu = max(1, -(-self.jobs // max(1, len(self.gpus))))
        #: each job's share: the GPU's memory shared by the jobs that may run on it at once
        self.fraction = round(GPU_MEMORY_SHARE / self.jobs_per_gpu, 3)

    @contextlib.contextmanager
    def take(self) -> Iterator[GpuClaim | None]:
        if not self.gpus:
            yield None
            return
        with self.lock:
            gpu = min(self.gpus, key=lambda g: self.busy[g])
            self.busy[gpu] += 1
        try:
            yield GpuClaim(gpu, self.fraction)
        finally:
            with self.lock:
                self.busy[gpu] -= 1


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries for the children."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


# -- measuring -------------------------------------------------------------------------------

_measured: tuple[float, dict[str, GpuMemory]] | None = None
_measure_lock = threading.Lock()
_names: dict[str, str] = {}
_warned = False


def _nvidia_smi() -> dict[str, GpuMemory]:
    """Every GPU NVML sees, by index and by UUID; empty when nvidia-smi is missing or fails."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid,memory.free,memory.total",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20,
            check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    found: dict[str, GpuMemory] = {}
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        fields = [part.strip() for part in line.split(",")]
        if len(fields) != 4 or not fields[2].isdigit() or not fields[3].isdigit():
            continue
        memory = GpuMemory(fields[1], int(fields[2]) << 20, int(fields[3]) << 20)
        found[fields[0]] = found[fields[1]] = memory
    return found


def gpu_memory(device: str) -> GpuMemory | None:
    """Free and total memory of the GPU a CUDA_VISIBLE_DEVICES entry names (an index or a UUID),
    measured at most MEASURE_TTL seconds ago; None when unknown (no nvidia-smi, a MIG entry)."""
    global _measured
    with _measure_lock:
        if _measured is None or time.monotonic() - _measured[0] > MEASURE_TTL:
            _measured = (time.monotonic(), _nvidia_smi())
        return _measured[1].get(device)


_CAPABILITY = re.compile(r"\d+\.\d+")


@functools.cache
def compute_capability(device: str) -> str | None:
    """The compute capability ("9.0") of the GPU a CUDA_VISIBLE_DEVICES entry names, from
    nvidia-smi; None when unknown (no nvidia-smi, a MIG entry, an old driver)."""
    try:
        proc = subprocess.run(["nvidia-smi", f"--id={device}", "--query-gpu=compute_cap",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    found = proc.stdout.strip()
    return found if proc.returncode == 0 and _CAPABILITY.fullmatch(found) else None


def forget_measurements() -> None:
    """The next `gpu_memory` measures again (neighbours gave memory back)."""
    global _measured
    with _measure_lock:
        _measured = None


def job_fraction(device: str, share: float) -> float:
    """A job's cap on GPU `device`: `share` (GPU_MEMORY_SHARE alone on it), or less when less is
    free."""
    memory = gpu_memory(device)
    if memory is None or memory.total <= 0:
        return share
    free_share = GPU_MEMORY_SHARE * memory.free / memory.total
    return round(max(MIN_FRACTION, min(share, free_share)), 4)


# -- locking ---------------------------------------------------------------------------------


def lock_folder() -> Path | None:
    """The per-user folder of the GPU lock files, made private; None when it cannot be used
    (another user owns it, it is a link or writable by others): jobs then run unlocked, with a
    warning on stderr once."""
    global _warned
    folder = Path(os.environ.get(LOCKS_ENV) or f"/tmp/kaudit-gpu-{os.getuid()}")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = os.lstat(folder)
        usable = stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid() and \
            not found.st_mode & 0o022
    except OSError:
        usable = False
    if usable:
        return folder
    with _measure_lock:
        if not _warned:
            _warned = True
            sys.stderr.write(f"kaudit: GPU lock folder {folder} is not usable (not a private "
                             f"folder of this user; {LOCKS_ENV} names another): GPU jobs run "
                             "without coordinating with other kaudit processes\n")
    return None


def lock_name(device: str) -> str:
    """A file name for the GPU: its UUID where NVML knows it (the same GPU under any index), else
    the host and the entry. Measured once per entry: a GPU keeps its UUID."""
    with _measure_lock:
        known = _names.get(device)
    if known is None:
        memory = gpu_memory(device)
        known = _UNSAFE.sub("_", memory.uuid if memory is not None
                            else f"{socket.gethostname()}-{device}")
        with _measure_lock:
            _names[device] = known
    return known


@contextlib.contextmanager
def holding(device: str, exclusive: bool) -> Iterator[None]:
    """Hold GPU `device`'s lock, shared or exclusive, across the kaudit processes of this user."""
    folder = lock_folder()
    if folder is None:
        yield
        return
    name = lock_name(device)
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    gate = os.open(folder / f"{name}.gate", flags, 0o600)
    try:
        held = os.open(folder / f"{name}.lock", flags, 0o600)
        try:
            fcntl.flock(gate, fcntl.LOCK_EX)
            try:
                fcntl.flock(held, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
            yield
        finally:
            os.close(held)  # closing the description releases its lock
    finally:
        os.close(gate)


_ledgers: dict[str, Ledger] = {}
_ledgers_lock = threading.Lock()


def ledger(device: str) -> Ledger:
    """This process's use of one GPU, in fractions of its memory."""
    with _ledgers_lock:
        return _ledgers.setdefault(device, Ledger(GPU_MEMORY_SHARE))


_lanes: dict[str, TimingLane] = {}


def lane(device: str) -> TimingLane:
    """This process's lane of timing jobs on one GPU."""
    with _ledgers_lock:
        if device not in _lanes:
            _lanes[device] = TimingLane(functools.partial(holding, device, exclusive=True))
        return _lanes[device]


# -- running ---------------------------------------------------------------------------------


def looks_oom(result: Any) -> bool:
    """Whether a job's failure (or a step it recorded as failed, such as a float64 copy) looks
    like running out of memory."""
    if result.status == "oom":
        return True
    if result.status in ("crashed", "error"):
        text = f"{result.error_type} {result.error} {result.stderr_tail[-2000:]}".lower()
        if any(marker in text for marker in _OOM_MARKERS):
            return True
    if isinstance(result.value, (dict, list)):
        text = json.dumps(result.value, default=str)[:1 << 20].lower()
        return any(marker in text for marker in _OOM_MARKERS)
    return False


def run_claimed(job: Any, claim: GpuClaim, launch: Callable[..., Any]) -> Any:
    """Run `job` (a `runner.Job`) with `launch` on its GPU under a shared lock; a failure that
    looks like out of memory runs again with `WIDE_SHARE`, then alone under the exclusive lock
    (see the module's docstring); a claim `alone` runs once, in its GPU's timing lane. The
    last result is the one returned, with `gpu_wait_s` (time spent waiting for memory and
    locks), `gpu_retry_s` (the seconds of the runs that ran out) and, after a failure alone,
    `gpu_note` saying what was free. A gated job
    (`runner.Job.gated`) is launched first, `launch(job, gate)`, and takes its memory and locks
    through the gate once it is ready; another job takes them before `launch(job)`."""
    waited, retried, runs, caps = 0.0, 0.0, 0, []

    def run(share: float | None, *holds: Callable[[], Any],
            before: Callable[[], None] = lambda: None) -> Any:
        """One run at `share` of the GPU (None: alone on it), holding what `holds` make while it
        runs (made anew each time the gate is entered: a job whose fork server died with it is
        started again in a fresh interpreter, through the same gate)."""
        nonlocal runs
        runs += 1
        # a run that will be repeated with more memory may stop at its first shortage
        args = {**job.args, "gpu_last_try": share is None}
        if "schedule_seed" in args and share != claim.share:
            # a candidate's later run does not repeat the first one's call order (the first
            # may have left notes in its build folder)
            args["schedule_seed"] = secrets.randbits(48)
        capped = dataclasses.replace(job, args=args)

        @contextlib.contextmanager
        def granted() -> Iterator[dict]:
            nonlocal waited
            started = time.monotonic()
            with contextlib.ExitStack() as stack:
                for hold in ((claim.turn,) if claim.turn else ()) + holds:
                    stack.enter_context(hold())
                waited += time.monotonic() - started
                before()
                # measured now: the cap follows what is free when it runs
                caps.append(job_fraction(claim.device, share or GPU_MEMORY_SHARE))
                yield {"gpu_memory_fraction": caps[-1]}

        if job.gated:
            result = launch(capped, granted)
        else:
            with granted() as cap:
                result = launch(dataclasses.replace(capped, args={**args, **cap}))
        # alone: under the exclusive lock, which binds only where the lock folder can be used
        result.held_gpu_alone = share is None and lock_folder() is not None
        return result

    def finish(result: Any) -> Any:
        result.gpu_wait_s, result.gpu_runs = round(waited, 3), runs
        result.gpu_retry_s = round(retried, 3)
        return result

    if claim.alone:  # its lane holds the exclusive lock: no ledger, no other lock
        return finish(run(None, lane(claim.device).turn, before=forget_measurements))
    if claim.need is None:
        shares = [claim.share] + ([WIDE_SHARE] if claim.share < WIDE_SHARE else [])
    else:  # sized: its need, then twice that (a need underestimated), then WIDE_SHARE
        first = max(MIN_FRACTION, min(claim.need, WIDE_SHARE))
        shares = sorted({first, min(2 * first, WIDE_SHARE), WIDE_SHARE})
    for step, share in enumerate(shares):
        if step < claim.step:
            continue
        result = run(share,
                     functools.partial(ledger(claim.device).reserve, share,
                                       wide=share != claim.share),
                     functools.partial(holding, claim.device, exclusive=False),
                     lane(claim.device).running)
        if not looks_oom(result):
            claim.step = step
            return finish(result)
        retried += result.wall_s
        result.close()
    claim.step = len(shares)
    memory: list[GpuMemory | None] = []

    def measured() -> None:
        forget_measurements()  # what the neighbours held is free now
        memory.append(gpu_memory(claim.device))

    second = run(None, functools.partial(holding, claim.device, exclusive=True),
                 before=measured)
    second.retried_alone = True
    if looks_oom(second):
        free = memory[-1] if memory else None
        state = f"{free.free / (1 << 30):.1f} GiB free of {free.total / (1 << 30):.1f} GiB" \
            if free is not None else "free memory unknown"
        cap = f"{caps[-1]:g}" if caps else "unknown"
        second.gpu_note = (f" (run again alone on GPU {claim.device}, no other kaudit job "
                           f"running on it, {state}, cap {cap} of it)")
    return finish(second)
