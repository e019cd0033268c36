"""The OS sandbox around every job (`kaudit.dynamic.sandbox`, `harness/jail.py`), what a job can
see of kaudit (nothing that names it), what it leaves behind (no process, no folder), and audits
that cannot complete (KD504/KP501 with the reason, the scan going on). Tests that need the
namespaces skip with the reason where they are unavailable; the rest run in both modes."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kaudit.dynamic import forkserver, sandbox, scratch
from kaudit.dynamic.harness.child import CAPTURE_HEAD, CAPTURE_TAIL
from kaudit.dynamic.runner import OK, Job, OversizedOutput, run_job
from tests.helpers import ROOT, kaudit_environment, processes_named, wait_until

WHY_NOT = sandbox.available()
NEEDS_SANDBOX = pytest.mark.skipif(WHY_NOT is not None, reason=f"no OS sandbox here: {WHY_NOT}")

JOBS = '''
import ctypes, hashlib, os, socket, subprocess, sys, threading, time

def _try(action):
    try:
        return "ok: " + str(action())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"

def _write(path):
    with open(path, "w") as handle:
        handle.write("x")
    return path

def look(args, out_dir):
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    return {
        "pid": os.getpid(), "ppid": os.getppid(),
        "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "kaudit": _try(lambda: os.listdir(args["kaudit"])),
        "key": _try(lambda: os.listdir(args["key"])),
        "tmp": sorted(os.listdir("/tmp")),
        "write_folder": _try(lambda: _write(os.path.join(args["folder"], "outside.txt"))),
        "write_tmp": _try(lambda: _write("/tmp/inside.txt")),
        "write_work": _try(lambda: _write("inside.txt")),
        "connect": _try(lambda: socket.create_connection(("127.0.0.1", args["port"]), 2)),
        "interfaces": [name for _, name in socket.if_nameindex()],
        "capabilities": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
        "devices": sorted(os.listdir("/dev")),
        "parent_memory": _try(lambda: open(f"/proc/{args['parent']}/mem", "rb").read(1)),
    }

def traces(args, out_dir):
    """What a one-line check finds about the process it runs in (paths of the Python
    installation itself aside: a virtualenv inside a checkout named kaudit is the user's)."""
    python = sorted({sys.prefix, sys.base_prefix, os.path.realpath(sys.prefix)}, key=len)[::-1]
    seen = [*sys.modules, *(str(getattr(m, "__file__", "")) for m in list(sys.modules.values())),
            *sys.argv, *getattr(sys, "orig_argv", []), os.getcwd(), *sys.path,
            *(f"{k}={v}" for k, v in os.environ.items()),
            *(t.name for t in threading.enumerate()), *map(repr, sys.meta_path),
            open("/proc/self/cmdline", "rb").read().decode(errors="replace"),
            open("/proc/self/comm").read(), str(sys.modules["__main__"].__dict__.get("__file__"))]
    def cleaned(text):
        for prefix in python:
            text = text.replace(prefix, "<python>")
        return text
    return sorted({s for s in map(cleaned, seen) if "audit" in s.lower()})

def peek(args, out_dir):
    return [_try(lambda: open(f"/proc/{pid}/mem", "rb").read(1)) for pid in args["pids"]]

def daemon(args, out_dir):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            ctypes.CDLL(None).prctl(15, args["name"].encode(), 0, 0, 0)
            time.sleep(120)
        os._exit(0)
    return "started"

def flood(args, out_dir):
    chunk = "y" * (1 << 20) + "\\\\n"
    for _ in range(args["megabytes"]):
        sys.stdout.write(chunk)
    return "done"

def big(args, out_dir):
    import torch
    torch.save([torch.zeros(1 << 20)], os.path.join(out_dir, "big.pt"))
    return "saved"

def sleep(args, out_dir):
    time.sleep(args["seconds"])

def oom_score(args, out_dir):
    def adjust(value):
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write(value)
    return {"adj": open("/proc/self/oom_score_adj").read().strip(),
            "below_kaudit": _try(lambda: adjust("-1000"))}
'''


@pytest.fixture
def jobs(tmp_path) -> Path:
    folder = tmp_path / "jobfiles"
    folder.mkdir()
    (folder / "jobs.py").write_text(JOBS)
    return folder / "jobs.py"


@pytest.fixture
def mode():
    """Restores the sandbox mode a test changes."""
    yield sandbox.set_mode
    sandbox.set_mode("auto")


def run(jobs: Path, function: str, **args):
    with run_job(Job(f"{jobs}:{function}", args, timeout=120)) as result:
        assert result.status == OK, result.describe() + result.stderr_tail
        return result.value


@NEEDS_SANDBOX
def test_a_sandboxed_job_sees_only_its_own_folders(jobs, mode):
    import kaudit
    from kaudit.cache import key_folder

    mode("on")
    key_folder().mkdir(parents=True, exist_ok=True)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        seen = run(jobs, "look", kaudit=str(Path(kaudit.__file__).parent), key=str(key_folder()),
                   folder=str(jobs.parent), port=listener.getsockname()[1], parent=os.getpid())
    assert seen["pid"] == 2 and seen["ppid"] == 1, "PID 2 of its own PID namespace"
    assert len(seen["processes"]) <= 3, seen["processes"]
    hidden = ("ok: []", "FileNotFoundError")  # covered by an empty tmpfs, or (under /tmp) absent
    assert seen["kaudit"].startswith(hidden) and seen["key"].startswith(hidden), "kaudit is hidden"
    assert seen["write_folder"].startswith("OSError") and "Read-only" in seen["write_folder"]
    assert not (jobs.parent / "outside.txt").exists()
    assert seen["write_tmp"].startswith("ok") and seen["write_work"].startswith("ok")
    # (the Python installation, when it lies under /tmp, is shown again read-only)
    shown = [n for n in seen["tmp"] if not os.path.realpath(sys.prefix).startswith(f"/tmp/{n}/")]
    assert "jobfiles" not in " ".join(shown) and len(shown) <= 2, \
        "other jobs and kaudit's folders are not in its /tmp"
    assert not seen["connect"].startswith("ok") and seen["interfaces"] == ["lo"]
    assert int(seen["capabilities"], 16) == 0 and seen["no_new_privs"] == "1"
    assert {"null", "zero", "urandom", "shm"} <= set(seen["devices"])
    assert not [d for d in seen["devices"] if d.startswith(("sd", "vd", "nvme", "mem", "kmsg"))]
    assert not seen["parent_memory"].startswith("ok")


def test_a_job_that_sees_no_gpu_has_it_neither_named_nor_in_its_dev(tmp_path, monkeypatch):
    """A build job runs kernel code while other jobs are timed alone on the GPU."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    script = tmp_path / "jobs.py"
    script.write_text("import os\ndef env(args, out_dir):\n"
                      "    return os.environ.get('CUDA_VISIBLE_DEVICES')\n")
    for hidden, seen in ((True, ""), (False, "0")):
        with run_job(Job(f"{script}:env", timeout=60, no_gpu=hidden)) as result:
            assert result.status == OK and result.value == seen, (hidden, result.describe())
    plan = sandbox.plan_for(tmp_path, [], [], gpu_devices=False)
    assert plan["gpu_devices"] is False and sandbox.plan_for(tmp_path, [], [])["gpu_devices"]


@NEEDS_SANDBOX
@pytest.mark.gpu
@pytest.mark.skipif(not any(d.startswith("nvidia") for d in os.listdir("/dev")),
                    reason="needs a GPU's /dev/nvidia* devices")
def test_a_sandboxed_job_that_sees_no_gpu_has_no_gpu_device(jobs, mode):
    """A process it starts with CUDA_VISIBLE_DEVICES set finds no device to open."""
    mode("on")

    def devices(no_gpu: bool) -> list[str]:
        with run_job(Job(f"{jobs}:look", {"kaudit": "/", "key": "/", "folder": "/", "port": 1,
                                          "parent": os.getpid()}, timeout=120,
                         no_gpu=no_gpu)) as result:
            assert result.status == OK, result.describe()
            return [d for d in result.value["devices"] if d.startswith("nvidia")]

    assert devices(False) and not devices(True)


@pytest.mark.parametrize("sandboxed", ["on", "off"])
@pytest.mark.parametrize("fork_server", ["1", "0"])
def test_nothing_in_a_job_names_kaudit(jobs, mode, monkeypatch, sandboxed, fork_server):
    if sandboxed == "on" and WHY_NOT is not None:
        pytest.skip(f"no OS sandbox here: {WHY_NOT}")
    mode(sandboxed)
    monkeypatch.setenv("KAUDIT_FORKSERVER", fork_server)
    monkeypatch.setenv("PYTHONPATH", kaudit_environment()["PYTHONPATH"])
    assert run(jobs, "traces") == []


def test_the_job_package_never_names_kaudit():
    """Its files are what a job imports: their text (docstrings too) would be a trace."""
    harness = ROOT / "kaudit" / "dynamic" / "harness"
    named = [p.name for p in harness.glob("*.py") if "kaudit" in p.read_text().lower()]
    assert named == []


@pytest.mark.parametrize("sandboxed", ["on", "off"])
def test_a_daemon_dies_with_its_job(jobs, mode, sandboxed):
    if sandboxed == "on" and WHY_NOT is not None:
        pytest.skip(f"no OS sandbox here: {WHY_NOT}")
    mode(sandboxed)
    name = f"dmn{os.getpid() % 100000}{sandboxed}"
    try:
        assert run(jobs, "daemon", name=name) == "started"
        assert wait_until(lambda: not processes_named(name)), "the daemon outlived its job"
    finally:
        for pid in processes_named(name):
            os.kill(pid, signal.SIGKILL)


def test_output_is_capped(jobs):
    with run_job(Job(f"{jobs}:flood", {"megabytes": 20}, timeout=120)) as result:
        assert result.ok, result.describe()
        size = (result.root / "stdout.txt").stat().st_size
        assert size <= CAPTURE_HEAD + CAPTURE_TAIL + 100, size
        assert "bytes left out" in (result.root / "stdout.txt").read_text(errors="replace")


def test_an_output_larger_than_expected_is_not_loaded(jobs):
    pytest.importorskip("torch", reason="outputs are torch files")
    with run_job(Job(f"{jobs}:big", timeout=120)) as result:
        assert result.ok, result.describe()
        with pytest.raises(OversizedOutput, match="not loaded"):
            result.load_tensors("big.pt", max_bytes=4096)
        assert len(result.load_tensors("big.pt", max_bytes=8 << 20)) == 1


def test_sandbox_on_where_it_cannot_be_built_is_a_usage_error(monkeypatch, mode, in_tmp):
    from typer.testing import CliRunner

    from kaudit.cli import app

    monkeypatch.setattr(sandbox, "_probed", (True, "no user namespaces (test)"))
    (in_tmp / "kernel.py").write_text("class ModelNew:\n    pass\n")
    result = CliRunner().invoke(app, ["scan", "kernel.py", "--dynamic", "--no-cache",
                                      "--sandbox", "on", "--device", "cpu"])
    assert result.exit_code == 2
    assert "--sandbox on, but the OS sandbox is unavailable here: no user namespaces" in \
        result.output


def test_auto_without_a_sandbox_warns_once(monkeypatch, capsys, mode):
    monkeypatch.setattr(sandbox, "_probed", (True, "no user namespaces (test)"))
    monkeypatch.setattr(sandbox, "_warned", False)
    assert sandbox.active() is False and sandbox.active() is False
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(lines) == 1 and "sandbox is unavailable here (no user namespaces" in lines[0]


def test_stale_folders_of_a_killed_run_are_removed(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old, recent = tmp_path / "kaudit-old12345", tmp_path / "kaudit-new12345"
    for own, job in ((old, "tmpabcdefgh"), (recent, "tmpijklmnop")):
        own.mkdir()
        (tmp_path / job).mkdir()
        (own / scratch.LIST).write_text(job + "\n../escape\n")
    (tmp_path / "unrelated").mkdir()
    day_ago = time.time() - scratch.STALE_AFTER - 60
    os.utime(old, (day_ago, day_ago))
    removed = scratch.remove_stale()
    assert sorted(removed) == ["kaudit-old12345", "tmpabcdefgh"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kaudit-new12345", "tmpijklmnop",
                                                         "unrelated"]


def test_folders_of_a_kaudit_that_died_are_removed_at_once(tmp_path, monkeypatch):
    """A scan killed on the H200 left 40 GiB for a day, and the next scan's default temp limit
    (a share of what is free) shrank to a third. A folder whose owner process has ended, or
    whose PID now names another process, goes at once; a live owner's, or one of another PID
    namespace (not visible from here), waits for the day."""
    import subprocess
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen(["sleep", "60"])
    dead_identity = scratch._process_identity(ended.pid)
    ended.kill()
    ended.wait()
    living = subprocess.Popen(["sleep", "60"])
    try:
        live_identity = scratch._process_identity(living.pid)
        pid, start, namespace = live_identity.split()
        owners = {"kaudit-dead1234": dead_identity, "kaudit-live1234": live_identity,
                  "kaudit-reused12": f"{pid} {int(start) + 1} {namespace}",
                  "kaudit-othern12": f"{ended.pid} {dead_identity.split()[1]} pid:[1]"}
        for index, (name, owner) in enumerate(owners.items()):
            (tmp_path / name).mkdir()
            (tmp_path / name / scratch.OWNER).write_text(owner)
            (tmp_path / name / scratch.LIST).write_text(f"tmpjob{index}abcd\n")
            (tmp_path / f"tmpjob{index}abcd").mkdir()
        removed = scratch.remove_stale()
        # two days on: the owner in another namespace is unknown, and its folder is old; the
        # live owner's stays, however old (a folder's time is when it was made)
        later = scratch.remove_stale(now=time.time() + 2 * scratch.STALE_AFTER)
    finally:
        living.kill()
        living.wait()
    assert sorted(removed) == ["kaudit-dead1234", "kaudit-reused12", "tmpjob0abcd", "tmpjob2abcd"]
    assert sorted(later) == ["kaudit-othern12", "tmpjob3abcd"]


SLEEPER = ("import time\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
           "    def forward(self, x):\n        time.sleep(600)\n        return x\n")
PROBLEM = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
           "    def forward(self, x):\n        return x\n\n\ndef get_inputs():\n"
           "    return [torch.randn({n})]\n\n\ndef get_init_inputs():\n    return []\n")


def _kernel(folder: Path, kernel: str, inputs: int = 16) -> Path:
    folder.mkdir(parents=True)
    (folder / "problem.py").write_text(PROBLEM.format(n=inputs))
    (folder / "kernel.py").write_text(kernel)
    return folder


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_kaudit_stopped_mid_scan_leaves_nothing(tmp_path, number):
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    for name in ("sleeper", "second", "third"):
        _kernel(tmp_path / name, SLEEPER + f"# {name}\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "kaudit", "scan", "sleeper", "second", "third", "--dynamic",
         "--device", "cpu", "--no-cache", "--timeout", "300", "-j", "2",
         "--stream", "stream.jsonl"],
        cwd=tmp_path, env=kaudit_environment(tmp),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # a candidate job is running once a kernel's inputs are shared with its jobs
        assert wait_until(lambda: any((p / "inputs_a.pt").exists()
                                      for p in tmp.glob("tmp*")), 120)
        time.sleep(1)
        started = time.monotonic()
        process.send_signal(number)
        process.wait(timeout=60)
        assert time.monotonic() - started < 30, "the running jobs were killed, the rest not run"
    finally:
        process.kill()
    assert process.returncode != 0
    assert wait_until(lambda: not list(tmp.iterdir()), 15), list(tmp.iterdir())
    # what was cut short is not audited, never a failure of the kernel
    streamed = [json.loads(line) for line in (tmp_path / "stream.jsonl").read_text().splitlines()]
    assert streamed  # at least the kernel whose job was running (SIGINT starts no other)
    for line in streamed:
        assert (line["status"], line["verdict"]) == ("incomplete", "unverified"), line
        assert {f["rule"] for f in line["findings"]} == {"KD504"}, line


def test_a_failed_write_in_kaudit_is_kd504_and_leaves_no_folder(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch", reason="the dynamic pass needs torch")
    import tempfile

    from kaudit.dynamic import kernels
    from kaudit.dynamic.kernels import DynamicOptions, audit_kernel
    from kaudit.dynamic.tolerance import resolve

    del torch
    scratch_root = tmp_path / "scratch"
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    kernel = _kernel(tmp_path / "kernel", SLEEPER.replace("time.sleep(600)", "pass")) / "kernel.py"

    def full_disk(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(kernels, "share_inputs", full_disk)  # moving the inputs out
    run = audit_kernel(str(kernel), "kernel.py", kernel.read_text(),
                       DynamicOptions(resolve(None, None, None), device="cpu", timeout=120), "cpu")
    (finding,) = run.findings
    assert finding.rule == "KD504" and "No space left on device" in finding.message
    assert run.status == "incomplete"
    leftovers = [p for p in scratch_root.iterdir() if not p.name.startswith(scratch.PREFIX)]
    assert leftovers == []


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-Urm", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -Urm` to mount a small tmpfs")
def test_a_full_disk_during_the_dynamic_pass_is_kd504_and_the_scan_goes_on(tmp_path):
    """kaudit's TMPDIR on a 2 MiB tmpfs: the reference job cannot write its 4 MiB inputs (with
    no --temp-limit, which would stop it first: tests/test_gpu_share.py)."""
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    quick = SLEEPER.replace("time.sleep(600)", "pass")
    for name in ("first", "second"):
        _kernel(tmp_path / name, quick, inputs=1 << 20)
    tmp = tmp_path / "small"
    tmp.mkdir()
    script = (f"mount -t tmpfs -o size=2m tmpfs {tmp} && exec {sys.executable} -m kaudit scan "
              "first second --dynamic --device cpu --no-cache --temp-limit none -f json")
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", script], cwd=tmp_path,
                          env=kaudit_environment(tmp), capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    dynamic = [(Path(f["path"]).parent.name, f["rule"]) for f in report["findings"]
               if f["pass"] == "dynamic"]
    assert sorted(dynamic) == [("first", "KD504"), ("second", "KD504")], report["findings"]
    assert all("No space left on device" in f["message"] for f in report["findings"]
               if f["rule"] == "KD504")


@pytest.mark.parametrize("confined", ["off", "auto"])
def test_the_host_kills_a_job_before_kaudit_when_memory_runs_out(jobs, mode, confined):
    """On a GPU run a job has no memory cap of its own; one that fills the host's memory must
    cost its own audit, not the kaudit process and every audit in it."""
    mode(confined)
    seen = run(jobs, "oom_score")
    assert seen["adj"] == "1000"
    assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000", "kaudit is spared"
    assert seen["below_kaudit"].startswith("PermissionError"), \
        "a hostile job may take its score back to where it started, never below"


def test_a_job_cannot_read_the_memory_of_kaudit_or_its_server(jobs, mode):
    """Without the sandbox too: both are not dumpable, and the job has no capability."""
    mode("off")
    run(jobs, "traces")
    server = forkserver.server_pid()
    seen = run(jobs, "peek", pids=[server, os.getpid()])
    assert [s.split(":")[0] for s in seen] == ["PermissionError", "PermissionError"], seen


def test_scratch_folders_are_neutral_and_listed(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_own", None)
    folder = scratch.folder()
    assert folder.name.startswith("tmp") and "audit" not in str(folder.relative_to(tmp_path))
    own = scratch.own_folder()
    assert own.name.startswith("kaudit-") and folder.name in (own / scratch.LIST).read_text()
    scratch.remove(folder)
    assert not folder.exists()
    shutil.rmtree(own)


@pytest.mark.skipif(sandbox.cgroups() is None, reason="kaudit cannot make memory cgroups here")
def test_a_job_is_capped_by_its_memory_cgroup(jobs, monkeypatch):
    """Host memory, GPU runs too (RLIMIT_AS is for CPU runs): a job past its cgroup's limit is
    killed, and the cgroup goes with the job."""
    made = []
    original = sandbox.job_cgroup

    def small(limit):
        made.append(original(256 << 20))
        return made[-1]

    monkeypatch.setattr(sandbox, "job_cgroup", small)
    (jobs.parent / "grab.py").write_text(
        "def grab(args, out_dir):\n    blob = bytearray(args['bytes'])\n"
        "    for i in range(0, len(blob), 4096):\n        blob[i] = 1\n    return len(blob)\n")
    target = f"{jobs.parent / 'grab.py'}:grab"
    with run_job(Job(target, {"bytes": 64 << 20}, timeout=120)) as result:
        assert result.ok, result.describe()
    with run_job(Job(target, {"bytes": 1 << 30}, timeout=120)) as result:
        assert result.status in ("crashed", "oom") and "SIGKILL" in result.describe(), \
            result.describe()
    assert made and not any(c.folder.exists() for c in made)


def test_a_python_installation_under_tmp_is_shown_again(tmp_path, monkeypatch):
    """A virtualenv under /tmp (a clone there) would vanish under the job's private /tmp, and
    torch's lazy imports with it: its folders are bound back read-only, kaudit stays hidden."""
    venv = tmp_path / "venv"
    (venv / "lib").mkdir(parents=True)
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setattr(sys, "exec_prefix", str(venv))
    monkeypatch.setattr(sandbox.site, "getsitepackages", lambda: [str(venv / "lib")])
    plan = sandbox.plan_for(tmp_path / "job", [], [str(tmp_path / "job")])
    temporary = os.path.realpath(tempfile.gettempdir())
    assert os.path.realpath(venv) in plan["read"] and os.path.realpath(venv / "lib") in plan["read"]
    assert all(p.startswith(("/tmp", "/dev/shm", temporary)) for p in plan["read"]), plan["read"]
    assert sandbox.hidden_paths() == plan["hide"]
