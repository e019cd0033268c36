"""Run one job in an isolated child process: "call this function with these JSON arguments, give me
back its JSON result and the files it wrote".

    job = Job("kaudit.dynamic.problem_job:run_problem", {"path": ...}, timeout=60)
    with run_job(job) as result:
        if result.ok:
            outputs = result.load_tensors("seed0.pt")
        else:
            print(result.status, result.describe())

What the child gets:
- a process of its own, forked from kaudit's fork server (`kaudit.dynamic.forkserver`), a process
  that has imported torch once and serves only this kaudit process: a job starts in milliseconds
  instead of paying a fresh `import torch`. Nothing the job does (monkey-patching torch,
  `sys.modules`, global state) reaches the parent or the next job. With `KAUDIT_FORKSERVER=0` in
  kaudit's environment, when the server cannot start, or when it dies with the job, the job runs
  in a fresh interpreter instead (`sys.executable -m kaudit.dynamic.child SPEC.json`);
- its own session and process group, killed as a whole (SIGKILL) when the wall-clock timeout
  expires and again once it has exited, so forked helpers do not outlive it;
- a fresh, empty working folder and TMPDIR inside a private temporary folder, removed afterwards;
- a scrubbed environment, exactly that and the job's own variables: PATH, HOME, locale,
  CUDA_VISIBLE_DEVICES, CUDA_HOME, LD_LIBRARY_PATH, OMP_NUM_THREADS and TORCH_* / PYTORCH_*
  variables pass; everything else (tokens, cloud keys, proxies) is dropped; PYTHONPATH is a link to
  kaudit's package followed by the parent's PYTHONPATH (where torch may live); no bytecode is
  written;
- optional RLIMIT_AS (address space; meant for CPU runs only, CUDA reserves huge virtual ranges)
  and RLIMIT_CPU, applied by the child to itself before it runs job code;
- stdin from /dev/null; stdout and stderr captured to files (tails kept in the result).

`run_job` may be called from several threads at once; each call waits for its own child.

What it does not give: no filesystem, network or syscall sandbox (the job runs as the same user
and can read or write anything that user can, e.g. files next to a problem); the GPU is shared;
a process that starts a new session of its own escapes the group kill; rlimits raised back by a
privileged job are not enforced. It isolates honest-but-sloppy benchmark code from kaudit, not a
hostile program from the machine: run untrusted kernels in a container.

Every failure (crash, signal, timeout, import error, OOM, a result that is not JSON) is a
`RunResult` with a status, never an exception.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kaudit
from kaudit.dynamic import forkserver
from kaudit.dynamic.forkserver import Exit, Launch

ENV_KEEP = ("PATH", "HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ",
            "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH",
            "OMP_NUM_THREADS", "MKL_NUM_THREADS")
ENV_KEEP_PREFIXES = ("TORCH_", "PYTORCH_")
#: how much of stdout / stderr a result keeps
TAIL_CHARS = 4000

OK, ERROR, OOM, TIMEOUT, CRASHED = "ok", "error", "oom", "timeout", "crashed"


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
    out_dir: Path | None = None
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
            return f"out of memory{where}: {head}"
        if self.status == CRASHED:
            return f"crashed{where}: {head}"
        return f"failed{where}: {head}"

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

    def load_tensors(self, name: str) -> list:
        """A file saved by the child with `torch.save(tensor or list of tensors)`, loaded with
        `weights_only=True` onto the CPU; raises OutputError unless it holds tensors only."""
        import torch  # only the dynamic path imports torch

        try:
            data = torch.load(self.path(name), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise OutputError(f"{name}: cannot load: {exc.__class__.__name__}: {exc}") from exc
        items = list(data) if isinstance(data, (list, tuple)) else [data]
        if not items or not all(isinstance(t, torch.Tensor) for t in items):
            kinds = sorted({type(t).__name__ for t in items})
            raise OutputError(f"{name}: expected tensors, found {', '.join(kinds) or 'nothing'}")
        return items

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> RunResult:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OutputError(ValueError):
    """A file from the child is not what the parent expects (type, shape, dtype)."""


def scrubbed_environment(extra: Mapping[str, str] | None = None,
                         base: Mapping[str, str] | None = None) -> dict[str, str]:
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items()
           if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
    env.update(extra or {})
    return env


def run_job(job: Job) -> RunResult:
    """Run `job` in a child process and wait for it (at most `job.timeout` seconds)."""
    if os.environ.get("KAUDIT_FORKSERVER", "1") != "0":
        try:
            return _run(job, forkserver.launch)
        except forkserver.Unavailable:
            pass  # no server, or it died with the job: run the job (again) in a fresh interpreter
    return _run(job, _launch_plain)


def _run(job: Job, launch: Callable[[Launch], Exit]) -> RunResult:
    root = Path(tempfile.mkdtemp(prefix="kaudit-job-"))
    work, out, tmp, lib = root / "work", root / "out", root / "tmp", root / "lib"
    for folder in (work, out, tmp, lib):
        folder.mkdir()
    # kaudit is reached through a link to its package, not the folder around it
    (lib / "kaudit").symlink_to(Path(kaudit.__file__).resolve().parent, target_is_directory=True)
    spec_path, result_path = root / "spec.json", root / "result.json"
    spec = {"target": job.target, "args": dict(job.args), "seed": job.seed,
            "out_dir": str(out), "result": str(result_path),
            "memory_limit": job.memory_limit, "cpu_limit": job.cpu_limit}
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    # kaudit first; then the parent's PYTHONPATH, where torch itself may live
    python_path = os.pathsep.join(p for p in (str(lib), os.environ.get("PYTHONPATH", "")) if p)
    env = scrubbed_environment({
        "PYTHONPATH": python_path, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
        "PYTHONHASHSEED": "0", "TMPDIR": str(tmp), **job.env})
    stdout_path, stderr_path = root / "stdout.txt", root / "stderr.txt"
    result = RunResult(status=CRASHED, out_dir=out, _root=root)
    started = time.monotonic()
    try:
        end = launch(Launch(spec=spec_path, cwd=work, lib=lib, env=env, stdout=stdout_path,
                            stderr=stderr_path, timeout=job.timeout))
    except forkserver.Unavailable:
        result.close()
        raise
    except OSError as exc:
        result.status, result.error_type, result.error = CRASHED, type(exc).__name__, str(exc)
        return result
    result.wall_s = time.monotonic() - started
    result.returncode = end.returncode
    result.stdout_tail = _tail(stdout_path)
    result.stderr_tail = _tail(stderr_path)
    _interpret(result, result_path, end.timed_out)
    return result


def _launch_plain(launch: Launch) -> Exit:
    """Start a fresh interpreter for the job and wait for it."""
    with open(launch.stdout, "wb") as stdout, open(launch.stderr, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "kaudit.dynamic.child", str(launch.spec)],
            cwd=launch.cwd, env=dict(launch.env), stdin=subprocess.DEVNULL, stdout=stdout,
            stderr=stderr, start_new_session=True, close_fds=True)
        try:
            process.wait(timeout=launch.timeout)
            return Exit(process.returncode, timed_out=False)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.wait()
            return Exit(process.returncode, timed_out=True)
        finally:
            _kill_group(process.pid)  # helpers the job forked into its group


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
    if timed_out:
        result.status = TIMEOUT
        result.error = f"no result within {result.wall_s:.0f} s"
        return
    if isinstance(data, dict) and data.get("ok") is True:
        result.status, result.value = OK, data.get("value")
        return
    if isinstance(data, dict) and data.get("ok") is False:
        result.status = OOM if data.get("oom") else ERROR
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
