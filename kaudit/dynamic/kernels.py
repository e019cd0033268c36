"""`kaudit scan --dynamic`: run each kernel against its reference problem and measure.

For every kernel file the static scan read, this module (in the kaudit process):
1. pairs it with a reference problem (`pair_problem`): `--problem FILE`; the reference a results
   tree already names (`Submission.reference`); a sibling `problem.py`, `ref_code.py` or
   `reference.py`; KernelBench names `level_<L>_problem_<P>_...` (or `level_<L>/problem_<P>.py`)
   looked up as `ROOT/level<L>/<P>_*.py` under `--problems ROOT`. None: a KD502 note;
2. decides, before anything is compiled, whether the kernel needs CUDA (`cuda_reason`); on a
   machine without CUDA such a kernel gets a KD500 note;
3. runs the reference problem in one job (`harness.kernel_job.run_reference`), the candidate in
   another (`run_candidate`: copies of the inputs, of the init inputs and of Model's state, never
   a reference output; dozens of calls in a keyed random order, four of them poisoned), and, when
   the candidate finished, a plain run of the kernel in a third (`harness.plain_run`); all hand
   back tensors loaded here with `weights_only=True`, refused unloaded when larger than expected.
   The candidate and the plain run compile into the kernel text's build folder
   (`kaudit.dynamic.builds`), checked before each reuse; on CUDA, a build job compiles the
   kernel's extensions there first, with no GPU visible (`kaudit.dynamic.prebuild`);
4. judges here (`kaudit.dynamic.judge`): write coverage, guard zones, correctness, scale
   fragility, stale output, input mutation, side streams, work after return, tampering and a plain
   run that disagrees (KD1xx-KD4xx); failures are KD501 (candidate) or KD503 (reference). An audit
   that could not complete (a full disk, an error in kaudit) is KD504, and the scan goes on.
5. for a kernel without errors, re-runs reference and kernel with the problem's module-level sizes
   perturbed, and at the sizes the benchmark times (`kaudit.dynamic.shapes`, KD302);
6. with `--timing`, times a kernel without errors beside its reference in a fourth job
   (`kaudit.dynamic.timing`): the verdict's `measured`, and KD701 where a claimed speedup is not
   reproduced;
7. on CUDA, profiles a few calls of a kernel without errors and of its reference in a last job
   (`kaudit.dynamic.profiling`): KD601 (library share), KD602 (no GPU work), KD403 from the trace.

Kernels run on an executor (`kaudit.dynamic.executors`): here, `DynamicOptions.jobs` at a time, on
CUDA spread over the visible GPUs (`GpuSlots`), or one Ray task each (`audit_entry` on the node).
Each job of a kernel runs under its GPU's lock and memory cap, retried alone on the GPU when it ran
out of memory (`kaudit.dynamic.gpu_share`).

Findings point at `ModelNew.forward` in the kernel file and carry `pass_ = "dynamic"`.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kaudit.discover import WorkItem, display_path
from kaudit.dynamic import adapted, host_memory, problem_sizing, scratch
from kaudit.dynamic.attribution import OwnKernels
from kaudit.dynamic.builds import BuildCache
from kaudit.dynamic.gpu_share import GpuClaim, GpuSlots, gpu_memory
from kaudit.dynamic.harness.scaling import scale_input
from kaudit.dynamic.judge import (
    Adder,
    disk_full,
    failure_metrics,
    judge,
    not_audited,
    rejected,
    second_opinion,
)
from kaudit.dynamic.limits import cpu_time_limit, format_size, job_memory_limit, memory_note
from kaudit.dynamic.options import (  # noqa: F401 - the names callers import from here
    CALLS,
    DEFAULT_SCALES,
    INIT_SEED,
    INPUT_SEEDS,
    DynamicOptions,
)
from kaudit.dynamic.prebuild import build_ahead, compiles_extension
from kaudit.dynamic.profiling import attribute, profile_job
from kaudit.dynamic.runner import (Job, OutputError, RunResult, SharedInputs, add_job_seconds,
                                   job_seconds, run_job, share_inputs)
from kaudit.dynamic.sandbox import SandboxError
from kaudit.dynamic.shapes import shape_sweep, timed_sweep
from kaudit.dynamic.timing import measure, timing_job
from kaudit.findings import Finding, Location

if TYPE_CHECKING:
    from kaudit.dynamic.result_cache import DynamicCache

REFERENCE_TARGET = "kernel_job:run_reference"
CANDIDATE_TARGET = "kernel_job:run_candidate"
PLAIN_TARGET = "plain_run.py:run"
#: calls in the plain run (KD406)
PLAIN_CALLS = 3
SIBLING_PROBLEMS = ("problem.py", "ref_code.py", "reference.py")
_KB_FILE = re.compile(r"level_?(\d+)_problem_?(\d+)(?:_|\.py$)")
_KB_FOLDER = re.compile(r"level_?(\d+)$")
_KB_PROBLEM = re.compile(r"problem_?(\d+)\.py$")


@dataclass
class KernelRun:
    path: str
    problem: str | None = None
    status: str = "not-run"
    findings: list[Finding] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    #: read from the dynamic result cache, not run in this scan
    cached: bool = False


# -- pairing and CUDA ------------------------------------------------------------------------


def pair_problem(file: str, reference: str | None, options: DynamicOptions,
                 level: int | None = None, number: int | None = None) -> str | None:
    """The reference problem for kernel `file`, in the documented order, or None."""
    if options.problem:
        return options.problem
    if reference and "#L" not in reference and os.path.isfile(reference):
        return reference
    folder = Path(file).parent
    for name in SIBLING_PROBLEMS:
        sibling = folder / name
        if sibling.is_file() and sibling.resolve() != Path(file).resolve():
            return str(sibling)
    if options.problems_root:
        match = _KB_FILE.search(Path(file).name)
        if match:
            level, number = int(match.group(1)), int(match.group(2))
        elif _KB_FOLDER.search(folder.name) and _KB_PROBLEM.search(Path(file).name):
            level = int(_KB_FOLDER.search(folder.name).group(1))
            number = int(_KB_PROBLEM.search(Path(file).name).group(1))
        if level is not None and number is not None:
            root = Path(options.problems_root)
            for folder_name in (f"level{level}", f"level_{level}"):
                found = sorted((root / folder_name).glob(f"{number}_*.py"))
                if found:
                    return str(found[0])
    return None


_CUDA_SOURCES = re.compile(r"\bcuda_sources\s*=")
_CU_FILE = re.compile(r"""['"][^'"\n]+\.cu['"]""")
_TRITON = re.compile(r"^\s*(?:import\s+triton\b|from\s+triton\b)", re.MULTILINE)


def cuda_reason(text: str, triton_interpreter: bool | None = None) -> str | None:
    """Why the kernel cannot run without CUDA (decided from the text, before any compile).
    Triton kernels run on the CPU under Triton's interpreter (`TRITON_INTERPRET=1`, set for the
    candidate child) when Triton is installed."""
    if _CUDA_SOURCES.search(text):
        return "load_inline with cuda_sources"
    if re.search(r"\bload\s*\(", text) and _CU_FILE.search(text):
        return "cpp_extension.load of .cu sources"
    if _TRITON.search(text):
        if triton_interpreter is None:
            triton_interpreter = triton_installed()
        if not triton_interpreter:
            return "Triton kernels (install triton to run them on the CPU with its interpreter)"
    return None


def uses_triton(text: str) -> bool:
    return bool(_TRITON.search(text))


def triton_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def forward_location(path: str, text: str) -> Location:
    """`def forward` of `class ModelNew` (the class line, else line 1)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return Location(path, 1, 1, 1, 1)
    lines = text.splitlines()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            target: ast.AST = node
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                        and item.name == "forward":
                    target = item
            line = target.lineno
            width = len(lines[line - 1]) if 0 < line <= len(lines) else 0
            return Location(path, line, 1, line, width + 1)
    return Location(path, 1, 1, 1, 1)


# -- running ---------------------------------------------------------------------------------


def audit_items(items: Iterable[WorkItem], options: DynamicOptions, device: str,
                on_kernel: Callable[[int, int, WorkItem, KernelRun, float], None] | None = None,
                cache: DynamicCache | None = None, executor: Executor | None = None
                ) -> list[KernelRun]:
    """Run every kernel among `items` on `executor` (default: this machine, `options.jobs` at a
    time, on CUDA spread over the visible GPUs); `on_kernel(done, total, item, run, seconds)`
    after each, in this process. A kernel held in a JSONL record runs from a temporary
    `kernel.py`, next to its record's `ref_code` as `problem.py` when it has one. With `cache`
    (read and written only here), a kernel whose result it holds (same kernel, problem, options
    and environment) is not run again, and each new result is stored the moment it ends. Runs
    come back in the order of `items`."""
    work = []
    for item in items:
        try:
            text = item.text if item.text is not None else \
                Path(item.file).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            text = ""
            work.append((item, text, exc))
            continue
        if "ModelNew" in text or adapted.wrapped(item):
            work.append((item, text, None))
    if executor is None:
        from kaudit.dynamic.executors import LocalExecutor  # the executors build on this module

        executor = LocalExecutor(options)
    return _audit_work(work, options, device, executor, on_kernel, cache)


@dataclass(frozen=True)
class KernelTask:
    """One kernel to audit, as an executor receives it: picklable, with the texts the driver
    read (a node without the same files runs these, `executors.placed`)."""

    index: int
    item: WorkItem
    text: str
    #: the text of its reference problem (`problem_text`), None without one or when wrapped
    problem: str | None


class Executor(Protocol):
    """Where kernels' audits run (`kaudit.dynamic.executors`)."""

    def audit(self, tasks: list[KernelTask], device: str,
              done: Callable[[KernelTask, KernelRun, float], None]) -> None:
        """Audit every task, calling `done(task, run, seconds)` in this process, one at a time,
        as each ends. Raises SandboxError and InstallationChanged."""


def _audit_work(work: list[tuple[WorkItem, str, OSError | None]], options: DynamicOptions,
                device: str, executor: Executor,
                on_kernel: Callable[[int, int, WorkItem, KernelRun, float], None] | None,
                cache: DynamicCache | None) -> list[KernelRun]:
    runs: list[KernelRun | None] = [None] * len(work)
    keys: dict[int, str] = {}
    pending: list[KernelTask] = []
    done = 0

    def finished(task: KernelTask, run: KernelRun, seconds: float) -> None:
        nonlocal done
        if cache and task.index in keys and not run.cached:
            cache.put(keys[task.index], run)
        runs[task.index] = run
        done += 1
        if on_kernel:
            on_kernel(done, len(work), task.item, run, seconds)

    for index, (item, text, unreadable) in enumerate(work):
        started = time.monotonic()
        wrapped = adapted.wrapped(item)
        problem = problem_text(item, options) if unreadable is None and not wrapped else None
        task = KernelTask(index, item, text, problem)
        if unreadable is not None:
            finished(task, incomplete(item.display, text, unreadable), 0.0)
            continue
        if cache and not wrapped:
            keys[index] = cache.key(item.display, text, problem)
            run = cache.get(keys[index])
            if run is not None:
                finished(task, run, time.monotonic() - started)
                continue
        pending.append(task)
    executor.audit(pending, device, finished)
    return [run if run is not None else
            incomplete(item.display, text, RuntimeError("the executor returned no result"))
            for run, (item, text, _) in zip(runs, work, strict=True)]


def audit_entry(item: WorkItem, text: str, options: DynamicOptions, device: str,
                 slots: GpuSlots | None, builds: BuildCache) -> KernelRun:
    """One kernel of a scan. Anything that stops its audit (a record that cannot be written out,
    an error in kaudit) is a KD504 finding for this kernel; the scan goes on."""
    submission = item.submission
    try:
        with contextlib.ExitStack() as stack:
            file = item.file
            wrapped = adapted.wrapped(item)  # another benchmark's layout: run through a wrapper
            if item.text is not None and not wrapped:
                folder = scratch.folder()  # a neutral name: the job sees this path
                stack.callback(scratch.remove, folder)
                file = _materialise_record(item, text, str(folder))
            gpu = stack.enter_context(slots.take()) if slots else None
            if wrapped:
                return adapted.audit(item, text, options, device, gpu=gpu, builds=builds)
            return audit_kernel(file, item.display, text, options, device,
                                submission.reference if submission else None,
                                submission.level if submission else None,
                                submission.problem if submission else None, gpu=gpu,
                                builds=builds)
    except SandboxError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported as not audited, the scan goes on
        return incomplete(item.display, text, exc)


def incomplete(display: str, text: str, exc: BaseException) -> KernelRun:
    """The run of a kernel whose audit stopped on `exc`: status incomplete, a KD504 finding."""
    run = KernelRun(display, status="incomplete")
    _not_completed(Adder(run, forward_location(display, text)), exc)
    return run


def _not_completed(add: Adder, exc: BaseException) -> None:
    add("KD504", f"not audited: the dynamic audit did not complete: "
        f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__,
        errno=getattr(exc, "errno", None))


def problem_text(item: WorkItem, options: DynamicOptions) -> str | None:
    """The text of the reference problem `item` runs against (its record's `ref_code` for a
    JSONL record), or None: what the dynamic result cache keys a kernel's result by."""
    if item.text is not None:
        return _record_reference(item)
    problem = _file_problem(item, options)
    try:
        return Path(problem).read_text(encoding="utf-8", errors="replace") if problem else None
    except OSError:
        return None


def _file_problem(item: WorkItem, options: DynamicOptions) -> str | None:
    """The reference problem of a kernel file (not a record), as its audit pairs it."""
    submission = item.submission
    return pair_problem(item.file, submission.reference if submission else None, options,
                        submission.level if submission else None,
                        submission.problem if submission else None)


def least_disk_first(tasks: list[KernelTask], options: DynamicOptions,
                     device: str) -> list[KernelTask]:
    """`tasks` in the order their audits should start: the least temporary disk first (unknown:
    none). An audit waits for its disk in a thread of the `--jobs`, first come first served: in
    the scan's order, on 80 real kernels on the H200, one of 48 GiB at the head of the queue
    held 11-13 of 14 threads waiting behind two large audits for most of 9 minutes, the
    machine idle (13 audits ended). The problems are sized at once (`SizeMemo.size_all`); where
    the disk is not reserved (`_audit`) the order is the scan's."""
    if device not in SIZED_DEVICES or scratch.usage()["limit_bytes"] is None or len(tasks) < 2:
        return tasks
    problems = {task.index: _file_problem(task.item, options)
                for task in tasks if task.item.text is None and not adapted.wrapped(task.item)}
    sizes = problem_sizing.sizes.size_all([path for path in problems.values() if path],
                                          options.init_seed)
    scales = len([scale for scale in options.scales if scale != 1])

    def writes(task: KernelTask) -> int:
        size = sizes.get(problems.get(task.index) or "")
        return problem_sizing.audit_writes(size, scales) if size is not None else 0

    return sorted(tasks, key=writes)


def _materialise_record(item: WorkItem, text: str, folder: str) -> str:
    """Write a JSONL record's kernel to `folder/kernel.py` and, when the record has a `ref_code`,
    that to `folder/problem.py` (found as its sibling problem); returns the kernel's path."""
    kernel = os.path.join(folder, "kernel.py")
    Path(kernel).write_text(text, encoding="utf-8")
    reference = _record_reference(item)
    if reference is not None:
        Path(folder, "problem.py").write_text(reference, encoding="utf-8")
    return kernel


def _record_reference(item: WorkItem) -> str | None:
    """The `ref_code` of the JSONL record holding `item`'s kernel, when it has one."""
    reference = item.submission.reference if item.submission else None
    match = re.search(r"#L(\d+)/ref_code$", reference or "")
    if not match:
        return None
    with open(item.file, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if number == int(match.group(1)):
                with contextlib.suppress(ValueError, AttributeError):
                    code = json.loads(line).get("ref_code")
                    if isinstance(code, str):
                        return code
                break
    return None


#: devices on which a kernel's problem is sized before its reference job runs, to reserve the
#: disk its audit writes and ask its share of the GPU (`size_claim`): on the GPU host, fourteen audits of level-1 problems at once (up to
#: 50 GiB each) filled its 64 GiB disk. On the CPU problems are small, and each audit would pay
#: one more job
SIZED_DEVICES = ("cuda",)


def size_claim(gpu: GpuClaim, size: problem_sizing.ProblemSize | None,
               scales: int) -> int | None:
    """Let the kernel's jobs ask first for the share of the GPU its problem is sized to need
    (`problem_sizing.audit_gpu_need`), not for their even share of it (0.9 / -j): each share is
    held in this process's ledger of the GPU for the whole job, and a job of a problem needing
    more ran out at it, ran wide (0.45) and held up every job after it (README: Sharing a GPU).
    Unsized problems, and GPUs whose memory is unknown, keep the even share (None); else the
    bytes asked."""
    memory = gpu_memory(gpu.device) if size is not None else None
    if memory is not None and memory.total > 0:
        gpu.need = problem_sizing.audit_gpu_need(size, scales, memory.total)
        return int(gpu.need * memory.total)
    return None


def gpu_memory_metrics(metrics: dict, need_bytes: int | None, candidate: RunResult) -> None:
    """`metrics.gpu_memory`: what the kernel's jobs asked first of the GPU (None: the even
    share) and the most the candidate job's caching allocator held, in bytes. The kernel's own
    process reports the second: a figure for sizing, never judged."""
    peak = candidate.value.get("gpu_peak_bytes") if isinstance(candidate.value, dict) else None
    metrics["gpu_memory"] = {"need_bytes": need_bytes,
                             "candidate_peak_bytes": peak if type(peak) is int else None}


def audit_kernel(file: str, display: str, text: str, options: DynamicOptions, device: str,
                 reference: str | None = None, level: int | None = None,
                 number: int | None = None, gpu: GpuClaim | None = None,
                 builds: BuildCache | None = None) -> KernelRun:
    """Audit one kernel file; `gpu`: its GPU on CUDA (`GpuSlots.take`).
    An audit that cannot complete (a full disk, an error in kaudit) is a KD504 finding; only
    `SandboxError` (`--sandbox on` where there is none) propagates."""
    run = KernelRun(display)
    add = Adder(run, forward_location(display, text))
    with job_seconds() as seconds:
        try:
            _audit(run, add, file, text, options, device, reference, level, number, gpu,
                   builds or BuildCache(options.extensions_dir))
        except SandboxError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as not audited, the scan goes on
            run.status = "incomplete"
            _not_completed(add, exc)
    if seconds:
        run.metrics["job_seconds"] = {kind: round(s, 2) for kind, s in seconds.items()}
    return run


def _audit(run: KernelRun, add: Adder, file: str, text: str, options: DynamicOptions,
           device: str, reference: str | None, level: int | None, number: int | None,
           gpu: GpuClaim | None, builds: BuildCache) -> None:
    reason = cuda_reason(text)
    problem = pair_problem(file, reference, options, level, number)
    run.problem = display_path(problem) if problem else None
    if reason and device != "cuda":
        run.status = "needs-cuda"
        add("KD500", f"not run: needs CUDA ({reason}) and this run has no CUDA device",
            reason=reason)
        return
    if problem is None:
        run.status = "no-problem"
        add("KD502", "not run: no reference problem (give --problem FILE, put problem.py next "
            "to the kernel, or --problems ROOT for KernelBench names)")
        return
    memory = job_memory_limit(options.memory_limit) if device == "cpu" else None
    cpu_seconds = cpu_time_limit(options.timeout) if device == "cpu" else None
    scales = [s for s in options.scales if s != 1]
    problem = os.path.abspath(problem)
    # sized once, where a sizing job pays: the disk the audit reserves and its share of the GPU
    size = problem_sizing.sizes.size(problem, options.init_seed) \
        if device in SIZED_DEVICES else None
    need_bytes = size_claim(gpu, size, len(scales)) if gpu is not None else None
    common = {"problem": problem, "device": device,
              "init_seed": options.init_seed, "seeds": list(options.seeds), "scales": scales}
    env: dict[str, str] = {}
    limits = {"timeout": options.timeout, "seed": options.init_seed, "memory_limit": memory,
              "cpu_limit": cpu_seconds, "gpu": gpu}
    limit = scratch.usage()["limit_bytes"]
    # the bytes the audit's jobs are expected to hold at most; 0 (not reserved) when unknown or
    # when the scan's temporary disk has no limit
    writes = problem_sizing.audit_writes(size, len(scales)) \
        if size is not None and limit is not None else 0
    if limit is not None and writes > limit:
        # it would wait for every other audit to end, then fail on the limit
        run.status = "incomplete"
        add("KD504", f"not audited: the audit's jobs would hold about {format_size(writes)} "
            f"(the problem's inputs and outputs, sized on the meta device), more than the "
            f"scan's temporary-disk limit of {format_size(limit)} (--temp-limit)",
            estimate_bytes=writes, limit_bytes=limit)
        return
    with contextlib.ExitStack() as held:
        # the whole audit's room, once, before anything else is held: an audit that holds
        # kaudit's memory or the GPU never waits for disk, so no two audits wait for each other
        limits["disk"], waited = held.enter_context(scratch.reserving(writes))
        if limits["disk"] is not None:
            add_job_seconds("disk_wait", waited)
        reference_result = held.enter_context(run_job(
            Job(REFERENCE_TARGET, common, env=env, visible=(os.path.dirname(problem),),
                **limits)))
        if not reference_result.ok:
            run.status = "reference-failed"
            if reference_result.phase is None:
                try:
                    reference_result.phase = reference_result.path("phase.txt").read_text(
                        encoding="utf-8")[:40]
                except (OSError, FileNotFoundError):
                    pass
            if disk_full(reference_result):
                not_audited(add, reference_result, "reference problem's job")
                return
            add("KD503", f"not run: the reference problem {run.problem} failed: "
                f"{reference_result.describe()}{memory_note(reference_result, memory)}",
                **failure_metrics(reference_result))
            return
        keys = [f"s{index}" for index in range(len(scales))]
        sizes = {name: reference_result.path(name).stat().st_size
                 for name in reference_result.files() if name.startswith("ref")}
        add_job_seconds("memory_wait",
                        held.enter_context(host_memory.holding(sum(sizes.values()))))
        loading = time.monotonic()
        try:
            refs = {n: reference_result.load_tensors(f"ref_{n}.pt") for n in ("a", "b")}
            scaled_refs = _scaled_references(reference_result, keys, scales, len(refs["a"]))
            reference_left = _reference_mutations(reference_result)
            add_job_seconds("parent:load-references", time.monotonic() - loading)
        except OutputError as exc:
            run.status = "reference-failed"
            add("KD503", f"not run: the reference problem {run.problem} returned no tensors: "
                f"{exc}")
            return
        # the reference outputs now live only in this process: their files go before any
        # candidate code runs; the inputs (and init.pt), written once, are shared read-only by
        # the kernel's jobs
        for name in reference_result.files():
            if name.startswith("ref"):
                reference_result.path(name).unlink()
        shared = share_inputs(reference_result, [
            name for name in reference_result.files()
            if name.startswith("inputs_") or name == "init.pt"], limits["disk"])
        inputs = LazyInputs(shared, dict(zip(keys, scales)))
        try:
            interpreted = device == "cpu" and uses_triton(text)
            if interpreted:
                env = {**env, "TRITON_INTERPRET": "1"}
            # torch's extension builds: ninja with every core unless the caller chose
            env = {**env, "MAX_JOBS": os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)}
            schedule = random.Random(f"{options.key}\0{run.path}")
            kernel = os.path.abspath(file)
            visible = (os.path.dirname(kernel), os.path.dirname(problem))
            with builds.use(text) as build:
                # compiled first on no GPU, so that no compile holds a share of it
                build_ahead(text, kernel, problem, build, env, visible=visible,
                            writable=(build,), **limits)
                job = Job(CANDIDATE_TARGET, {**common, "kernel": kernel, "build_dir": build,
                                             "poison_key": options.key,
                                             "schedule_seed": schedule.getrandbits(48),
                                             "calls": schedule.randint(*options.calls)},
                          env=env, inputs=shared, visible=visible, writable=(build,), **limits)
                with run_job(job) as candidate:
                    if device == "cuda":
                        gpu_memory_metrics(run.metrics, need_bytes, candidate)
                    judging = time.monotonic()
                    watched = judge(run, add, candidate, refs, inputs, scaled_refs, options,
                                    reference_left, interpreted,
                                    _reference_noise(reference_result, len(refs["a"])),
                                    compiles_extension(text))
                    add_job_seconds("parent:judge", time.monotonic() - judging)
                if watched is None or run.status != "ok" or rejected(run):
                    return  # the second opinion is for kernels the watched calls found right
                if run.metrics.get("initialisation") == "own":  # judged as KernelBench builds it
                    common = {**common, "own_init": True}
                plain = Job(PLAIN_TARGET, {**common, "kernel": kernel, "build_dir": build,
                                           "calls": PLAIN_CALLS},
                            env=env, inputs=shared, visible=visible, writable=(build,), **limits)
                with run_job(plain) as result:
                    second_opinion(add, result, refs["a"], watched.a, options.tolerance)
                if run.status != "ok":
                    return  # a full disk stopped the plain run: the audit is incomplete
                if not rejected(run):
                    reference_job = Job(REFERENCE_TARGET, common, env=env,
                                        visible=(os.path.dirname(problem),), **limits)
                    shape_sweep(add, run.metrics, problem, reference_job, plain,
                                os.path.getsize(shared.path("inputs_a.pt")))
                    timed_sweep(add, run.metrics, problem, reference_job, plain, device)
                if options.timing.enabled(device) and not rejected(run):
                    # alone on the GPU: another job's work would add to both sides' trials;
                    # gated, so that its process and CUDA context are made before its turn
                    timed = {**limits, "gpu": gpu and replace(gpu, alone=True),
                             "gated": gpu is not None}
                    measure(add, run.metrics, timing_job(
                        options.timing, common, kernel, build, options.key, run.path, env=env,
                        inputs=shared, visible=visible, writable=(build,), **timed),
                        refs, watched, options.tolerance, device)
                if device == "cuda" and not rejected(run):
                    attribute(add, run.metrics, profile_job(
                        common, kernel, build, env=env, inputs=shared, visible=visible,
                        writable=(build,), **limits),
                        OwnKernels.of_source(file, text), options.policy,
                        same_answer=_same_answer(refs["a"], refs["b"]))
        finally:
            scratch.remove(shared.folder)


def _same_answer(first: list, second: list) -> bool:
    """The reference's answers for two input sets are equal, bit for bit."""
    import torch  # the dynamic path only

    return len(first) == len(second) and all(
        isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
        and a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(first, second))


class LazyInputs(Mapping[str, list]):
    """A kernel's inputs by kind (`a`, `b`, and `s<k>` made from `a` as the jobs make them), read
    from its shared folder only when asked: only a kernel that changed its inputs needs one set
    here (KD402), and a level-1 set reaches gigabytes."""

    def __init__(self, shared: SharedInputs, scales: dict[str, float]) -> None:
        self._shared, self._scales, self._loaded = shared, scales, {}

    def __getitem__(self, kind: str) -> list:
        if kind not in self._loaded:
            import torch  # the dynamic path only

            if kind in self._scales:
                self._loaded[kind] = [scale_input(v, self._scales[kind], torch) for v in self["a"]]
            elif kind in ("a", "b"):
                self._shared.check()
                self._loaded[kind] = list(torch.load(self._shared.path(f"inputs_{kind}.pt"),
                                                     map_location="cpu", weights_only=True))
            else:
                raise KeyError(kind)
        return self._loaded[kind]

    def __contains__(self, kind: object) -> bool:  # without reading the set
        return kind in ("a", "b") or kind in self._scales

    def __iter__(self) -> Iterator[str]:
        return iter(("a", "b", *self._scales))

    def __len__(self) -> int:
        return 2 + len(self._scales)


def _reference_noise(result: RunResult, outputs: int) -> list[float | None] | None:
    """Per output, the reference's relative L2 distance from its own float64 run on inputs A
    (`harness/kernel_job._reference_noise`): numbers only, one per output, else None."""
    found = (result.value or {}).get("noise")
    if not isinstance(found, list) or len(found) != outputs:
        return None
    return [_distance(value) for value in found]


def _distance(value: Any) -> float | None:
    """A distance a reference job reported: a number >= 0 (inf included), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and value >= 0 else None  # NaN is not >= 0


def _reference_mutations(result: RunResult) -> dict[str, list] | None:
    """What the problem's own forward left in each input set it modified (`a`, `b`), or None
    when it modifies none. Raises OutputError for a file that cannot be read."""
    if not (result.value or {}).get("mutates_inputs"):
        return None
    left: dict[str, list] = {}
    for name in ("a", "b"):
        file = f"ref_inputs_after_{name}.pt"
        if file in result.files():
            left[name] = list(result.load(file))
    return left


def _scaled_references(result: RunResult, keys: list[str], scales: list[float],
                       outputs: int) -> list[dict]:
    """Per scale: the float64 reference outputs (`fp64`, when the float64 copy ran), and per
    output the native reference's distance from them (`errors`: (relative L2, max error ratio),
    or None), its dtype and the bytes of all (`harness/kernel_job.run_reference`)."""
    described = (result.value or {}).get("scales", {})
    scaled = []
    for key, factor in zip(keys, scales):
        record = described.get(key) if isinstance(described.get(key), dict) else {}
        errors = record.get("errors") if isinstance(record.get("errors"), list) else []
        dtypes = record.get("dtypes") if isinstance(record.get("dtypes"), list) else []
        size = record.get("bytes")
        scaled.append({
            "key": key, "scale": factor,
            "fp64": result.load_tensors(f"ref64_{key}.pt") if record.get("fp64") else None,
            "errors": [tuple(map(_distance, pair)) if isinstance(pair, list) and len(pair) == 2
                       else None for pair in errors[:outputs]],
            "dtypes": [str(d) for d in dtypes[:outputs]],
            "bytes": size if isinstance(size, int) and not isinstance(size, bool) and size >= 0
            else 0,
            "fp64_error": record.get("fp64_error")})
    return scaled