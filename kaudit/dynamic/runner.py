"""Run one job in an isolated child process: "call this function with these JSON arguments, give me
back its JSON result and the files it wrote".

    job = Job("problem_job:run_problem", {"path": ...}, timeout=60)
    with run_job(job) as result:
        if result.ok:
            outputs = result.load_tensors("seed0.pt", max_bytes=...)
        else:
            print(result.status, result.describe())

`target` names a function of the job-side package (`kaudit.dynamic.harness`, which jobs import as
`harness`: nothing in a job names kaudit) or of a file (`/path/file.py:function`).

What the child gets (`kaudit.dynamic.sandbox` starts it; the README's threat model says what is
defended):
- a supervisor of its own, forked from kaudit's fork server (`kaudit.dynamic.forkserver`, torch
  imported once) or, with `KAUDIT_FORKSERVER=0` or when the server cannot start or died with the
  job, a fresh interpreter (`python -m harness.child SPEC`); nothing the job does (monkey-patching
  torch, `sys.modules`) reaches the parent or the next job;
- with the sandbox (`--sandbox`, default where it works): new user, mount, PID and network
  namespaces, a read-only filesystem but for its own folders, kaudit's installation hidden;
- its own session and process group, and a supervisor that kills every process it left (the PID
  namespace does it with the sandbox); on timeout kaudit SIGKILLs the supervisor and the group;
- a fresh folder with a neutral name (`work` its working folder, `out` for its files, `tmp` its
  TMPDIR and caches, `lib` the harness package), removed afterwards; the inputs of its problem,
  written once by the problem's reference job and shared read-only by the problem's other jobs
  (`share_inputs`, `Job.inputs`, `args["in_dir"]`), never copied;
- a bounded share of the scan's temporary disk (`scratch.start_budget`, `--temp-limit`): each
  file it writes is capped at what is left of the limit when it starts, and a job whose folder
  takes the scan's temporary files over the limit fails with EDQUOT (KD504 / KP501);
- a scrubbed environment, exactly that and the job's own variables: PATH, HOME, locale,
  CUDA_VISIBLE_DEVICES, CUDA_HOME, LD_LIBRARY_PATH, OMP_NUM_THREADS and TORCH_* / PYTORCH_*
  variables pass (while audits run at once on a GPU, OMP_NUM_THREADS that the user did not set
  is the cores shared out among them: `sharing_cores`); everything else (tokens, cloud keys,
  proxies) is dropped; PYTHONPATH is the harness copy followed by the parent's PYTHONPATH less
  the entries holding kaudit; no bytecode is written;
- RLIMIT_FSIZE and RLIMIT_NPROC, optional RLIMIT_AS (address space; CPU runs only, CUDA reserves
  huge virtual ranges) and RLIMIT_CPU, no core files, no capabilities;
- stdin from /dev/null; stdout and stderr captured by the supervisor, the first 64 KiB and the last
  256 KiB of each kept (tails in the result).

`run_job` may be called from several threads at once; each call waits for its own child.

Every failure (crash, signal, timeout, import error, OOM, a result that is not JSON) is a
`RunResult` with a status, never an exception.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kaudit.dynamic import forkserver, gpu_share, sandbox, scratch
from kaudit.dynamic.forkserver import Launch, copy_harness
from kaudit.dynamic.harness.child import traced

ENV_KEEP = ("PATH", "HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ",
            "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH",
            "OMP_NUM_THREADS", "MKL_NUM_THREADS")
ENV_KEEP_PREFIXES = ("TORCH_", "PYTORCH_")
#: how much of stdout / stderr a result keeps
TAIL_CHARS = 4000
#: RLIMIT_FSIZE of a job unless it says otherwise: the largest file it may write
FILE_SIZE_LIMIT = 64 << 30
#: RLIMIT_NPROC of a job: processes of its user (not enforced for root)
PROCESS_LIMIT = 4096
#: what a job's folder holds
FOLDERS = ("work", "out", "tmp", "lib")
#: the file that lets a gated job go on (`Job.gated`), in a folder of its own
GATE_FOLDER, GO_FILE = "gate", "go.json"

OK, ERROR, OOM, TIMEOUT, CRASHED = "ok", "error", "oom", "timeout", "crashed"
#: what a gated job waits for (`Job.gated`): entered once it started, it yields the arguments
#: the job goes on with and is held until the job ends
Gate = Callable[[], contextlib.AbstractContextManager[dict]]


@dataclass(frozen=True)
class Job:
    """What to run: `target` is `package.module:function` or `/path/file.py:function`; the function
    is called as `function(args, out_dir)` and returns JSON-serialisable data."""

    target: str
    args: Mapping[str, Any] = field(default_factory=dict)
    timeout: float = 300.0
    seed: int = 0
    #: RLIMIT_AS in bytes (leave None for CUDA jobs)
    memory_limit: int | None = None
    #: RLIMIT_CPU in seconds of CPU time (all threads together)
    cpu_limit: float | None = None
    #: variables added to the scrubbed environment
    env: Mapping[str, str] = field(default_factory=dict)
    #: the inputs of its problem (`share_inputs`): read-only, named to the job as `in_dir`
    inputs: SharedInputs | None = None
    #: folders the job reads (a kernel's and its problem's): visible, read-only, in the sandbox
    visible: tuple[str, ...] = ()
    #: folders outside its own folder it may write (its kernel's build folder)
    writable: tuple[str, ...] = ()
    #: RLIMIT_FSIZE in bytes
    file_size_limit: int = FILE_SIZE_LIMIT
    #: the GPU it runs on (CUDA_VISIBLE_DEVICES, its memory cap, the GPU's lock and the retry of
    #: an out-of-memory failure alone on it: `gpu_share`); None on CPU
    gpu: gpu_share.GpuClaim | None = None
    #: the room its audit reserved on the scan's temporary disk (`scratch.reserve`): its folder
    #: is charged to it, and it may write what is left of it; None: what is left of the limit
    disk: scratch.Reservation | None = None
    #: on a GPU, the job starts before its share of the GPU's memory is granted and waits for
    #: it, having run no code of its problem (`args["go"]`, a file its cap comes in, in a
    #: folder it sees read-only): its process start and CUDA context are made meanwhile (the
    #: problem job); on the CPU, a gated job waits likewise for the gate given to `run_job`
    gated: bool = False
    #: it sees no GPU: CUDA_VISIBLE_DEVICES is empty and, in the sandbox, its /dev has no GPU
    #: device, so that no process it starts sees one either (code run while others time alone)
    no_gpu: bool = False


@dataclass
class RunResult:
    """How a job ended. `out_dir` and the files in it live until `close()` (or the `with` ends)."""

    status: str
    value: Any = None
    phase: str | None = None
    error_type: str = ""
    error: str = ""
    traceback: str = ""
    stdout_tail: str = ""
    stderr_tail: str = ""
    returncode: int | None = None
    wall_s: float = 0.0
    #: the OSError number of a job that failed on one (ENOSPC: the disk is full)
    errno: int | None = None
    out_dir: Path | None = None
    #: it ran out of GPU memory beside other jobs, and this is its run alone on the GPU
    retried_alone: bool = False
    #: it ran holding its GPU's exclusive lock: no other kaudit job of the user ran on the GPU
    #: meanwhile (a timing job in its lane, a retry alone), as far as kaudit's process knows
    held_gpu_alone: bool = False
    #: for a job that ran out of GPU memory even alone on the GPU: what was free then
    gpu_note: str = ""
    #: seconds it waited for GPU memory and locks before its runs (`gpu_share.run_claimed`)
    gpu_wait_s: float = 0.0
    #: runs of the job on its GPU (`gpu_share.run_claimed`): 1, or more after running out of
    #: memory at a narrower share
    gpu_runs: int = 1
    #: seconds of its earlier runs, which ran out of GPU memory and were thrown away
    gpu_retry_s: float = 0.0
    #: the job's own report of its phases' seconds (`build`, `import`, `forward` ...), bounded
    #: (`phase_seconds`): it may have run code under audit
    phases: dict[str, float] = field(default_factory=dict)
    _root: Path | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def describe(self) -> str:
        """One line: what went wrong, for a finding's message."""
        if self.ok:
            return "ok"
        where = f" during {self.phase}" if self.phase else ""
        if self.status == TIMEOUT:
            return f"timed out after {self.wall_s:.0f} s{where}"
        head = f"{self.error_type}: {self.error}" if self.error_type else self.error
        if self.status == OOM:
            return f"out of memory{where}: {head}{self.gpu_note}"
        if self.status == CRASHED:
            return f"crashed{where}: {head}{self.gpu_note}"
        return f"failed{where}: {head}{self.gpu_note}"

    @property
    def root(self) -> Path | None:
        """The job's folder (`build` and the like live there), until `close()`."""
        return self._root

    def files(self) -> list[str]:
        if self.out_dir is None or not self.out_dir.is_dir():
            return []
        return sorted(p.name for p in self.out_dir.iterdir() if p.is_file() and not p.is_symlink())

    def path(self, name: str) -> Path:
        """A file the child wrote, refusing names that leave the output folder and symlinks."""
        if self.out_dir is None or "/" in name or name in ("", ".", ".."):
            raise FileNotFoundError(name)
        path = self.out_dir / name
        if path.is_symlink() or not path.is_file():
            raise FileNotFoundError(name)
        return path

    def read_json(self, name: str) -> Any:
        return json.loads(self.path(name).read_text(encoding="utf-8"))

    def load_tensors(self, name: str, max_bytes: int | None = None) -> list:
        """A file saved by the child with `torch.save(tensor or list of tensors)`, loaded with
        `weights_only=True` onto the CPU; raises OutputError unless it holds tensors only, and
        before loading when it is larger than `max_bytes`."""
        data = self.load(name, max_bytes)
        items = list(data) if isinstance(data, (list, tuple)) else [data]
        import torch

        if not items or not all(isinstance(t, torch.Tensor) for t in items):
            kinds = sorted({type(t).__name__ for t in items})
            raise OutputError(f"{name}: expected tensors, found {', '.join(kinds) or 'nothing'}")
        return items

    def load(self, name: str, max_bytes: int | None = None) -> Any:
        """A file saved with `torch.save`, loaded with `weights_only=True` onto the CPU (not
        loaded, OutputError, when larger than `max_bytes`)."""
        import torch  # only the dynamic path imports torch

        path = self.path(name)
        size = path.stat().st_size
        if max_bytes is not None and size > max_bytes:
            raise OversizedOutput(f"{name}: {size} bytes, larger than the {max_bytes} bytes its "
                                  "tensors can take: not loaded")
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise OutputError(f"{name}: cannot load: {exc.__class__.__name__}: {exc}") from exc

    def close(self) -> None:
        if self._root is not None:
            scratch.remove(self._root)
            self._root = None

    def __enter__(self) -> RunResult:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InputsChanged(RuntimeError):
    """A problem's shared inputs changed after they were written (a job without the sandbox
    wrote them): the jobs that would read them are not run."""


@dataclass(frozen=True)
class SharedInputs:
    """Files of a problem's inputs, in a folder of their own, written once and read-only."""

    folder: Path
    #: (name, inode, size, ctime, mode) of each file when shared: a write or chmod changes ctime
    signature: tuple

    @classmethod
    def seal(cls, folder: Path) -> SharedInputs:
        """The files in `folder`, made read-only and signed as they are now."""
        for file in folder.iterdir():
            os.chmod(file, 0o444)
        return cls(folder, _signature(folder))

    def check(self) -> None:
        if _signature(self.folder) != self.signature:
            raise InputsChanged(f"the shared inputs in {self.folder} changed after they were "
                                "written")

    def path(self, name: str) -> Path:
        return self.folder / name


def _signature(folder: Path) -> tuple:
    found = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        info = entry.stat(follow_symlinks=False)
        found.append((entry.name, info.st_ino, info.st_size, info.st_ctime_ns, info.st_mode))
    return tuple(found)


def share_inputs(result: RunResult, names: list[str],
                 disk: scratch.Reservation | None = None) -> SharedInputs:
    """Move the files `names` out of a finished job's output folder into a folder of their own,
    read-only: a problem's inputs, handed to each of its later jobs (`Job.inputs`) instead of a
    copy per job, charged to `disk` (the audit's reservation). Remove it with
    `scratch.remove(shared.folder)`."""
    folder = scratch.folder()
    try:
        for name in names:
            os.replace(result.path(name), folder / name)
        if result.root is not None:  # first: what moved out is not counted in both
            scratch.charge(result.root, disk)
        scratch.charge(folder, disk)
        return SharedInputs.seal(folder)
    except BaseException:
        scratch.remove(folder)
        raise


class OutputError(ValueError):
    """A file from the child is not what the parent expects (type, shape, dtype)."""


class OversizedOutput(OutputError):
    """A file from the child is larger than what it should hold: not loaded."""


def scrubbed_environment(extra: Mapping[str, str] | None = None,
                         base: Mapping[str, str] | None = None) -> dict[str, str]:
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items()
           if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
    env.update(extra or {})
    return env


#: where `job_seconds()` collects the seconds of the jobs run in its context
_job_seconds: ContextVar[dict[str, float] | None] = ContextVar("job_seconds", default=None)


@contextlib.contextmanager
def job_seconds() -> Iterator[dict[str, float]]:
    """The seconds of every job `run_job` runs in this context (in this thread), summed by kind
    (`reference`, `candidate`, `plain_run`, `timing`, `profile`, ...), waits for the GPU
    included and also counted alone (`gpu_wait`; a timing job's wait for its turn alone on the
    GPU, `timing_wait`), as are runs that ran out of GPU memory and ran again (`gpu_retry`):
    where an audit's time goes."""
    seconds: dict[str, float] = {}
    token = _job_seconds.set(seconds)
    try:
        yield seconds
    finally:
        _job_seconds.reset(token)


#: a job's phases read into `job_seconds` (the kernel and problem jobs have at most twelve)
MAX_PHASES = 16


def phase_seconds(phases: Any, prefix: str = "") -> dict[str, float]:
    """A job's own report of its phases (`{name: seconds}`) as `{prefix:name: seconds}` (`name`
    without a prefix), bounded: the job may have run code under audit, so at most MAX_PHASES
    names of 40 characters, and numbers only."""
    found: dict[str, float] = {}
    for name, seconds in list(phases.items() if isinstance(phases, dict) else ())[:MAX_PHASES]:
        if isinstance(seconds, (int, float)) and 0 <= seconds < 1e6:
            key = f"{prefix}:{str(name)[:40]}" if prefix else str(name)[:40]
            found[key] = found.get(key, 0.0) + float(seconds)
    return found


def add_job_seconds(kind: str, seconds: Any) -> None:
    """Add a part of a job (`candidate:import`, read from the job's own report: a number or
    nothing) to the current `job_seconds()`."""
    collected = _job_seconds.get()
    if collected is not None and isinstance(seconds, (int, float)) and 0 <= seconds < 1e6:
        collected[kind] = collected.get(kind, 0.0) + float(seconds)


def _kind(target: str) -> str:
    module, _, function = target.partition(":")
    if function != "run":
        return function.removeprefix("run_")
    return module.removesuffix(".py").removesuffix("_job")


def run_job(job: Job, gate: Gate | None = None) -> RunResult:
    """Run `job` in a child process and wait for it (at most `job.timeout` seconds); on a GPU
    (`job.gpu`), under that GPU's shared lock, and once more alone on it when it ran out of
    memory (`gpu_share.run_claimed`); on the CPU, a gated job (`Job.gated`) let go on when
    `gate` is entered. Raises `sandbox.SandboxError` for `--sandbox on` where the sandbox
    cannot be built, and OSError when the job's folder cannot be made (a full disk): nothing
    ran then; what `gate` raises, the job stopped."""
    started = time.monotonic()
    try:
        if job.gpu is not None:
            placed = replace(job, env={**job.env, "CUDA_VISIBLE_DEVICES": job.gpu.device})
            result = gpu_share.run_claimed(placed, job.gpu, _run_once)
            # a timing job's wait is for its turn alone on the GPU, counted apart
            add_job_seconds("timing_wait" if job.gpu.alone else "gpu_wait", result.gpu_wait_s)
            if result.gpu_runs > 1:
                add_job_seconds("gpu_retry", result.gpu_retry_s)
            return result
        return _run_once(job, gate if job.gated else None)
    finally:
        seconds = _job_seconds.get()
        if seconds is not None:
            kind = _kind(job.target)
            seconds[kind] = seconds.get(kind, 0.0) + time.monotonic() - started


def _run_once(job: Job, gate: Gate | None = None) -> RunResult:
    """One run of `job`; with a `gate` (a gated job), started at once and told to go on, with
    the arguments the gate grants, when the gate is entered."""
    sandbox.protect_parent()
    confined = sandbox.active()
    root = scratch.folder()
    cgroup = sandbox.job_cgroup(job.memory_limit)
    try:
        result = _run(job, root, confined, cgroup, gate)
        # every run's phases, a run that ran out of GPU memory before its retry included
        for name, seconds in phase_seconds(result.phases, _kind(job.target)).items():
            add_job_seconds(name, seconds)
        return result
    except BaseException:
        scratch.remove(root)
        raise
    finally:
        if cgroup is not None:
            cgroup.remove()


def _run(job: Job, root: Path, confined: bool, cgroup: sandbox.JobCgroup | None,
         gate: Gate | None) -> RunResult:
    work, out, tmp, lib = (root / name for name in FOLDERS)
    for folder in (work, out, tmp, lib):
        folder.mkdir()
    copy_harness(lib)
    writable = [str(work), str(out), str(tmp), *job.writable]
    visible = [str(lib), *job.visible]
    args = dict(job.args)
    if gate is not None:  # in a folder of kaudit's, which the job sees read-only
        gated = root / GATE_FOLDER
        gated.mkdir()
        visible.append(str(gated))
        args["go"] = str(gated / GO_FILE)
    if job.inputs is not None:
        job.inputs.check()
        visible.append(str(job.inputs.folder))
        args["in_dir"] = str(job.inputs.folder)
    allowance = scratch.left(job.disk)
    file_size_limit = job.file_size_limit if allowance is None else \
        max(1 << 20, min(job.file_size_limit, allowance))
    where, _, _ = job.target.rpartition(":")
    if where.endswith(".py"):
        visible.append(os.path.dirname(os.path.abspath(where)))
    spec_path, result_path = root / "spec.json", root / "result.json"
    spec = {"target": job.target, "args": args, "seed": job.seed,
            "out_dir": str(out), "result": str(result_path),
            "memory_limit": job.memory_limit, "cpu_limit": job.cpu_limit,
            "file_size_limit": file_size_limit, "process_limit": PROCESS_LIMIT,
            "cgroup": cgroup.procs if cgroup is not None else None,
            "sandbox": sandbox.plan_for(root, visible, writable, gpu_devices=not job.no_gpu)
            if confined else None}
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    env = _job_environment(lib, {
        "TMPDIR": str(tmp),
        # caches a job writes, in its own folder: the home folder is read-only in the sandbox
        "TRITON_CACHE_DIR": str(tmp / "triton"), "XDG_CACHE_HOME": str(tmp / "cache"),
        "CUDA_CACHE_PATH": str(tmp / "nv"), "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
        # CuPy compiles into ~/.cupy by default: a CUDA-L1 kernel failed there (KD501)
        "CUPY_CACHE_DIR": str(tmp / "cupy"),
        **job.env, **({"CUDA_VISIBLE_DEVICES": ""} if job.no_gpu else {})})
    stdout_path, stderr_path = root / "stdout.txt", root / "stderr.txt"
    result = RunResult(status=CRASHED, out_dir=out, _root=root)
    started = time.monotonic()
    try:
        end = sandbox.launch(Launch(
            spec=spec_path, cwd=work, lib=lib, env=env, stdout=stdout_path, stderr=stderr_path,
            timeout=job.timeout,
            **({"gate": functools.partial(_go, gate, root / GATE_FOLDER)}
               if gate is not None else {})))
    except OSError as exc:
        result.status, result.error_type, result.error = CRASHED, type(exc).__name__, str(exc)
        result.errno = getattr(exc, "errno", None)
        return result
    # a job not run, or killed, because kaudit is stopping says nothing about the kernel: the
    # audit ends as not completed (KD504), never as the kernel's crash
    sandbox.check_running()
    result.wall_s = time.monotonic() - started
    result.returncode = end.returncode
    result.stdout_tail = _tail(stdout_path)
    result.stderr_tail = _tail(stderr_path)
    _interpret(result, result_path, end.timed_out)
    _check_temp_limit(result, root, job.disk,
                      file_size_limit if file_size_limit < job.file_size_limit else None)
    return result


@contextlib.contextmanager
def _go(gate: Gate, folder: Path) -> Iterator[None]:
    """Enter `gate`, then hand what it granted to the waiting job (`GO_FILE` in `folder`,
    written whole before it appears), and hold the gate until the job ends; the file goes with
    it, so that the job started again in a fresh interpreter (its fork server died) waits for
    the gate again. Without the sandbox a job could have put a link or a FIFO in `folder`, so the
    file is made new under a name it cannot guess, never opened through what is there."""
    with gate() as granted:
        written = folder / f".{secrets.token_hex(8)}"
        descriptor = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_NONBLOCK, 0o644)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(json.dumps(granted))
        os.replace(written, folder / GO_FILE)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                (folder / GO_FILE).unlink()


def _check_temp_limit(result: RunResult, root: Path, disk: scratch.Reservation | None,
                      cap: int | None) -> None:
    """Charge the job's folder to the scan's temporary disk (to `disk`, its audit's reservation);
    a job that failed on a file as large as `cap` (what was left to it when it started), or took
    the total over the limit writing more than its audit reserved, failed on the limit (EDQUOT).
    A job within its audit's reservation is not failed for another audit's excess."""
    size = scratch.charge(root, disk)
    hit_cap = cap is not None and not result.ok and (
        result.errno == errno.EFBIG or _largest_file(root) >= cap)
    if not hit_cap and (scratch.over_limit() is None or scratch.within(disk)):
        return
    from kaudit.dynamic.limits import format_size

    limit = scratch.usage()["limit_bytes"] or 0
    result.status, result.errno, result.error_type = ERROR, errno.EDQUOT, "TempLimitExceeded"
    result.error = (f"the scan's temporary files reached its limit of {format_size(limit)} "
                    f"(this job's folder: {format_size(size)}; --temp-limit moves it)"
                    + (f"; the job's error: {result.error}" if result.error else ""))


def _largest_file(root: Path) -> int:
    sizes = [0]
    for directory, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                sizes.append(os.lstat(os.path.join(directory, name)).st_size)
    return max(sizes)


def _job_environment(lib: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """A job's whole environment: the scrubbed one, its harness copy `lib` first on its path,
    the operator threads `sharing_cores` gives, and `extra` (its folders, `Job.env`)."""
    threads = {"OMP_NUM_THREADS": _job_threads} if _job_threads else {}
    return scrubbed_environment({
        "PYTHONPATH": _python_path(lib), "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0", **threads, **extra})


#: OMP_NUM_THREADS of the jobs started while `sharing_cores` holds
_job_threads: str | None = None


@contextlib.contextmanager
def sharing_cores(jobs: int) -> Iterator[None]:
    """The operator threads of jobs (`OMP_NUM_THREADS`) while `jobs` audits run at once on a
    GPU: torch's threads here (one per core) shared out among them, at least one each; none
    set for one audit, or when the user set the variable (then it passes, as ever). A job's own
    CPU work there is loading, saving and comparing tensors; uncapped, each job's operators ran
    on a team of one thread per core. On the H200's 16-core host, 14 audits at once of 14 real
    problems (no compiling) took 80.2 s uncapped and 63.2 s with one thread a job, their
    candidate jobs 44 % less time."""
    global _job_threads
    before = _job_threads
    if jobs > 1 and not os.environ.get("OMP_NUM_THREADS"):
        import torch

        _job_threads = str(max(1, torch.get_num_threads() // jobs))
    try:
        yield
    finally:
        _job_threads = before


def start_fork_server() -> None:
    """Start the fork server for jobs of the usual environment now, in the background, so that
    its import of torch runs beside kaudit's own start instead of before the first job (on the
    H200 `kaudit problems` spent 10 s before its first job). Nothing runs in it until a job
    comes; a server that cannot start is found out, and said, by that job."""
    if not forkserver.wanted():
        return
    env = _job_environment(Path(os.devnull), {})  # a job's own paths do not choose its server
    threading.Thread(target=forkserver.warm, args=(env,), name="forkserver-start",
                     daemon=True).start()


def _python_path(lib: Path) -> str:
    """The harness copy, then the parent's PYTHONPATH (where torch may live) less what names or
    holds kaudit: a job has no use for it."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and not traced(p) and not os.path.isdir(os.path.join(p, "kaudit"))]
    return os.pathsep.join([str(lib), *kept])


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - TAIL_CHARS * 2))
            data = handle.read()
    except OSError:
        return ""
    return data.decode("utf-8", "replace")[-TAIL_CHARS:]


def _interpret(result: RunResult, result_path: Path, timed_out: bool) -> None:
    data: dict[str, Any] | None = None
    try:
        data = json.loads(result_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict):
        result.phases = phase_seconds(data.get("phase_seconds"))
    if timed_out:
        result.status = TIMEOUT
        result.error = f"no result within {result.wall_s:.0f} s"
        return
    if not (isinstance(data, dict) and data.get("ok") is True) and _disk_full(result_path.parent):
        # what failed the job (torch's own writer does not always say) and may have kept it from
        # writing even its result
        result.errno = errno.ENOSPC
    if isinstance(data, dict) and data.get("ok") is True:
        result.status, result.value = OK, data.get("value")
        return
    if isinstance(data, dict) and data.get("ok") is False:
        result.status = OOM if data.get("oom") else ERROR
        if isinstance(data.get("errno"), int):
            result.errno = data["errno"]
        result.phase = data.get("phase")
        result.error_type = str(data.get("type", ""))
        result.error = str(data.get("message", ""))
        result.traceback = str(data.get("traceback", ""))
        return
    result.status = CRASHED
    code = result.returncode
    if code is not None and code < 0:
        name = _signal_name(-code)
        result.error_type = name
        result.error = {
            "SIGKILL": "killed by SIGKILL (the kernel's out-of-memory killer?)",
            "SIGXCPU": "CPU time limit exceeded",
            "SIGSEGV": "segmentation fault",
        }.get(name, f"killed by {name}")
    else:
        result.error = f"exited with code {code} without a result"
    clue = _stderr_clue(result.stderr_tail)
    if clue:
        result.error += f"; stderr: {clue}"


def _disk_full(folder: Path) -> bool:
    """Less than 1 MiB left for kaudit's user where the job wrote."""
    try:
        found = os.statvfs(folder)
    except OSError:
        return False
    return found.f_bavail * found.f_frsize < (1 << 20)


def _stderr_clue(tail: str) -> str:
    """The informative end of a dead child's stderr: faulthandler's fatal error and innermost
    frame when present, else the last line."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
    if fatal:
        start = fatal[-1]
        frames = [line for line in lines[start:] if line.startswith("File ")][:3]
        return "; ".join([lines[start], *frames])[:600]
    return lines[-1][:300] if lines else ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
