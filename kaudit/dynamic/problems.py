"""`kaudit problems`: audit a benchmark's own correctness checks.

For each KernelBench problem file, a child process (`kaudit.dynamic.runner`,
`kaudit.dynamic.harness.problem_job`) computes the reference outputs; this module, in the kaudit
process, loads them and asks whether the benchmark's check can tell a real kernel from a trivial one:

- KP101 an all-zeros output passes on every seed;
- KP102 one constant passes on every seed;
- KP103 the reference output for other inputs (another seed) passes;
- KP104 the reference is degenerate: NaN/Inf, all zero, all equal, input-independent, noise;
- KP201 the check is dominated by its absolute part at this output's scale;
- KP301 the native-dtype reference is ill-conditioned at a listed input scale;
- KP501 the problem could not be run; KP502 the float64 or scaled runs could not be run.

Problem code never runs in this process; torch is imported here only to load and compare tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from kaudit.discover import display_path, natural_key
from kaudit.dynamic import forkserver, scratch
from kaudit.dynamic.adapted import BenchmarkProblem, benchmark_check, find_problems, write_problem
from kaudit.dynamic.gpu_share import GpuClaim, GpuSlots, gpu_memory, visible_gpus
from kaudit.dynamic.limits import cpu_time_limit, job_memory_limit, judging_threads
from kaudit.dynamic.problem_sizing import gpu_need, size_problems, sizing_jobs
from kaudit.dynamic.problem_results import (  # noqa: F401 - the names callers import from here
    Options,
    ProblemResult,
    ProblemsReport,
    summarize,
)
from kaudit.dynamic.problems_analysis import Finder, analyse
from kaudit.dynamic.runner import Gate, Job, job_seconds, run_job
from kaudit.dynamic.sandbox import SandboxError
from kaudit.findings import ScanError, assign_fingerprints
from kaudit.source import split_lines

JOB_TARGET = "problem_job:run_problem"
_CLASS_MODEL = re.compile(r"^class\s+Model\b", re.M)
_GET_INPUTS = re.compile(r"^def\s+get_inputs\b", re.M)


# -- discovery -------------------------------------------------------------------------------


def is_problem_text(text: str) -> bool:
    return bool(_CLASS_MODEL.search(text) and _GET_INPUTS.search(text))


def discover_problems(paths: Iterable[str]) -> tuple[list[str | BenchmarkProblem], int,
                                                     list[ScanError]]:
    """Problem files among `paths`: files named are always taken; folders are walked (hidden
    folders and __pycache__ skipped) for .py files defining `class Model` and `get_inputs`, and
    for other benchmarks' problems (`adapted.find_problems`: Atrex-Bench operator folders,
    KernelBenchX task files). Raises FileNotFoundError for a path that does not exist."""
    paths = list(paths)
    missing = [p for p in paths if not os.path.lexists(p)]
    if missing:
        raise FileNotFoundError(f"no such file or directory: {', '.join(missing)}")
    files: list[str] = []
    skipped = 0
    errors: list[ScanError] = []
    seen: set[str] = set()
    for path in paths:
        others: list[str | BenchmarkProblem] = list(find_problems(path))
        if others and os.path.isfile(path):
            found = others
        elif os.path.isfile(path):
            found = [path]
        else:
            kernelbench, skip = _walk(path)
            found = kernelbench + others
            skipped += skip - len(others)
            if not found:
                errors.append(ScanError(display_path(path), "no KernelBench problem files found "
                                        "(class Model and get_inputs)"))
        for file in found:
            key = os.path.realpath(file if isinstance(file, str) else file.file)
            if key not in seen:
                seen.add(key)
                files.append(file)
    return files, skipped, errors


def _walk(folder: str) -> tuple[list[str], int]:
    found, skipped = [], 0
    for directory, subfolders, names in os.walk(folder):
        subfolders[:] = sorted(d for d in subfolders
                               if not d.startswith(".") and d != "__pycache__")
        for name in names:
            if not name.endswith(".py") or name.startswith("."):
                continue
            file = os.path.join(directory, name)
            try:
                text = Path(file).read_text(encoding="utf-8", errors="replace")
            except OSError:
                skipped += 1
                continue
            if is_problem_text(text):
                found.append(file)
            else:
                skipped += 1
    return sorted(found, key=natural_key), skipped


def model_line(file: str) -> tuple[int, list[str]]:
    """The line of `class Model` (findings point there), or 1; and the file's lines."""
    try:
        text = Path(file).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 1, []
    match = _CLASS_MODEL.search(text)
    return (text.count("\n", 0, match.start()) + 1 if match else 1), split_lines(text)


# -- running ---------------------------------------------------------------------------------

#: on a GPU, one job in this many (at least one) is started ahead of its turn (`claimed`)
STARTED_AHEAD = 4


@dataclasses.dataclass(frozen=True)
class GpuSize:
    """What a problem is expected to take: `need`, the share of the GPU its job asks first (a
    fraction), and `flops`, forward's floating-point operations (None: unknown)."""

    need: float
    flops: int | None


def gpu_sizes(files: list, options: Options, timeout: float = 120.0,
              gate: Gate | None = None) -> dict[str, GpuSize]:
    """What each KernelBench-shaped problem file is expected to take on the GPU (by path), from
    CPU jobs that size them on torch's meta device (`sizing_jobs` of them); problems they could
    not size, and every problem of a job that failed, are left out (they start at their share).
    With a `gate`, the jobs make the meta device ready at once and size once the gate is
    entered (`size_problems`)."""
    paths = [os.path.abspath(f) for f in files if isinstance(f, str)]
    gpus = visible_gpus()
    memory = gpu_memory(gpus[0]) if gpus and paths else None
    if memory is None or memory.total <= 0:
        return {}
    return {path: GpuSize(gpu_need(size, memory.total), size.flops)
            for path, size in size_problems(paths, options.init_seed, timeout, gate,
                                            sizing_jobs(len(paths))).items()
            if size is not None}


def start_order(files: list, sizes: dict[str, GpuSize]) -> list[int]:
    """The indices of `files` in the order their jobs start: the most memory and the most work
    first (each as a share of the largest), so that none of the long or large ones starts last
    and runs alone at the end. Ordered by memory alone, KernelBench level 1's slowest problem (a
    float64 3D transposed convolution, 23 s on the H200) started at 54 s of a 78 s run and
    ended it."""
    known = [sizes[key] for key in map(_key, files) if key in sizes]
    most_need = max((size.need for size in known), default=0.0) or 1.0
    most_flops = max((size.flops or 0 for size in known), default=0) or 1

    def weight(index: int) -> float:
        size = sizes.get(_key(files[index]))
        return size.need / most_need + (size.flops or 0) / most_flops if size else 0.0

    return sorted(range(len(files)), key=lambda index: -weight(index))


def _key(file: str | BenchmarkProblem) -> str:
    return os.path.abspath(file) if isinstance(file, str) else ""


def resolve_device(requested: str) -> str:
    """"auto" -> "cuda" when torch sees a CUDA device, else "cpu". Raises ValueError for an
    unknown device and for "cuda" without CUDA."""
    if requested not in ("auto", "cpu", "cuda"):
        raise ValueError(f"unknown device {requested!r}: auto, cpu or cuda")
    if requested == "cpu":
        return "cpu"
    import torch

    available = torch.cuda.is_available()
    if requested == "cuda" and not available:
        raise ValueError("--device cuda, but torch.cuda.is_available() is False")
    return "cuda" if available else "cpu"


class EarlySizing:
    """`gpu_sizes` in a thread, started before kaudit is ready to run problem code: its jobs
    start meanwhile and make the meta device ready, and size once `allow`ed; `refuse`d, they
    are stopped and size nothing."""

    def __init__(self, files: list, options: Options) -> None:
        self.began = time.monotonic()
        self.seconds = 0.0
        self._decided = threading.Event()
        self._allowed = False
        self._sizes: dict[str, GpuSize] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._size, args=(files, options),
                                        name="gpu-sizing", daemon=True)
        self._thread.start()

    def allow(self) -> dict[str, GpuSize]:
        """Let the job size, and wait for its sizes; what sizing raised (kaudit stopping, say)
        is raised here."""
        self._allowed = True
        self._decided.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sizes

    def refuse(self) -> None:
        """Stop the job (kaudit is stopping): whatever it raised goes with it."""
        self._decided.set()
        self._thread.join()

    @contextlib.contextmanager
    def _gate(self) -> Iterator[dict]:
        self._decided.wait()
        if not self._allowed:
            raise JobsRefused("kaudit stopped before the problems were sized")
        yield {}

    def _size(self, files: list, options: Options) -> None:
        try:
            self._sizes = gpu_sizes(files, options, gate=self._gate)
        except JobsRefused:
            pass
        except BaseException as exc:  # noqa: BLE001 - raised by `allow`, in the audit's thread
            self._error = exc
        finally:
            self.seconds = time.monotonic() - self.began


class JobsRefused(Exception):
    """A gated job was not let go on: kaudit stopped first."""


def audit_problems(paths: Iterable[str], options: Options,
                   on_problem: Callable[[int, int, ProblemResult], None] | None = None,
                   before_jobs: Callable[[], None] = lambda: None) -> ProblemsReport:
    """Run and probe every problem under `paths`; `on_problem(done, total, problem)` after each.
    `before_jobs()` is called once the problems are found, before any of their code runs (the
    CLI's `selfcheck.Installation.before_jobs`); the GPU sizing job starts beside it. Raises
    FileNotFoundError for a missing path and ValueError for an unusable device; a problem
    that fails is a KP501 finding, never an error."""
    began = time.monotonic()
    files, skipped, errors = discover_problems(paths)
    device = resolve_device(options.device)
    report = ProblemsReport(options, device, errors=errors, files_skipped=skipped)
    memory = job_memory_limit(options.memory_limit) if device == "cpu" else None
    cpu_seconds = cpu_time_limit(options.timeout) if device == "cpu" else None
    slots = GpuSlots(options.jobs) if device == "cuda" else None
    budget = scratch.start_budget(options.temp_limit)
    sizing = EarlySizing(files, options) if slots and len(files) > 1 else None
    prepared = time.monotonic()
    try:
        before_jobs()
    except BaseException:
        if sizing is not None:
            sizing.refuse()
        raise
    prepared_s = time.monotonic() - prepared
    sizes = sizing.allow() if sizing is not None else {}
    # `jobs` problems run at once; on a GPU as many more are judged meanwhile (on its host's
    # CPU), instead of keeping the GPU waiting for the judging of the one before (a second or
    # two each), and a few jobs are started ahead of their turn (their CUDA contexts made);
    # each more holds a context (518 MiB on the H200) and the host's cores: 12 ahead of 12
    # turns made -j 12 take 76.6 s, against 70.2 s with none
    turns = threading.Semaphore(max(1, options.jobs))
    # on a GPU, each GPU's own turns: a job started ahead on one GPU waits for that GPU's turn
    gpu_turns = {gpu: threading.Semaphore(slots.jobs_per_gpu) for gpu in slots.gpus} \
        if slots is not None else {}
    workers = options.jobs * (2 if slots else 1)
    live_jobs = threading.Semaphore(options.jobs + max(1, options.jobs // STARTED_AHEAD))

    def one(file: str | BenchmarkProblem) -> ProblemResult:
        if not isinstance(file, BenchmarkProblem):
            return run(file, file, model_line(file), options)
        # another benchmark's problem runs through its KernelBench-shaped wrapper
        where, folder = file.location(), scratch.folder()
        try:
            wrapper = write_problem(file.spec, file.names, Path(folder, "problem"))
            if isinstance(wrapper, str):
                problem = ProblemResult(display_path(file.file), where.line, where.end_column,
                                        status="failed", error=wrapper)
                Finder(problem)("KP501", f"the problem could not be run: {wrapper}")
                return problem
            chosen = dataclasses.replace(options, tolerance=benchmark_check(file.spec)) \
                if options.benchmark_checks else options
            return run(str(wrapper), file.file, (where.line, model_line(file.file)[1]), chosen)
        finally:
            scratch.remove(folder)

    @contextlib.contextmanager
    def claimed(file: str) -> Iterator[GpuClaim | None]:
        """The problem's GPU, asking first for the share it was sized to need, and its turn. On
        a GPU the turn is taken in the job's gate, its process and CUDA context made: on the
        H200 these took 1.7 s a job, and half the jobs had no wait for memory to make them in."""
        with contextlib.ExitStack() as stack:
            gpu = None
            if slots is not None:
                stack.enter_context(live_jobs)
                gpu = stack.enter_context(slots.take())
            if gpu is None:
                stack.enter_context(turns)
            else:
                sized = sizes.get(_key(file))
                gpu.need = sized.need if sized is not None else None
                turn = gpu_turns[gpu.device]
                gpu.turn = lambda: turn
            yield gpu

    def run(file: str, shown: str, model: tuple[int, list[str]], options: Options
            ) -> ProblemResult:
        line, lines = model
        display = display_path(shown)
        end_column = len(lines[line - 1]) + 1 if 0 < line <= len(lines) else 1
        started = time.monotonic()
        try:
            with job_seconds() as runs, contextlib.ExitStack() as judging:
                with claimed(file) as gpu:  # the turn ends with the job, not its judging
                    turned = time.monotonic()
                    result = judging.enter_context(run_job(Job(JOB_TARGET, {
                        "path": os.path.abspath(file), "device": device,
                        "seeds": options.seed_values(), "init_seed": options.init_seed,
                        "scales": list(options.scales), "max_elements": options.max_elements},
                        timeout=options.timeout, seed=options.init_seed, memory_limit=memory,
                        cpu_limit=cpu_seconds, visible=(os.path.dirname(os.path.abspath(file)),),
                        gpu=gpu, gated=gpu is not None)))
                judged = time.monotonic()
                problem = analyse(result, display, line, options, end_column, memory_limit=memory)
                problem.job_seconds["judge"] = round(time.monotonic() - judged, 3)
                # the timeline of the run: when its job started, and how long it waited to
                # (on a GPU, the wait for its turn is part of its wait for memory, `gpu_wait_s`)
                problem.job_seconds["queued"] = round(turned - started, 3)
                problem.started_s = round(turned - began, 3)
                if gpu is not None:
                    problem.gpu_need, problem.gpu_runs = gpu.need, result.gpu_runs
            # the steps above are the last run's; every run of the job, a run that ran out of
            # GPU memory before a wider one included, waits for memory too
            problem.job_seconds["runs"] = round(runs.get("problem", 0.0), 3)
        except SandboxError:
            raise
        except Exception as exc:  # a full disk, or a kaudit bug: not run, said so; the run goes on
            internal = "" if isinstance(exc, OSError) else "internal error: "
            problem = ProblemResult(display, line, max(1, end_column), status="failed",
                                    error=f"{internal}{exc.__class__.__name__}: {exc}")
            Finder(problem)("KP501", f"the problem could not be run: {problem.error}",
                            status="error", error_type=exc.__class__.__name__)
        # every run of its job and the waits for the GPU, not only the last run
        problem.wall_s = time.monotonic() - started
        problem.findings = assign_fingerprints(problem.findings, {display: lines})
        return problem

    total = len(files)
    if workers <= 1 or total <= 1:
        for done, file in enumerate(files, start=1):
            report.problems.append(one(file))
            if on_problem:
                on_problem(done, total, report.problems[-1])
    else:
        with judging_threads(options.jobs), ThreadPoolExecutor(max_workers=workers) as pool:
            # the report keeps the order of the files
            started = {pool.submit(one, files[i]): i for i in start_order(files, sizes)}
            ended: list[ProblemResult | None] = [None] * total
            for done, future in enumerate(as_completed(started), start=1):
                ended[started[future]] = problem = future.result()
                if on_problem:  # as each ends (--stream), not held back for the files before
                    on_problem(done, total, problem)
            report.problems += [problem for problem in ended if problem is not None]
    report.errors += [ScanError(p.path, p.error, internal=True) for p in report.problems
                      if p.error and p.error.startswith("internal error")]
    report.summary = summarize(report.problems)
    report.summary["temp"] = budget.usage()
    report.summary["preparation_s"] = round(prepared_s, 3)
    if sizing is not None and sizes:  # from its start, kaudit's preparation beside it
        report.summary["gpu_sizing_s"] = round(sizing.seconds, 3)
    times = forkserver.server_times()
    if times is not None:  # its start, from the audit's (negative: ready before the audit began)
        report.summary["fork_server"] = {"start_s": round(times[1] - times[0], 3),
                                         "ready_s": round(times[1] - began, 3)}
    # what the command took besides (kaudit's start before, the report and its exit after)
    report.summary["audit_s"] = round(time.monotonic() - began, 3)
    return report
