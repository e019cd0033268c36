"""A fork server for the dynamic pass, kaudit's side: one process that has imported torch once and
forks a job's supervisor per job, so a job starts in milliseconds instead of paying a fresh
`import torch`. The server's own side is `kaudit.dynamic.harness.server`.

`launch` (used by `sandbox.launch` from any number of threads): the first job starts the server
(`python -m harness.server ROOT`, from a copy of the harness package in its own neutral folder) in
its own session, with the job's scrubbed environment, and waits for it to say it is ready. Requests
go to the server's stdin and replies come from its stdout, one JSON object a line; a reader thread
hands each reply to the job waiting for it. The parent enforces the timeout itself: it SIGKILLs the
job's supervisor and then its process group (`os.killpg` needs no parent-child relation, only the
same user); processes that left the group come back to the server, a subreaper, which kills them.

Variables read while torch is imported (OMP_NUM_THREADS, TORCH_*, LD_LIBRARY_PATH, locale ...)
cannot change after the fork: a server serves only jobs whose environment matches its own apart from
JOB_ENV (read after the fork). A job with another environment starts a new server; the old one
leaves once its running jobs have ended.

`launch` raises `Unavailable` when it could not run a job (the server cannot start, died with the
job, or could not fork); the runner then runs that job in a fresh interpreter. A server that died
is replaced by the next job, at most MAX_DEATHS times per kaudit process, after which (as after a
failed start) every job takes the plain path.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from kaudit.dynamic import scratch

#: variables a forked child may set differently from its server: nothing reads them while torch
#: is imported (CUDA is not initialised and triton not imported in the server); MAX_JOBS is read
#: when an extension is built. A variable missing here makes jobs that differ in it alternate
#: between two servers, each started anew (seconds: it imports torch)
JOB_ENV = ("TMPDIR", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "TORCH_EXTENSIONS_DIR",
           "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", "CUDA_CACHE_PATH", "CUPY_CACHE_DIR",
           "MAX_JOBS")
JOB_ENV_PREFIXES = ("TRITON_",)
#: seconds the server may take to import torch and say it is ready
START_TIMEOUT = 120.0
#: seconds to wait for the server to report a killed child
KILL_GRACE = 10.0
#: unexpected server deaths tolerated in one kaudit process before jobs take the plain path
MAX_DEATHS = 5


class Unavailable(RuntimeError):
    """The fork server could not run the job; it has not run, or was killed, and may run again."""


@dataclass(frozen=True)
class Launch:
    """One job for the server: its spec file, working folder, link folder holding kaudit (the
    head of PYTHONPATH), whole environment, capture files and wall-clock timeout."""

    spec: Path
    cwd: Path
    lib: Path
    env: Mapping[str, str]
    stdout: Path
    stderr: Path
    timeout: float
    #: entered once the child has started and held until it ends (`runner`: a job that waits,
    #: started, for its GPU memory); the timeout runs from when it was entered
    gate: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext


class Exit(NamedTuple):
    """How a child ended: `returncode` as `subprocess` reports it (None when unknown)."""

    returncode: int | None
    timed_out: bool


# -- parent side ---------------------------------------------------------------------------------

_lock = threading.Lock()
_current: _Server | None = None
_deaths = 0
_disabled = ""  # why every job takes the plain path, once a server failed to start
_stopping = False  # kaudit is exiting (`_at_exit`)
_hooks_installed = False


def launch(job: Launch) -> Exit:
    """Run `job` in a child forked by the server and wait for it (at most `job.timeout` s)."""
    server = _server_for(job.env)
    pending = server.submit({"spec": str(job.spec), "cwd": str(job.cwd), "lib": str(job.lib),
                             "env": dict(job.env), "stdout": str(job.stdout),
                             "stderr": str(job.stderr)})
    try:
        with job.gate():
            return pending.wait(server, job.timeout)
    finally:
        pending.stop()  # a gate that failed left it waiting
        server.finish(pending)


def wanted() -> bool:
    """Whether jobs go through the fork server (KAUDIT_FORKSERVER=0 turns it off)."""
    return os.environ.get("KAUDIT_FORKSERVER", "1") != "0"


def warm(env: Mapping[str, str]) -> None:
    """Start the server that jobs of environment `env` will use, if none runs (`launch` would
    start it at the first job); a server that cannot start is left to that job to find."""
    with contextlib.suppress(Unavailable):
        _server_for(env)


def server_times() -> tuple[float, float] | None:
    """When the running server started and when it was ready (`time.monotonic()`), or None:
    how long its import of torch took, and whether it was ready before the first job."""
    with _lock:
        server = _current
    if server is None or server.ready_at is None:
        return None
    return server.started_at, server.ready_at


def server_pid() -> int | None:
    """The pid of the running server, if there is one (the parent of forked jobs)."""
    with _lock:
        return _current.process.pid if _current is not None and not _current.dead else None


def shutdown() -> None:
    """Stop the server (the next job would start a new one); a start under way is waited for."""
    global _current
    with _lock:
        server, _current = _current, None
    if server is not None:
        server.close()


def _server_for(env: Mapping[str, str]) -> _Server:
    global _current, _deaths, _disabled
    key = _startup_environment(env)
    stale = None
    with _lock:
        if _current is not None and (_current.dead or _current.key != key):
            if _current.dead:
                _deaths += 1
            stale, _current = _current, None
        if _deaths >= MAX_DEATHS and not _disabled:
            _disabled = f"the fork server died {_deaths} times"
        if _current is None and not _disabled:
            _install_hooks()
            try:
                _current = _Server.start(key)
            except Unavailable as exc:
                _disabled = str(exc)
                if not _stopping:
                    warnings.warn(f"kaudit: {exc}; every job starts a fresh interpreter",
                                  RuntimeWarning, stacklevel=5)
        server, why = _current, _disabled
    if stale is not None:
        stale.retire()  # it leaves once its running jobs have ended
    if server is None:
        raise Unavailable(why)
    return server


def _startup_environment(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of a job's environment its server must have had when it imported torch: all but
    JOB_ENV, plus PYTHONPATH without its head (the job's own link to kaudit)."""
    items = {k: v for k, v in env.items()
             if k not in JOB_ENV and not k.startswith(JOB_ENV_PREFIXES)}
    items["PYTHONPATH"] = env.get("PYTHONPATH", "").partition(os.pathsep)[2]
    return tuple(sorted(items.items()))


def _at_exit() -> None:
    """`shutdown` as kaudit exits: a start under way (kaudit exiting at once, on a usage error
    say) is waited for, and its failure not said."""
    global _stopping
    _stopping = True
    shutdown()


def _install_hooks() -> None:
    global _hooks_installed
    if not _hooks_installed:
        # after kaudit's temporary folder registered its removal: atexit runs the last
        # registered first, so the server is stopped before its folder is removed
        scratch.own_folder()
        atexit.register(_at_exit)
        os.register_at_fork(after_in_child=_forget)
        _hooks_installed = True


def _forget() -> None:
    """In a forked copy of kaudit: the server, its pipes and reader thread belong to the parent."""
    global _lock, _current
    _lock, _current = threading.Lock(), None


class _Pending:
    """A submitted job, filled in by the reader thread."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.pid: int | None = None
        self.returncode: int | None = None
        self.lost = ""  # why the server cannot report this job's end
        self.abandoned = False  # the caller stopped waiting before the pid came
        self.changed = threading.Condition()

    def _ended(self) -> bool:
        return self.returncode is not None or bool(self.lost)

    def wait(self, server: _Server, timeout: float) -> Exit:
        try:
            with self.changed:
                ended = self.changed.wait_for(self._ended, timeout)
                pid, lost = self.pid, self.lost
            if not ended and pid is None:
                server.kill()  # alive but not forking: replace it
                raise Unavailable("the fork server did not start the job")
            if not ended:
                self.stop()
                with self.changed:
                    self.changed.wait_for(self._ended, KILL_GRACE)
                return Exit(self.returncode, timed_out=True)
            if self.returncode is None:
                raise Unavailable(lost)
            return Exit(self.returncode, timed_out=False)
        finally:
            self.stop()  # and the helpers a finished job forked into its group

    def stop(self) -> None:
        """SIGKILL the child (unless reaped) and its process group; a child whose pid has not
        come yet is killed when it comes."""
        with self.changed:
            if self.pid is None:
                self.abandoned = True
                return
            pid, reaped = self.pid, self.returncode is not None
        _kill_job(pid, reaped=reaped)


def _kill(pid: int, group: bool = False) -> None:
    """SIGKILL a process, or the process group it leads; one already gone is fine."""
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_job(pid: int, reaped: bool = False) -> None:
    """SIGKILL a job's child, then its group: the child first, as it may not have called setsid
    yet; not once reaped, when its pid may belong to another process."""
    if not reaped:
        _kill(pid)
    _kill(pid, group=True)


class _Server:
    """The parent's handle on one server process."""

    def __init__(self, key: tuple, process: subprocess.Popen, root: Path) -> None:
        self.key, self.process, self.root = key, process, root
        self.dead = False  # its reply pipe reached EOF
        self.closing = False  # kaudit is stopping it
        self.retired = False  # replaced: close once its last job ends
        self.ready = threading.Event()
        #: `time.monotonic()` when it started and when it said it was ready (None until then)
        self.started_at, self.ready_at = time.monotonic(), None
        self._jobs: dict[int, _Pending] = {}
        self._numbers = itertools.count()
        self._state = threading.Lock()
        self._write = threading.Lock()

    @classmethod
    def start(cls, key: tuple) -> _Server:
        root = scratch.folder()
        work, tmp, lib = root / "work", root / "tmp", root / "lib"
        for folder in (work, tmp, lib):
            folder.mkdir()
        copy_harness(lib)  # jobs get their own copy; the server needs one that lives with it
        env = dict(key)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(lib), env["PYTHONPATH"]) if p)
        env["TMPDIR"] = str(tmp)
        log = root / "server.log"
        try:
            with open(log, "wb") as stderr:
                process = subprocess.Popen(
                    [sys.executable, "-m", "harness.server", str(root)], cwd=work,
                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                    start_new_session=True, close_fds=True)
        except OSError as exc:
            scratch.remove(root)
            raise Unavailable(f"cannot start the fork server: {exc}") from exc
        server = cls(key, process, root)
        threading.Thread(target=server._read_replies, name="forkserver-replies",
                         daemon=True).start()
        if not server.ready.wait(START_TIMEOUT) or server.dead:
            why = _last_line(log) or f"not ready within {START_TIMEOUT:.0f} s"
            server.kill()
            server.close()
            raise Unavailable(f"the fork server did not start: {why}")
        return server

    def submit(self, request: dict) -> _Pending:
        with self._state:
            if self.dead:
                raise Unavailable("the fork server died")
            pending = _Pending(next(self._numbers))
            self._jobs[pending.number] = pending
        line = json.dumps({"id": pending.number, **request}).encode() + b"\n"
        try:
            with self._write:
                assert self.process.stdin is not None
                self.process.stdin.write(line)
                self.process.stdin.flush()
        except (OSError, ValueError) as exc:  # ValueError: the pipe was closed meanwhile
            self.finish(pending)
            raise Unavailable(f"the fork server is gone: {exc}") from exc
        return pending

    def finish(self, pending: _Pending) -> None:
        with self._state:
            self._jobs.pop(pending.number, None)
            idle_and_retired = self.retired and not self._jobs
        if idle_and_retired:
            self.close()

    def retire(self) -> None:
        with self._state:
            self.retired = True
            idle = not self._jobs
        if idle:
            self.close()

    def kill(self) -> None:
        _kill(self.process.pid)

    def close(self) -> None:
        """Close its stdin (it kills its children and exits), reap it, remove its folder."""
        with self._state:
            if self.closing:
                return
            self.closing = True
        with self._write:
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.wait()
        scratch.remove(self.root)

    def _read_replies(self) -> None:
        assert self.process.stdout is not None
        lost = "the fork server died"
        try:
            for line in self.process.stdout:
                self._dispatch(json.loads(line))
        except (OSError, ValueError) as exc:
            lost = f"the fork server's reply was unreadable: {exc}"
            self.kill()
        with self._state:
            self.dead = True
            orphans = list(self._jobs.values())
        self.ready.set()
        for pending in orphans:
            with pending.changed:
                pending.lost = pending.lost or lost
                pending.changed.notify_all()
        if not self.closing:
            self.kill()
            self.process.wait()

    def _dispatch(self, message: dict) -> None:
        if "ready" in message:
            self.ready_at = time.monotonic()
            self.ready.set()
            return
        with self._state:
            pending = self._jobs.get(message["id"])
        if pending is None:
            return
        with pending.changed:
            if "pid" in message:
                pending.pid = message["pid"]
            if "returncode" in message:
                pending.returncode = message["returncode"]
            if "error" in message:
                pending.lost = f"the fork server could not fork: {message['error']}"
            abandoned = pending.abandoned and pending.pid is not None
            pending.changed.notify_all()
        if abandoned:
            pending.stop()


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def copy_harness(lib: Path) -> None:
    """The job-side package, as `lib/harness`: what jobs import, under a name of its own."""
    source = Path(__file__).resolve().parent / "harness"
    shutil.copytree(source, lib / "harness", ignore=shutil.ignore_patterns("__pycache__"))
