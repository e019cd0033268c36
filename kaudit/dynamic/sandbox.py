"""The OS sandbox around every job, kaudit's side: whether it is used (`--sandbox auto|on|off`),
what a job may see (`plan`), and the one place that starts a job's process (`launch`: forked by
the fork server, or a fresh interpreter when the server is disabled or gone).

The sandbox itself is built inside the job, by its supervisor, before any job code runs
(`kaudit.dynamic.harness.jail`, `child.py`): Linux user, mount, PID and network namespaces; the
filesystem read-only except the job's own folders and private tmpfs on /tmp and /dev/shm; kaudit's
installation and its key hidden; a /dev with only the usual and the NVIDIA devices; no network;
every process of the job killed with it; no capabilities. Modes:

- `auto` (default): on wherever it can be built (probed once per kaudit process, in a child), else
  off with a one-line warning on stderr;
- `on`: a usage error (exit 2) where it cannot be built;
- `off`: no namespaces. Jobs still get their own supervisor, resource limits, dropped
  capabilities, a process-tree kill and capped output, and kaudit and its fork server are not
  dumpable; what only the namespaces give is listed in the README's threat model.

In either mode, where kaudit may make memory cgroups (cgroup v2 with the memory controller enabled
for its own cgroup's children, or cgroup v1's memory hierarchy, as root in a container), each job
gets one (`JobCgroup`): its supervisor joins it before anything else, so the job's host memory
(tmpfs pages included) is capped, and whatever is left in it when the job ends is killed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import kaudit
from kaudit.dynamic import forkserver
from kaudit.dynamic.forkserver import Exit, Launch
from kaudit.dynamic.harness import jail

MODES = ("auto", "on", "off")
#: size of each private tmpfs (/tmp, /dev/shm, the job's temporary root); memory is only used
#: as files are written
TMPFS_BYTES = 2 << 30
#: seconds a job's supervisor gets to kill what the job left behind, after SIGTERM
TERM_GRACE = 3.0

_lock = threading.Lock()
_mode = "auto"
_probed: tuple[bool, str | None] | None = None
_warned = False
_plain: set[int] = set()  # pids of supervisors started as fresh interpreters
_stopping = threading.Event()
_cgroups: tuple[bool, tuple[Path, str] | None] | None = None


class SandboxError(RuntimeError):
    """--sandbox on, but the sandbox cannot be built here."""


class Stopped(RuntimeError):
    """kaudit is stopping (SIGTERM, SIGINT): no job starts any more."""


def set_mode(mode: str) -> None:
    global _mode
    if mode not in MODES:
        raise ValueError(f"unknown sandbox mode {mode!r}: {', '.join(MODES)}")
    _mode = mode


def mode() -> str:
    return _mode


def available() -> str | None:
    """None when the sandbox can be built here, else why not (probed once)."""
    global _probed
    with _lock:
        if _probed is None:
            _probed = (True, _probe())
        return _probed[1]


def active() -> bool:
    """Whether jobs run sandboxed now. Raises SandboxError for `on` where it is unavailable;
    warns once for `auto`."""
    global _warned
    if _mode == "off":
        return False
    why = available()
    if why is None:
        return True
    if _mode == "on":
        raise SandboxError(f"--sandbox on, but the OS sandbox is unavailable here: {why}")
    with _lock:
        if not _warned:
            _warned = True
            sys.stderr.write(f"kaudit: the OS sandbox is unavailable here ({why}); jobs run "
                             "without it (see the README's threat model; --sandbox off "
                             "silences this)\n")
    return False


def _probe() -> str | None:
    if not sys.platform.startswith("linux"):
        return "not Linux"
    with tempfile.TemporaryDirectory(prefix="tmp") as folder:
        plan = plan_for(Path(folder), [], [folder])
        code = ("import sys\nfrom kaudit.dynamic.harness import jail\n"
                f"why = jail.probe({plan!r})\nsys.stdout.write(why or '')\n")
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  timeout=60, cwd=folder, env=_probe_environment(),
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the probe did not run: {exc}"
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return f"the probe failed: {lines[-1] if lines else proc.returncode}"
    return proc.stdout.strip() or None


def _probe_environment() -> dict[str, str]:
    package_parent = str(Path(kaudit.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    return env


def hidden_paths() -> list[str]:
    """What no job may read: kaudit's installation (its rules too) and its key folder."""
    from kaudit import rules
    from kaudit.cache import key_folder

    paths = {str(Path(kaudit.__file__).resolve().parent),
             str(Path(rules.__file__).resolve().parent), str(key_folder())}
    return sorted(paths)


def plan_for(root: Path, visible: Iterable[str], writable: Iterable[str],
             gpu_devices: bool = True) -> dict:
    """The filesystem view of a job whose folder is `root`: `writable` read-write, `visible`
    read-only, kaudit hidden, private temporary folders; the GPU devices in its /dev unless
    not `gpu_devices`."""
    temporary = os.path.realpath(tempfile.gettempdir())
    tmp_roots = [] if temporary == "/tmp" or temporary.startswith("/tmp/") else [temporary]
    read = sorted({os.path.realpath(p) for p in [*visible, *_installation_in(temporary)]
                   if os.path.isdir(p)})
    write = sorted({os.path.realpath(p) for p in writable})
    return {"write": write, "read": [p for p in read if p not in write],
            "hide": hidden_paths(), "tmp_roots": tmp_roots, "tmpfs_bytes": TMPFS_BYTES,
            "gpu_devices": gpu_devices}


def _installation_in(temporary: str) -> list[str]:
    """The Python installation's folders (a virtualenv, its site-packages) that lie under a
    folder the job gets a private, empty tmpfs for (/tmp, /dev/shm, the temporary folder):
    shown again read-only, or the job's imports of torch fail there. kaudit's own package
    inside them stays hidden (`hidden_paths`)."""
    roots = [os.path.realpath(r) for r in ("/tmp", "/dev/shm", temporary)]
    folders = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
               *site.getsitepackages()}
    return sorted(p for p in map(os.path.realpath, folders)
                  if any(p == root or p.startswith(root + os.sep) for root in roots))


def protect_parent() -> None:
    """kaudit's own memory out of reach of its jobs (/proc/PID/mem, ptrace): not dumpable."""
    try:
        jail.set_dumpable(False)
    except OSError:
        pass


def launch(job: Launch) -> Exit:
    """Start the job's supervisor (forked by the fork server unless KAUDIT_FORKSERVER=0, or it
    is unavailable) and wait for it, at most `job.timeout` seconds."""
    spec = job.spec.read_bytes()  # a supervisor deletes it: kept for a second start
    if forkserver.wanted():
        check_running()
        try:
            return forkserver.launch(job)
        except forkserver.Unavailable:
            pass  # no server, or it died with the job: run the job (again) in a fresh interpreter
    check_running()
    job.spec.write_bytes(spec)
    return _launch_plain(job)


def check_running() -> None:
    if _stopping.is_set():
        raise Stopped("kaudit is stopping: the job was not run")


def _launch_plain(job: Launch) -> Exit:
    with open(job.stdout, "wb") as stdout, open(job.stderr, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "harness.child", str(job.spec)], cwd=job.cwd,
            env=dict(job.env), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            start_new_session=True, close_fds=True)
    with _lock:
        _plain.add(process.pid)
    try:
        try:
            with job.gate():
                process.wait(timeout=job.timeout)
            return Exit(process.returncode, timed_out=False)
        except subprocess.TimeoutExpired:
            _stop(process)
            return Exit(process.returncode, timed_out=True)
        except BaseException:  # a gate that failed (kaudit stopping): the job stopped, reaped
            _stop(process)
            raise
    finally:
        _kill_group(process.pid)  # helpers the job forked into its group
        with _lock:
            _plain.discard(process.pid)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the supervisor (it kills the job's processes), then SIGKILL its group."""
    try:
        process.terminate()
        process.wait(timeout=TERM_GRACE)
    except (OSError, subprocess.TimeoutExpired):
        pass
    _kill_group(process.pid)
    process.wait()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, 9)
    except (ProcessLookupError, PermissionError):
        pass


def kill_all() -> None:
    """Kill every running job and start no other (SIGTERM or SIGINT to kaudit): the fork
    server's and the fresh ones."""
    _stopping.set()
    forkserver.shutdown()
    with _lock:
        pids = list(_plain)
    for pid in pids:
        _kill_group(pid)


# -- memory cgroups ------------------------------------------------------------------------------


def _cgroup_base() -> tuple[Path, str] | None:
    """(the folder kaudit's own cgroup's children go in, "v1" or "v2"), where it may make them."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            try:
                enabled = (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if "memory" in enabled and os.access(base, os.W_OK):
                return base, "v2"
        elif "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (base / "memory.limit_in_bytes").exists() and os.access(base, os.W_OK):
                return base, "v1"
    return None


def cgroups() -> tuple[Path, str] | None:
    """Where job cgroups can be made (probed once: made, limited and removed), or None."""
    global _cgroups
    with _lock:
        if _cgroups is None:
            found = _cgroup_base()
            if found is not None:
                try:
                    probe = JobCgroup.make(found, 1 << 30)
                    probe.remove()
                except OSError:
                    found = None
            _cgroups = (True, found)
        return _cgroups[1]


class JobCgroup:
    """One job's memory cgroup (a neutral name: the job can read its own /proc/self/cgroup)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @classmethod
    def make(cls, base: tuple[Path, str], limit: int) -> JobCgroup:
        folder, version = base
        path = folder / f"tmp{secrets.token_hex(4)}"
        path.mkdir()
        made = cls(path)
        try:
            name = "memory.max" if version == "v2" else "memory.limit_in_bytes"
            (path / name).write_text(str(int(limit)))
            if version == "v2":
                with contextlib.suppress(OSError):
                    (path / "memory.swap.max").write_text("0")
        except OSError:
            made.remove()
            raise
        return made

    @property
    def procs(self) -> str:
        return str(self.folder / "cgroup.procs")

    def remove(self) -> None:
        """Kill what is left in it, then remove it."""
        for _ in range(50):
            try:
                pids = [int(p) for p in (self.folder / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.folder.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)


def job_cgroup(limit: int | None) -> JobCgroup | None:
    """A memory cgroup for a job, capped at `limit` bytes (else three quarters of the host's
    memory), where cgroups can be made; None elsewhere."""
    base = cgroups()
    if base is None:
        return None
    if limit is None:
        try:
            limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4
        except (ValueError, OSError):
            return None
    try:
        return JobCgroup.make(base, limit)
    except OSError:
        return None
