"""The fork server behind `kaudit.dynamic.runner.run_job`: jobs are forked from a process that has
imported torch, and still get everything a fresh interpreter gave them (environment, isolation,
limits, statuses), whatever happens to the server. With the OS sandbox off (jobs write markers
into the test's folders); tests/test_sandbox.py runs jobs inside it. A job's parent is its
supervisor; "ppid" below is the supervisor's parent: the server, or kaudit for a fresh
interpreter."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kaudit.dynamic import forkserver, sandbox, scratch
from kaudit.dynamic.runner import (
    CRASHED,
    OK,
    OOM,
    TIMEOUT,
    Job,
    _python_path,
    run_job,
    scrubbed_environment,
)
from tests.helpers import wait_until
from tests.test_dynamic_runner import alive

ROOT = Path(__file__).resolve().parent.parent

JOBS = '''
import json, os, resource, subprocess, sys, time

PRELOADED = sorted(m for m in ("torch", "triton") if m in sys.modules)

def server():
    """The parent of the job's supervisor."""
    with open(f"/proc/{os.getppid()}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])

def describe(args, out_dir):
    c_environment = subprocess.run(["env", "-0"], capture_output=True, text=True).stdout
    return {"ppid": server(), "preloaded": PRELOADED, "cwd": os.getcwd(),
            "sys_path_0": sys.path[0], "environ": dict(os.environ),
            "c_environ": dict(e.split("=", 1) for e in c_environment.split("\\0") if e)}

def patch_torch(args, out_dir):
    import torch
    torch.add = None
    sys.modules["kaudit_leak"] = sys
    return {"ppid": server()}

def read_torch(args, out_dir):
    import torch
    return {"ppid": server(), "add_works": torch.add(torch.ones(1), 1).item() == 2.0,
            "leak": "kaudit_leak" in sys.modules}

def park(args, out_dir):
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(args["marker"] + ".tmp", "w") as handle:
        json.dump({"pid": os.getpid(), "ppid": server(), "helper": helper.pid}, handle)
    os.replace(args["marker"] + ".tmp", args["marker"])
    time.sleep(args.get("seconds", 3600))
    return {"ppid": server()}

def segfault(args, out_dir):
    import ctypes
    ctypes.string_at(0)

def numbered(args, out_dir):
    time.sleep(0.3)
    return {"n": args["n"], "pid": os.getpid(), "ppid": server()}

def limits(args, out_dir):
    return {"as": resource.getrlimit(resource.RLIMIT_AS), "ppid": server()}
'''


@pytest.fixture
def jobs(tmp_path) -> Path:
    path = tmp_path / "jobs.py"
    path.write_text(JOBS)
    return path


@pytest.fixture(autouse=True)
def fork_server_wanted(monkeypatch):
    monkeypatch.delenv("KAUDIT_FORKSERVER", raising=False)
    sandbox.set_mode("off")
    yield
    sandbox.set_mode("auto")


def job(jobs: Path, name: str, **options) -> Job:
    return Job(f"{jobs}:{name}", **{"timeout": 60, **options})


def run_ok(one: Job) -> dict:
    with run_job(one) as result:
        assert result.status == OK, result.describe() + result.stderr_tail
        return result.value


def test_forked_child_sees_exactly_the_scrubbed_and_job_environment(jobs, monkeypatch):
    monkeypatch.setenv("KAUDIT_TEST_SECRET", "hunter2")
    job_env = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "1", "KAUDIT_JOB_VAR": "x"}
    value = run_ok(job(jobs, "describe", env=job_env))
    assert value["ppid"] == forkserver.server_pid() != os.getpid()
    assert value["preloaded"] == ["torch"], "torch preloaded, triton not (TRITON_INTERPRET)"
    root = Path(value["cwd"]).parent
    tmp = root / "tmp"
    expected = scrubbed_environment({
        "PYTHONPATH": _python_path(root / "lib"),
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0",
        "TMPDIR": str(tmp), "TRITON_CACHE_DIR": str(tmp / "triton"),
        "XDG_CACHE_HOME": str(tmp / "cache"), "CUDA_CACHE_PATH": str(tmp / "nv"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "CUPY_CACHE_DIR": str(tmp / "cupy"),
        **job_env})
    assert value["environ"] == expected
    assert value["c_environ"] == expected, "programs the job starts inherit the same environment"
    assert value["sys_path_0"] == value["cwd"]
    assert "hunter2" not in repr(forkserver._current.key), "the server starts scrubbed too"


def test_jobs_differing_in_import_time_variables_get_their_own_server(jobs, monkeypatch):
    first = run_ok(job(jobs, "describe", env={"CUDA_VISIBLE_DEVICES": "0"}))
    again = run_ok(job(jobs, "describe", env={"CUDA_VISIBLE_DEVICES": "1"}))
    assert again["ppid"] == first["ppid"], "CUDA_VISIBLE_DEVICES is read after the fork"
    # a candidate job's MAX_JOBS (its extension build) does not cost a server start per job
    build = run_ok(job(jobs, "describe", env={"MAX_JOBS": "3"}))
    assert build["ppid"] == first["ppid"] and build["environ"]["MAX_JOBS"] == "3"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    other = run_ok(job(jobs, "describe"))
    assert other["ppid"] != first["ppid"]
    assert ("OMP_NUM_THREADS", "1") in forkserver._current.key, \
        "torch was imported under the job's OMP_NUM_THREADS"
    assert wait_until(lambda: not alive(first["ppid"])), "the replaced server leaves"


def test_monkey_patching_torch_does_not_reach_the_next_job(jobs):
    patched = run_ok(job(jobs, "patch_torch"))
    value = run_ok(job(jobs, "read_torch"))
    assert value["ppid"] == patched["ppid"] == forkserver.server_pid()
    assert value["add_works"] and not value["leak"]


def test_timeout_kills_the_job_and_its_grandchild(jobs, tmp_path):
    marker = tmp_path / "parked.json"
    started = time.monotonic()
    with run_job(job(jobs, "park", args={"marker": str(marker)}, timeout=3)) as result:
        assert result.status == TIMEOUT, result.describe()
    assert time.monotonic() - started < 15
    parked = json.loads(marker.read_text())
    assert parked["ppid"] == forkserver.server_pid()
    assert wait_until(lambda: not alive(parked["pid"]) and not alive(parked["helper"]))


def test_segfault_is_crashed_with_the_signal_name(jobs):
    with run_job(job(jobs, "segfault")) as result:
        assert result.status == CRASHED and result.error_type == "SIGSEGV"
        assert result.returncode == -signal.SIGSEGV
        assert "segmentation fault" in result.describe()
        assert "Fatal Python error: Segmentation fault" in result.stderr_tail


def test_concurrent_callers_get_their_own_results(jobs):
    with ThreadPoolExecutor(max_workers=4) as pool:
        values = list(pool.map(lambda n: run_ok(job(jobs, "numbered", args={"n": n})),
                               range(8)))
    assert [v["n"] for v in values] == list(range(8))
    assert len({v["pid"] for v in values}) == 8
    assert {v["ppid"] for v in values} == {forkserver.server_pid()}


def test_memory_limit_applies_to_the_forked_child_only(jobs):
    limit = 3 << 30
    limited = run_ok(job(jobs, "limits", memory_limit=limit))
    assert limited["as"] == [limit, limit]
    server = limited["ppid"]
    assert server == forkserver.server_pid()
    line = next(line for line in Path(f"/proc/{server}/limits").read_text().splitlines()
                if line.startswith("Max address space"))
    assert line.split()[3:5] == ["unlimited", "unlimited"], line
    unlimited = run_ok(job(jobs, "limits"))
    assert unlimited["ppid"] == server
    assert unlimited["as"] == [resource.RLIM_INFINITY, resource.RLIM_INFINITY]
    code = "def allocate(args, out_dir):\n    return len(bytearray(args['bytes']))\n"
    (jobs.parent / "allocate.py").write_text(code)
    with run_job(Job(f"{jobs.parent / 'allocate.py'}:allocate", {"bytes": 8 << 30},
                     memory_limit=2 << 30, timeout=60)) as result:
        assert result.status == OOM, result.describe()


def test_a_killed_server_loses_no_job(jobs, tmp_path):
    run_ok(job(jobs, "describe"))
    server = forkserver.server_pid()
    marker = tmp_path / "parked.json"
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(run_ok, job(jobs, "park", args={"marker": str(marker),
                                                             "seconds": 1}))
        assert wait_until(marker.exists)
        first_try = json.loads(marker.read_text())
        assert first_try["ppid"] == server
        os.kill(server, signal.SIGKILL)
        value = waiting.result(timeout=60)
    assert value["ppid"] == os.getpid(), "run again in a fresh interpreter"
    assert wait_until(lambda: not alive(first_try["pid"]) and not alive(first_try["helper"]))
    restarted = run_ok(job(jobs, "describe"))
    assert restarted["ppid"] == forkserver.server_pid() not in (server, os.getpid())


def test_a_server_that_cannot_start_is_bypassed(jobs, monkeypatch):
    forkserver.shutdown()
    monkeypatch.setattr(forkserver, "START_TIMEOUT", 0.0)
    monkeypatch.setattr(forkserver, "_disabled", "")  # restored afterwards, with the server
    with pytest.warns(RuntimeWarning, match="fork server did not start"):
        value = run_ok(job(jobs, "describe"))
    assert value["ppid"] == os.getpid() and forkserver.server_pid() is None
    assert run_ok(job(jobs, "describe"))["ppid"] == os.getpid(), "not tried again"


def test_disabled_by_environment_variable(jobs, monkeypatch):
    monkeypatch.setenv("KAUDIT_FORKSERVER", "0")
    value = run_ok(job(jobs, "describe"))
    assert value["ppid"] == os.getpid() and value["preloaded"] == []


def _kaudit_process(jobs: Path, marker: Path, seconds: float, tmp: Path) -> subprocess.Popen:
    code = ("from kaudit.dynamic import sandbox\nsandbox.set_mode('off')\n"
            "from kaudit.dynamic.runner import Job, run_job\n"
            f"with run_job(Job({str(jobs) + ':park'!r}, {{'marker': {str(marker)!r}, "
            f"'seconds': {seconds}}}, timeout=600)) as result:\n"
            "    assert result.ok, result.describe()\n")
    env = {k: v for k, v in os.environ.items() if k != "KAUDIT_FORKSERVER"}
    env["TMPDIR"] = str(tmp)
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)


def test_server_leaves_with_kaudit(jobs, tmp_path):
    marker = tmp_path / "quick.json"
    process = _kaudit_process(jobs, marker, seconds=0, tmp=_empty(tmp_path / "tmp"))
    assert process.wait(timeout=120) == 0
    server = json.loads(marker.read_text())["ppid"]
    assert server != process.pid
    assert wait_until(lambda: not alive(server)), "shut down at interpreter exit"
    assert list((tmp_path / "tmp").iterdir()) == []


def test_server_and_its_jobs_leave_when_kaudit_dies(jobs, tmp_path, monkeypatch):
    marker = tmp_path / "parked.json"
    process = _kaudit_process(jobs, marker, seconds=3600, tmp=_empty(tmp_path / "tmp"))
    try:
        assert wait_until(marker.exists, 120)
    finally:
        process.kill()
        process.wait()
    parked = json.loads(marker.read_text())
    assert parked["ppid"] != process.pid
    assert wait_until(lambda: not any(alive(parked[k]) for k in ("ppid", "pid", "helper")))
    leftovers = [p.name for p in (tmp_path / "tmp").iterdir()]
    assert len(leftovers) <= 2, leftovers  # kaudit's folder and a job's; the server removed its own
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    assert sorted(scratch.remove_stale()) == sorted(leftovers), "the next kaudit removes them"


def _empty(folder: Path) -> Path:
    folder.mkdir()
    return folder


@pytest.mark.parametrize("bad_fork", [False, True])
def test_server_start_up_probes_whether_a_forked_job_could_use_cuda(bad_fork):
    """torch registers its fork handler when CUDA is merely asked for its devices, without
    initialising it: a server that did so would fork jobs that all fail on CUDA."""
    from types import SimpleNamespace

    from kaudit.dynamic.harness.server import _forks_poisoned

    torch = SimpleNamespace(cuda=SimpleNamespace(_is_in_bad_fork=lambda: bad_fork))
    assert _forks_poisoned(torch) is bad_fork


def test_a_server_started_ahead_serves_the_first_job(jobs):
    """`runner.start_fork_server` (kaudit's start, beside its own imports) starts the server the
    first job would have started: that job is forked from it, no other server is started."""
    from kaudit.dynamic import runner

    forkserver.shutdown()
    runner.start_fork_server()
    assert wait_until(lambda: forkserver.server_pid() is not None, 120), "no server started"
    started = forkserver.server_pid()
    assert run_ok(job(jobs, "describe"))["ppid"] == started == forkserver.server_pid()
