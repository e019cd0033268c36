"""A scan's extensions compiled ahead of their audits, beside the audits' own jobs.

A CUDA extension takes about a minute of CPU to compile (cudafe++, cicc and the host compiler
each parse torch's headers: 28 s, 30 s and 17 s for one real kernel on a 2-core machine), and an
audit compiled its kernel in its candidate job, holding one of the `--jobs` threads, its
temporary disk and its GPU the whole time, after its reference job. So the local executor first
hands every kernel that compiles (`compiles_extension`) to a build job of its own
(`harness.kernel_job.run_build`: the kernel's import, nothing else), `build_workers()` at a time,
in the order the audits start, while the audits run their reference jobs. An audit whose build
is running waits for it at its candidate job (the build folder's lock); one whose build has not
started builds it itself, and that build is skipped (`BuildCache.unbuilt`), as is any whose
folder a job has built into before (a warm build cache runs no build job).

A build job is one of the kernel's jobs: sandboxed the same way, it sees the kernel's folder and
writes only its build folder, which is recorded after it and checked before the kernel's next job
as ever. On a GPU it sees the GPU its audit's jobs would (torch compiles for the visible GPUs'
architectures), capped at `BUILD_SHARE` of its memory and under its shared lock, so a neighbour
run again alone after running out of memory waits for it as for any job. Nothing it returns is
judged: a build that fails fails again in the candidate job, where it is reported (the failure
is kept in the folder, `harness.failed_builds`, so it is not compiled twice).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from kaudit.dynamic import adapted, gpu_share, scratch
from kaudit.dynamic.builds import BuildCache
from kaudit.dynamic.gpu_share import GpuSlots
from kaudit.dynamic.kernels import (
    KernelRun,
    KernelTask,
    compile_env,
    compiles_extension,
    cuda_reason,
    materialise_record,
)
from kaudit.dynamic.limits import cpu_time_limit, job_memory_limit
from kaudit.dynamic.options import DynamicOptions
from kaudit.dynamic.runner import Job, run_job

BUILD_TARGET = "kernel_job:run_build"
#: a build job's cap on its GPU's memory: a CUDA context and whatever the kernel's import makes
BUILD_SHARE = 0.02


def build_workers() -> int:
    """Build jobs at once: half the cores (a CUDA build's compilers run one after another, and
    the audits' own jobs need the rest)."""
    return max(1, (os.cpu_count() or 1) // 2)


def builds_ahead(task: KernelTask, device: str) -> bool:
    """Whether `task`'s audit will compile an extension in its candidate job: a kernel with a
    problem to run against, that this device can run, in KernelBench's layout."""
    return (task.problem is not None and not adapted.wrapped(task.item)
            and compiles_extension(task.text)
            and not (device != "cuda" and cuda_reason(task.text)))


class Prebuilds:
    """The build jobs of one scan's kernels (`start`), until `close`."""

    def __init__(self, builds: BuildCache, options: DynamicOptions, device: str,
                 slots: GpuSlots | None) -> None:
        self.builds = builds
        self.options = options
        self.device = device
        self.gpus = slots.gpus if slots else []
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future] = []
        self._lock = threading.Lock()
        #: indexes of the tasks whose audit ended: a build not yet started for one is not
        self._ended: set[int] = set()
        #: seconds of each task's build job, by task index
        self.seconds: dict[int, float] = {}

    def start(self, tasks: list[KernelTask]) -> None:
        """Build `tasks`' extensions in this order, `build_workers()` at a time."""
        chosen = [task for task in tasks if builds_ahead(task, self.device)]
        if not chosen:
            return
        self._pool = ThreadPoolExecutor(max_workers=min(build_workers(), len(chosen)),
                                        thread_name_prefix="prebuild")
        self._futures = [self._pool.submit(self._build, number, task)
                         for number, task in enumerate(chosen)]

    def ended(self, task: KernelTask, run: KernelRun) -> None:
        """`task`'s audit ended: its build, if it ran, is in its job seconds."""
        with self._lock:
            self._ended.add(task.index)
            seconds = self.seconds.get(task.index)
        if seconds is not None and not run.cached:
            run.metrics.setdefault("job_seconds", {})["prebuild"] = round(seconds, 2)

    def close(self, wait: bool = True) -> None:
        """Builds not started are not; `wait`: for those running to end."""
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None

    def _build(self, number: int, task: KernelTask) -> None:
        with self._lock:
            if task.index in self._ended:
                return
        # a build that cannot run is only not ahead: the candidate job builds, and reports
        with contextlib.suppress(Exception), self.builds.unbuilt(task.text) as build:
            if build is None:
                return
            with contextlib.ExitStack() as stack:
                kernel = task.item.file
                if task.item.text is not None:  # a record: its kernel as its audit writes it
                    folder = scratch.folder()
                    stack.callback(scratch.remove, folder)
                    kernel = materialise_record(task.item, task.text, str(folder))
                kernel = os.path.abspath(kernel)
                args = {"kernel": kernel, "build_dir": build, "device": self.device}
                env = compile_env()
                if self.gpus:
                    gpu = self.gpus[number % len(self.gpus)]
                    env["CUDA_VISIBLE_DEVICES"] = gpu
                    args["gpu_memory_fraction"] = BUILD_SHARE
                    stack.enter_context(gpu_share.holding(gpu, exclusive=False))
                cpu = self.device == "cpu"
                job = Job(BUILD_TARGET, args, timeout=self.options.timeout,
                          seed=self.options.init_seed, env=env,
                          memory_limit=job_memory_limit(self.options.memory_limit) if cpu
                          else None,
                          cpu_limit=cpu_time_limit(self.options.timeout) if cpu else None,
                          visible=(os.path.dirname(kernel),), writable=(build,))
                started = time.monotonic()
                with run_job(job):
                    pass
                with self._lock:
                    self.seconds[task.index] = time.monotonic() - started
