"""A fork server for `kaudit.dynamic.runner`: one process that has imported torch once and forks a
child per job, so a job starts in milliseconds instead of paying a fresh `import torch`.

Parent side (`launch`, used by `runner.run_job` from any number of threads): the first job starts
the server (`python -m kaudit.dynamic.forkserver`) in its own session, with the job's scrubbed
environment, and waits for it to say it is ready. Requests go to the server's stdin and replies come
from its stdout, one JSON object a line; a reader thread hands each reply to the job waiting for it.
The parent enforces the timeout itself: it SIGKILLs the child and then its process group
(`os.killpg` needs no parent-child relation, only the same user).

Server side (`serve`): imports torch and `kaudit.dynamic.child`, then runs a single-threaded loop
(a selector over the request pipe and a SIGCHLD wake-up pipe; no threads, because it forks). It
never initialises CUDA, runs no torch op (so no OpenMP pool exists when it forks; OpenBLAS, loaded
by numpy, stops its threads itself before a fork) and does not import triton, whose
`TRITON_INTERPRET` is read at import. For each request it forks a child that calls `os.setsid()`,
enters the job's working folder, puts /dev/null and the capture files on fds 0, 1 and 2, closes the
server's descriptors, replaces the environment by the job's (also the C-level one that subprocesses
inherit) and `sys.path`'s working-folder and kaudit-link entries by the job's, then runs
`kaudit.dynamic.child.main`, which leaves with `os._exit`. The server replies
`{"id", "pid"}` right after the fork and `{"id", "returncode"}` (negative: killed by that signal,
as `subprocess` reports it) once it has reaped the child. When its stdin reaches EOF (kaudit closed
it, or kaudit died) it kills the process groups of the children still running and exits.

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
import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import NamedTuple, NoReturn

#: variables a forked child may set differently from its server: nothing reads them while torch
#: is imported (CUDA is not initialised and triton not imported in the server)
JOB_ENV = ("TMPDIR", "PYTHONPATH", "CUDA_VISIBLE_DEVICES")
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


class Exit(NamedTuple):
    """How a child ended: `returncode` as `subprocess` reports it (None when unknown)."""

    returncode: int | None
    timed_out: bool


# -- parent side ---------------------------------------------------------------------------------

_lock = threading.Lock()
_current: _Server | None = None
_deaths = 0
_disabled = ""  # why every job takes the plain path, once a server failed to start
_hooks_installed = False


def launch(job: Launch) -> Exit:
    """Run `job` in a child forked by the server and wait for it (at most `job.timeout` s)."""
    server = _server_for(job.env)
    pending = server.submit({"spec": str(job.spec), "cwd": str(job.cwd), "lib": str(job.lib),
                             "env": dict(job.env), "stdout": str(job.stdout),
                             "stderr": str(job.stderr)})
    try:
        return pending.wait(server, job.timeout)
    finally:
        server.finish(pending)


def server_pid() -> int | None:
    """The pid of the running server, if there is one (the parent of forked jobs)."""
    with _lock:
        return _current.process.pid if _current is not None and not _current.dead else None


def shutdown() -> None:
    """Stop the server (at interpreter exit; the next job would start a new one)."""
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


def _install_hooks() -> None:
    global _hooks_installed
    if not _hooks_installed:
        atexit.register(shutdown)
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
        self._jobs: dict[int, _Pending] = {}
        self._numbers = itertools.count()
        self._state = threading.Lock()
        self._write = threading.Lock()

    @classmethod
    def start(cls, key: tuple) -> _Server:
        root = Path(tempfile.mkdtemp(prefix="kaudit-forkserver-"))
        work, tmp, lib = root / "work", root / "tmp", root / "lib"
        for folder in (work, tmp, lib):
            folder.mkdir()
        # jobs use their own link to kaudit; the server needs one that lives as long as it does
        package = Path(__file__).resolve().parent.parent
        (lib / "kaudit").symlink_to(package, target_is_directory=True)
        env = dict(key)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(lib), env["PYTHONPATH"]) if p)
        env["TMPDIR"] = str(tmp)
        log = root / "server.log"
        try:
            with open(log, "wb") as stderr:
                process = subprocess.Popen(
                    [sys.executable, "-m", "kaudit.dynamic.forkserver", str(root)], cwd=work,
                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                    start_new_session=True, close_fds=True)
        except OSError as exc:
            shutil.rmtree(root, ignore_errors=True)
            raise Unavailable(f"cannot start the fork server: {exc}") from exc
        server = cls(key, process, root)
        threading.Thread(target=server._read_replies, name="kaudit-forkserver-replies",
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
        shutil.rmtree(self.root, ignore_errors=True)

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


# -- server side ---------------------------------------------------------------------------------

def serve(root: str) -> NoReturn:
    """The server's main loop (`python -m kaudit.dynamic.forkserver ROOT`, its private folder)."""
    # the protocol moves to private descriptors; fd 0 becomes /dev/null and fd 1 the log, so
    # nothing the server's imports print can corrupt a reply, nor a child inherit buffered requests
    requests, replies = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    import torch

    from kaudit.dynamic import child

    if torch.cuda.is_initialized() or "triton" in sys.modules:  # e.g. by a sitecustomize
        sys.exit("CUDA initialised or triton imported at start-up: a forked job could not set "
                 "CUDA_VISIBLE_DEVICES or TRITON_INTERPRET")

    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a Python handler, so the wake-up fd is written
    signal.set_wakeup_fd(wake_write)
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)

    def close_server() -> None:
        selector.close()
        for fd in (requests, replies, wake_read, wake_write):
            os.close(fd)

    # what the child replaces by its job's: the server's own working folder and kaudit link
    sys_path_swap = {sys.path[0]: "cwd",
                     os.path.abspath(os.environ["PYTHONPATH"].split(os.pathsep)[0]): "lib"}
    children: dict[int, int] = {}  # pid -> request id
    _send(replies, {"ready": os.getpid()})
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.fd == wake_read:  # a SIGCHLD: reaped below
                os.read(wake_read, 4096)
                continue
            data = os.read(requests, 1 << 16)
            if not data:  # kaudit closed the pipe, or died: nobody will read the results
                for pid in children:
                    _kill_job(pid)
                shutil.rmtree(root, ignore_errors=True)  # kaudit may not be there to do it
                os._exit(0)
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                try:
                    pid = os.fork()
                except OSError as exc:
                    _send(replies, {"id": request["id"], "error": str(exc)})
                    continue
                if pid == 0:
                    _become_job(request, close_server, sys_path_swap, child)
                children[pid] = request["id"]
                _send(replies, {"id": request["id"], "pid": pid})
        _reap(children, replies)


def _reap(children: dict[int, int], replies: int) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        number = children.pop(pid, None)
        if number is not None:
            _send(replies, {"id": number, "returncode": os.waitstatus_to_exitcode(status)})


def _send(fd: int, message: dict) -> None:
    data = json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(fd, data):]


def _become_job(request: dict, close_server: Callable[[], None], sys_path_swap: dict[str, str],
                child: ModuleType) -> NoReturn:
    """In the forked child: turn into the process `python -m kaudit.dynamic.child` would be."""
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        close_server()  # a job holding the reply pipe would hide the server's death from kaudit
        os.chdir(request["cwd"])
        _redirect(0, os.devnull, os.O_RDONLY)
        _redirect(1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        _redirect(2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        _replace_environment(request["env"])
        sys.path[:] = [request[sys_path_swap[p]] if p in sys_path_swap else p for p in sys.path]
        sys.argv = [child.__file__, request["spec"]]
        child.main(sys.argv)
    except BaseException:  # noqa: BLE001 - report on the job's stderr, never return to the loop
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
    os._exit(127)


def _redirect(target: int, path: str, flags: int) -> None:
    fd = os.open(path, flags, 0o666)
    os.dup2(fd, target)
    os.close(fd)


def _replace_environment(env: Mapping[str, str]) -> None:
    """Make the job's environment the whole environment, for Python and for the C library (which
    programs the job starts inherit), and forget the temporary folder chosen from the old one."""
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None


if __name__ == "__main__":
    serve(sys.argv[1])
