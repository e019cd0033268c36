"""The fork server's own side (`python -m harness.server ROOT`; the parent has the other side):
a process that imports torch once and forks one supervisor (`child.run`) per job.

It runs a single-threaded loop (a selector over the request pipe and a SIGCHLD wake-up pipe; no
Python threads, because it forks), never initialises CUDA, runs no torch op (so no OpenMP pool
exists when it forks; OpenBLAS, loaded by numpy, stops its threads itself before a fork) and does
not import triton, whose `TRITON_INTERPRET` is read at import. It is
not dumpable (a job of the same user cannot read or write its memory) and is a child subreaper:
a process a job left behind that comes back to it is killed. For each request it forks a child
that calls `os.setsid()`, enters the job's working folder, puts /dev/null and the capture files on
fds 0, 1 and 2, closes the server's descriptors, replaces the environment by the job's (also the
C-level one that subprocesses inherit) and `sys.path`'s working-folder and link entries by the
job's, then becomes the job's supervisor. The server replies `{"id", "pid"}` right after the fork
and `{"id", "returncode"}` (negative: killed by that signal) once it has reaped the child. When its
stdin reaches EOF (the parent closed it, or died) it kills its children and exits.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import selectors
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping
from typing import NoReturn

from . import child, jail

#: the job modules imported once, here, before any fork
PRELOADED = ("kernel_job", "problem_job", "poison", "sentinels", "guard")


def serve(root: str) -> NoReturn:
    # the protocol moves to private descriptors; fd 0 becomes /dev/null and fd 1 the log, so
    # nothing the server's imports print can corrupt a reply, nor a child inherit buffered requests
    requests, replies = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    child.remove_traces()
    jail.set_dumpable(False)
    jail.become_subreaper()
    import torch

    for name in PRELOADED:
        importlib.import_module(f"{__package__}.{name}")
    with contextlib.suppress(ImportError):  # every job seeds numpy's generator: imported once
        import numpy  # noqa: F401
    torch.manual_seed(0)  # its first call imports torch._dynamo: once, here (CUDA stays untouched)
    if torch.cuda.is_initialized() or "triton" in sys.modules:  # e.g. by a sitecustomize
        sys.exit("CUDA initialised or triton imported at start-up: a forked job could not set "
                 "CUDA_VISIBLE_DEVICES or TRITON_INTERPRET")
    if _forks_poisoned(torch):
        sys.exit("a forked job could not use CUDA (torch.cuda reports a bad fork): something "
                 "imported at start-up asked CUDA for its devices")

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

    # what the child replaces by its job's: the server's own working folder and link folder
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
            if not data:  # the parent closed the pipe, or died: nobody reads results
                for pid in children:
                    _kill_job(pid)
                shutil.rmtree(root, ignore_errors=True)  # the parent may not be there to do it
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
                    _become_job(request, close_server, sys_path_swap)
                children[pid] = request["id"]
                _send(replies, {"id": request["id"], "pid": pid})
        _reap(children, replies)


def _forks_poisoned(torch) -> bool:
    """Whether a child forked now finds CUDA unusable. Asking CUDA anything (a device count,
    `is_available()`) registers torch's fork handler without initialising CUDA, and then every
    job fails with "Cannot re-initialize CUDA in forked subprocess"; the server would look
    healthy while no job could run."""
    pid = os.fork()
    if pid == 0:
        bad = True
        try:
            bad = bool(torch.cuda._is_in_bad_fork())
        finally:  # never back into the server's loop
            os._exit(1 if bad else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def _reap(children: dict[int, int], replies: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            break
        number = children.pop(pid, None)
        if number is not None:
            _send(replies, {"id": number, "returncode": os.waitstatus_to_exitcode(status)})
    # processes a job left behind, handed to this subreaper: not the server's own children
    for pid in child.children_of(os.getpid()):
        if pid not in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _kill_job(pid: int) -> None:
    for kill in (os.kill, os.killpg):
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)


def _send(fd: int, message: dict) -> None:
    data = json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(fd, data):]


def _become_job(request: dict, close_server: Callable[[], None],
                sys_path_swap: dict[str, str]) -> NoReturn:
    """In the forked child: turn into the process `python -m harness.child SPEC` would be."""
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        close_server()  # a job holding the reply pipe would hide the server's death from the parent
        os.chdir(request["cwd"])
        _redirect(0, os.devnull, os.O_RDONLY)
        _redirect(1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        _redirect(2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        _replace_environment(request["env"])
        sys.path[:] = [request[sys_path_swap[p]] if p in sys_path_swap else p for p in sys.path]
        # what is not preloaded comes from the job's own copy (the server's is hidden from it)
        sys.modules[__package__].__path__[:] = [os.path.join(request["lib"], __package__)]
        sys.argv = [child.__file__, request["spec"]]
        child.run(request["spec"])
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
