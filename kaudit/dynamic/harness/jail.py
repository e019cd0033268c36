"""The Linux calls that confine a job, through ctypes (Python 3.11 has no `os.unshare`), applied by
the job's own supervisor before any job code runs (see `child.py`).

`enter(plan)` puts the calling, single-threaded process into new user, mount and network
namespaces (without a user namespace when that is refused and the process is root) and builds the
job's view of the filesystem: everything read-only; a private tmpfs on /tmp (and on the job's
temporary root, when that is elsewhere) and on /dev/shm; a /dev with only the usual character
devices and the NVIDIA ones (none for a plan without `gpu_devices`); the `hide` paths covered
by empty tmpfs; the `read` folders bound back read-only and the `write` folders read-write, each
at its own path. `enter_pid_namespace()` makes the next child PID 1 of a new PID namespace,
`mount_proc()` gives that namespace its own /proc, and `drop_privileges()` ends with no
capability and no way to gain one (bounding set emptied, no_new_privs), so the job cannot undo
any of it.

Every function raises `JailError` with the failing call and errno; `probe()` reports why the
sandbox cannot be built here (None when it can).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NAME = 1, 4, 15
PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 24, 36, 38
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY = 0x1
_MOUNT_SETATTR = {"x86_64": 442, "aarch64": 442}.get(platform.machine())
_CAPSET = {"x86_64": 126, "aarch64": 91}.get(platform.machine())
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
#: the GPU devices (nvidia0, nvidiactl, nvidia-uvm, ...), left out of a job that sees no GPU
GPU_DEVICE_PREFIX = "nvidia"
#: capability numbers to drop from the bounding set (CAP_LAST_CAP is 40 on current kernels)
LAST_CAP = 63

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong)
_libc.syscall.restype = ctypes.c_long


class JailError(OSError):
    """A confinement step failed."""


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(result: int, what: str) -> int:
    if result == -1:
        number = ctypes.get_errno()
        raise JailError(number, f"{what}: {os.strerror(number)}")
    return result


def prctl(option: int, value: int = 0) -> None:
    _check(_libc.prctl(option, value, 0, 0, 0), f"prctl({option})")


def set_dumpable(dumpable: bool) -> None:
    """Whether other processes of this user may read or write this one's memory (/proc/PID/mem,
    ptrace); the parent and its fork server turn it off."""
    prctl(PR_SET_DUMPABLE, 1 if dumpable else 0)


def die_with_parent(signal_number: int) -> None:
    prctl(PR_SET_PDEATHSIG, signal_number)


def first_to_kill_when_memory_runs_out() -> None:
    """The host's out-of-memory killer picks this process, and all it starts, before any
    other: a job that fills the host's memory (its own, or with its neighbours': a GPU job has
    no memory cap) loses itself, not the parent that holds every other job's results. Raising
    one's own score needs no privilege. Without CAP_SYS_RESOURCE here (a container) a hostile
    job may lower it back to the score it started with, never below: it can make itself as
    likely a victim as the parent, not more protected."""
    with contextlib.suppress(OSError):
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as handle:
            handle.write("1000")


def become_subreaper() -> None:
    """Orphaned descendants are handed to this process instead of init."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def set_thread_name(name: str) -> None:
    _libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def _mount(source: str | None, target: str, kind: str | None, flags: int,
           data: str | None = None) -> None:
    def encode(text: str | None) -> bytes | None:
        return text.encode() if text is not None else None

    _check(_libc.mount(encode(source), encode(target), encode(kind), flags, encode(data)),
           f"mount {source or kind} on {target}")


def _unshare(flags: int, what: str) -> None:
    _check(_libc.unshare(flags), f"unshare({what})")


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write(text)
    except OSError as exc:
        raise JailError(exc.errno or errno.EPERM, f"write {path}: {exc.strerror}") from exc


def enter(plan: dict) -> str:
    """Enter new user (where possible), mount and network namespaces and build the job's
    filesystem view from `plan` (`write`, `read`, `hide`, `tmp_roots`, `tmpfs_bytes`). Returns how
    the namespaces were made ("user namespace" or "root without a user namespace")."""
    how = _new_namespaces(os.getuid(), os.getgid())
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # the folders to show again, opened in the new namespace before anything covers them
    sources = {path: os.open(path, os.O_PATH | os.O_DIRECTORY)
               for path in [*plan.get("read", []), *plan.get("write", [])]}
    try:
        _build_view(plan, sources)
    finally:
        for fd in sources.values():
            os.close(fd)
    return how


def _new_namespaces(uid: int, gid: int) -> str:
    try:
        _unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET, "user, mount, network")
    except JailError as first:
        if uid != 0:
            raise
        try:  # root where user namespaces are refused (a container): the same without one
            _unshare(CLONE_NEWNS | CLONE_NEWNET, "mount, network")
        except JailError:
            raise first from None
        return "root without a user namespace"
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    return "user namespace"


def _build_view(plan: dict, sources: dict[str, int]) -> None:
    size = int(plan.get("tmpfs_bytes", 1 << 30))
    # 1. a private /dev: the usual devices and the GPU ones (unless the job sees no GPU), bound
    # from the real /dev
    devices = [d for d in DEVICES if os.path.exists(f"/dev/{d}")]
    gpu = sorted(d for d in os.listdir("/dev") if d.startswith(GPU_DEVICE_PREFIX)) \
        if plan.get("gpu_devices", True) else []
    device_fds = {d: os.open(f"/dev/{d}", os.O_PATH) for d in devices + gpu}
    try:
        _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=755,size=1m")
        for name, fd in device_fds.items():
            target = f"/dev/{name}"
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.mkdir(target)
            else:
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o666))
            _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    finally:
        for fd in device_fds.values():
            os.close(fd)
    os.mkdir("/dev/shm")
    os.symlink("/proc/self/fd", "/dev/fd")
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{number}", f"/dev/{name}")
    # 2. private temporary folders: other jobs, the parent's own folders and the fork server vanish
    for root in ["/tmp", "/dev/shm", *plan.get("tmp_roots", [])]:
        if os.path.isdir(root):
            _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={size}")
    # 3. the job's own folders back, at their own paths (and a Python installation under /tmp)
    for path, fd in sources.items():
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    # 4. what the job must not read: the parent's installation, its key (after the binds, which
    #    could otherwise show them again)
    for path in plan.get("hide", []):
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=755,size=4k")
    # 5. everything read-only, then the job's writable places writable again
    writable = ["/tmp", "/dev/shm", *plan.get("tmp_roots", []), *plan.get("write", [])]
    _read_only_everywhere()
    for path in writable:
        if os.path.isdir(path):
            _set_writable(path)


def _read_only_everywhere() -> None:
    if _MOUNT_SETATTR is not None:
        attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
        result = _libc.syscall(_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr),
                               ctypes.sizeof(attr))
        if result == 0:
            return
    # kernels before 5.12: remount each mount point read-only, keeping its other flags
    for target in _mount_points():
        flags = _flags_of(target)
        try:
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except JailError as exc:
            if exc.errno not in (errno.ENOENT, errno.EACCES):
                raise


def _set_writable(path: str) -> None:
    _mount(None, path, None, MS_REMOUNT | MS_BIND | (_flags_of(path) & ~MS_RDONLY))


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
        points = [line.split()[4].encode().decode("unicode_escape") for line in handle]
    return sorted(set(points), key=len)


def _flags_of(path: str) -> int:
    flags = os.statvfs(path).f_flag
    result = 0
    for statvfs_flag, mount_flag in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV),
                                     (os.ST_NOEXEC, MS_NOEXEC), (os.ST_RDONLY, MS_RDONLY)):
        if flags & statvfs_flag:
            result |= mount_flag
    return result


def enter_pid_namespace() -> None:
    """The next child of this process is PID 1 of a new PID namespace; when it dies, every
    process in that namespace is killed."""
    _unshare(CLONE_NEWPID, "pid")


def mount_proc() -> bool:
    """A /proc showing only this PID namespace (called by its PID 1); False where the kernel
    refuses (a container that masks parts of /proc): the old /proc stays, read-only."""
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except JailError:
        return False
    return True


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_privileges() -> None:
    """No capability, none to regain: empty bounding set, no_new_privs, empty capability sets.
    For a process without capabilities (an ordinary user outside a user namespace) this only
    sets no_new_privs."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    for cap in range(LAST_CAP + 1):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == -1 and ctypes.get_errno() == errno.EINVAL:
            break  # past the last capability this kernel knows
    if _CAPSET is None:
        return
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    _check(_libc.syscall(_CAPSET, ctypes.byref(header), ctypes.byref(data)), "capset")


def probe(plan: dict) -> str | None:
    """Why `enter(plan)` fails in a child process, or None when it works (runs in a fork)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            enter(plan)
            enter_pid_namespace()
            child = os.fork()
            if child == 0:
                message = b"" if mount_proc() else b"/proc: not remounted"
                drop_privileges()
                os.write(write, message)
                os._exit(0)
            _, status = os.waitpid(child, 0)
            os._exit(0 if status == 0 else 1)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(write, f"{exc}".encode()[:500] or b"failed")
            os._exit(1)
    os.close(write)
    with os.fdopen(read, "rb") as handle:
        message = handle.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if status != 0:
        return message or "the sandbox's set-up failed"
    return None
