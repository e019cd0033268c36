"""Where each kernel's audit runs: this machine (`LocalExecutor`) or a Ray cluster (`RayExecutor`,
`--executor ray`). Both run the same per-kernel audit (`kernels.audit_entry`: the fork server, the
OS sandbox, poisoned jobs, judging) and hand each `KernelRun` back to the driver the moment it
ends, where the pass streams it, shows progress and writes the dynamic result cache.

On Ray, each kernel is one task asking for one GPU (`num_gpus=1`) on CUDA runs, one CPU
otherwise. The Ray worker is kaudit's trusted side, as the kaudit process is locally: it runs the
kernel only in sandboxed jobs, judges their outputs itself and guards its own installation
(`selfcheck.prepare_jobs`, checked after every task). The driver never runs a kernel and alone
writes the signed result cache. A node compiles into its own build cache (the user cache folder
there, or `--build-cache DIR`, shared when DIR is on a shared filesystem). A node that does not
hold the kernel's and its problem's files as the driver read them runs the texts the task carries,
written into a temporary folder there; a kernel that loads other files next to it, or another
benchmark's layout, needs the tree at the same path on every node (else KD504)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kaudit.config import ConfigError
from kaudit.discover import WorkItem
from kaudit.dynamic import adapted, sandbox, scratch
from kaudit.dynamic.builds import BuildCache, default_root
from kaudit.dynamic.gpu_share import GpuSlots
from kaudit.dynamic.limits import judging_threads
from kaudit.dynamic.kernels import (
    KernelRun,
    KernelTask,
    audit_entry,
    incomplete,
    least_disk_first,
    problem_text,
)
from kaudit.dynamic.options import RAY_MISSING, DynamicOptions
from kaudit.dynamic.problems import resolve_device
from kaudit.dynamic.runner import sharing_cores
from kaudit.dynamic.sandbox import SandboxError
from kaudit.dynamic.selfcheck import Installation, InstallationChanged, jobs_guarded, prepare_jobs

Done = Callable[[KernelTask, KernelRun, float], None]
#: tasks in flight per slot of the cluster (GPUs on CUDA, CPUs otherwise): enough to keep every
#: slot busy without holding tens of thousands of kernels' texts in the object store
IN_FLIGHT_PER_SLOT = 2
#: names of other source files a kernel may load from next to it
_SIBLING_SOURCES = re.compile(r"""['"][^'"\n]+\.(?:cu|cuh|cpp|cc|cxx|h|hpp|so)['"]""")


class LocalExecutor:
    """This machine: `options.jobs` kernels at a time in threads of this process, on CUDA spread
    over the visible GPUs."""

    def __init__(self, options: DynamicOptions) -> None:
        self.options = options
        #: for the report (the local sandbox warns on stderr itself)
        self.warnings: list[str] = []

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def device(self) -> str:
        try:
            return resolve_device(self.options.device)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    @contextlib.contextmanager
    def guarded(self, device: str) -> Iterator[None]:
        """The jobs' sandbox and kaudit's own code guarded; on a GPU, the cores shared out among
        the `--jobs` audits (`runner.sharing_cores`) before the fork server starts."""
        with contextlib.ExitStack() as stack:
            if device == "cuda":
                stack.enter_context(sharing_cores(self.options.jobs))
            stack.enter_context(jobs_guarded(self.options.sandbox))
            yield

    def audit(self, tasks: list[KernelTask], device: str, done: Done) -> None:
        options = self.options
        builds = BuildCache(options.extensions_dir)
        slots = GpuSlots(options.jobs) if device == "cuda" else None
        lock = threading.Lock()

        def one(task: KernelTask) -> None:
            started = time.monotonic()
            run = audit_entry(task.item, task.text, options, device, slots, builds)
            with lock:
                done(task, run, time.monotonic() - started)

        try:
            if options.jobs <= 1 or len(tasks) <= 1:
                for task in tasks:
                    one(task)
                return
            with judging_threads(options.jobs):
                pool = ThreadPoolExecutor(max_workers=options.jobs)
                try:
                    started = [pool.submit(one, task)
                               for task in least_disk_first(tasks, options, device)]
                    for future in started:
                        future.result()
                except BaseException:  # interrupted: the kernels not started yet are not started
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
                finally:
                    pool.shutdown(wait=True)
        finally:
            builds.close()


class RayExecutor:
    """A Ray cluster: `ray_address`, else the one `ray.init()` finds or starts (a cluster this
    process already joined is used as it is, and left running)."""

    def __init__(self, options: DynamicOptions) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ConfigError(RAY_MISSING) from exc
        self.ray = ray
        self.options = options
        self.joined = False
        #: for the report: nodes whose jobs ran without the OS sandbox (`--sandbox auto`)
        self.warnings: list[str] = []

    def __enter__(self) -> RayExecutor:
        if not self.ray.is_initialized():
            try:
                self.ray.init(address=self.options.ray_address, include_dashboard=False,
                              log_to_driver=False, logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = self.options.ray_address or "a new local cluster"
                raise ConfigError(f"--executor ray: cannot start or join the Ray cluster "
                                  f"({where}): {exc}") from exc
            self.joined = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.joined:
            self.ray.shutdown()
            self.joined = False

    def device(self) -> str:
        requested = self.options.device
        if requested not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"unknown device {requested!r}: auto, cpu or cuda")
        gpus = self.ray.cluster_resources().get("GPU", 0)
        if requested == "cuda" and not gpus:
            raise ConfigError("--device cuda, but the Ray cluster has no GPU: start its nodes "
                              "where GPUs are visible (`ray start ... --num-gpus N`), or run "
                              "with --device cpu")
        return "cpu" if requested == "cpu" or not gpus else "cuda"

    def guarded(self, device: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # nothing runs here: each worker guards itself

    def audit(self, tasks: list[KernelTask], device: str, done: Done) -> None:
        ray = self.ray
        cuda = device == "cuda"
        remote = ray.remote(audit_on_node).options(
            num_gpus=1 if cuda else 0, num_cpus=1, max_retries=0)
        slots = int(ray.cluster_resources().get("GPU" if cuda else "CPU", 1)) or 1
        node_builds = self.options.extensions_dir == default_root()
        waiting = list(reversed(tasks))
        running: dict = {}
        try:
            while waiting or running:
                while waiting and len(running) < IN_FLIGHT_PER_SLOT * slots:
                    task = waiting.pop()
                    running[remote.remote(task, self.options, device, node_builds)] = task
                ready, _ = ray.wait(list(running), num_returns=1)
                for ref in ready:
                    task = running.pop(ref)
                    run, seconds = self._result(ref, task)
                    done(task, run, seconds)
        except BaseException:
            for ref in running:
                ray.cancel(ref, force=True)
            raise

    def _result(self, ref: object, task: KernelTask) -> tuple[KernelRun, float]:
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:  # the task raised, or its worker or node died
            cause = getattr(exc, "cause", None) or exc
            return incomplete(task.item.display, task.text, cause), 0.0
        if result.sandbox_refused is not None:
            raise SandboxError(f"{result.node}: {result.sandbox_refused}")
        if result.changed:
            raise InstallationChanged([f"{result.node}:{path}" for path in result.changed])
        if result.unsandboxed is not None:
            warning = f"the OS sandbox is unavailable on Ray node {result.node} " \
                f"({result.unsandboxed}); its jobs ran without it"
            if warning not in self.warnings:
                self.warnings.append(warning)
        assert result.run is not None
        return result.run, result.seconds


def executor_for(options: DynamicOptions) -> LocalExecutor | RayExecutor:
    """Raises ConfigError for `--executor ray` without Ray installed."""
    return RayExecutor(options) if options.executor == "ray" else LocalExecutor(options)


# -- on a Ray node ---------------------------------------------------------------------------


@dataclass
class NodeResult:
    """What a Ray task hands back: a run judged on the node, or why the node refused."""

    node: str
    run: KernelRun | None = None
    seconds: float = 0.0
    #: `--sandbox on` where the node cannot build the sandbox
    sandbox_refused: str | None = None
    #: kaudit's installed files that changed on the node while its jobs ran
    changed: list[str] = field(default_factory=list)
    #: why the node's jobs ran without the OS sandbox (`--sandbox auto` where it is unavailable)
    unsandboxed: str | None = None


#: this worker process's installation fingerprint, taken before its first job
_installation: Installation | None = None


def audit_on_node(task: KernelTask, options: DynamicOptions, device: str,
                  node_builds: bool) -> NodeResult:
    """One kernel's audit in a Ray worker: the same jobs and judging as a local one."""
    global _installation
    node = socket.gethostname()
    started = time.monotonic()
    try:
        if _installation is None:
            _installation = prepare_jobs(options.sandbox)
        else:
            sandbox.set_mode(options.sandbox)
            sandbox.active()
        builds = BuildCache(default_root() if node_builds else options.extensions_dir)
        try:
            with placed(task, options) as (item, placed_options):
                run = audit_entry(item, task.text, placed_options, device,
                                   GpuSlots(1) if device == "cuda" else None, builds)
        except OSError as exc:
            run = incomplete(task.item.display, task.text, exc)
        finally:
            builds.close()
    except SandboxError as exc:
        return NodeResult(node, sandbox_refused=str(exc))
    return NodeResult(node, run, time.monotonic() - started, changed=_installation.changed(),
                      unsandboxed=sandbox.available() if sandbox.mode() == "auto" else None)


@contextlib.contextmanager
def placed(task: KernelTask, options: DynamicOptions
           ) -> Iterator[tuple[WorkItem, DynamicOptions]]:
    """The kernel as this node runs it: in place where the node holds its files as the driver
    read them; else its text and its problem's, written into a temporary folder here. Raises
    FileNotFoundError where that cannot stand for the files (another benchmark's layout, a
    kernel loading other files next to it)."""
    item = task.item
    if _same_files(task, options):
        yield item, options
        return
    if adapted.wrapped(item) or _SIBLING_SOURCES.search(task.text):
        raise FileNotFoundError(
            f"{item.file}, or a file it loads, is not on node {socket.gethostname()} as the "
            "driver read it: put the tree at the same path on every node")
    folder = scratch.folder()
    try:
        kernel = folder / "kernel.py"
        kernel.write_text(task.text, encoding="utf-8")
        if task.problem is not None:
            (folder / "problem.py").write_text(task.problem, encoding="utf-8")
        yield (WorkItem(str(kernel), item.display, item.explicit, identity=item.identity),
               dataclasses.replace(options, problem=None, problems_root=None))
    finally:
        scratch.remove(folder)


def _same_files(task: KernelTask, options: DynamicOptions) -> bool:
    item = task.item
    try:
        if item.text is None and \
                Path(item.file).read_text(encoding="utf-8", errors="replace") != task.text:
            return False
        if adapted.wrapped(item):
            return os.path.isfile(item.file)
        return problem_text(item, options) == task.problem
    except OSError:
        return False
