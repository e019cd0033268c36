"""The isolated job runner (`kaudit.dynamic.runner`): results, failures as statuses, the scrubbed
environment, the fresh working folder, the process-group kill and safe loading of outputs. These run
with the OS sandbox off (jobs write markers into the test's folders); tests/test_sandbox.py runs
jobs inside it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kaudit.dynamic import forkserver, sandbox
from kaudit.dynamic.runner import CRASHED, ERROR, OK, OOM, TIMEOUT, Job, OutputError, run_job

JOBS = '''
import json, os, subprocess, sys, time

def grandparent():
    with open(f"/proc/{os.getppid()}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])

def echo(args, out_dir):
    return {"args": args, "ppid": os.getppid(), "grandparent": grandparent(), "cwd": os.getcwd(),
            "env": sorted(os.environ),
            "secret": os.environ.get("KAUDIT_TEST_SECRET"),
            "torch_home": os.environ.get("TORCH_HOME"), "files_in_cwd": os.listdir(".")}

def write_file(args, out_dir):
    open("left_behind.txt", "w").write("x")
    open(os.path.join(out_dir, "data.json"), "w").write(json.dumps({"n": 3}))
    os.symlink("/etc/hostname", os.path.join(out_dir, "link.json"))
    return {"cwd": os.getcwd()}

def boom(args, out_dir):
    raise ValueError("boom: " + args["why"])

def sleep(args, out_dir):
    time.sleep(3600)

def hard_exit(args, out_dir):
    os._exit(3)

def abort(args, out_dir):
    os.abort()

def allocate(args, out_dir):
    blob = bytearray(args["bytes"])
    return len(blob)

def not_json(args, out_dir):
    return {"value": object()}

def orphan(args, out_dir):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    return {"pid": child.pid}

def threads(args, out_dir):
    import torch
    return {"omp": os.environ.get("OMP_NUM_THREADS"), "torch": torch.get_num_threads()}

def tensors(args, out_dir):
    import torch
    torch.save([torch.arange(4.0)], os.path.join(out_dir, "ok.pt"))
    torch.save({"not": "tensors"}, os.path.join(out_dir, "dict.pt"))
    return {}

class Trap:
    def __reduce__(self):
        return (os.system, ("touch " + os.environ["TRAP_FILE"],))

def trap(args, out_dir):
    import pickle
    with open(os.path.join(out_dir, "trap.pt"), "wb") as handle:
        pickle.dump(Trap(), handle, protocol=2)
    return {}
'''


@pytest.fixture(autouse=True)
def no_sandbox():
    sandbox.set_mode("off")
    yield
    sandbox.set_mode("auto")


@pytest.fixture
def jobs(tmp_path) -> Path:
    path = tmp_path / "jobs.py"
    path.write_text(JOBS)
    return path


def job(jobs: Path, name: str, **options) -> Job:
    return Job(f"{jobs}:{name}", **options)


def test_result_and_scrubbed_environment(jobs, monkeypatch):
    monkeypatch.delenv("KAUDIT_FORKSERVER", raising=False)
    monkeypatch.setenv("KAUDIT_TEST_SECRET", "hunter2")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("TORCH_HOME", "/tmp/torch-home")
    with run_job(job(jobs, "echo", args={"a": [1, 2]}, timeout=60)) as result:
        assert result.status == OK and result.ok, result.describe()
        value = result.value
        root = Path(value["cwd"]).parent
        assert root.exists()
    assert not root.exists(), "the job's private folder is removed"
    assert value["args"] == {"a": [1, 2]}
    assert value["secret"] is None and "AWS_SECRET_ACCESS_KEY" not in value["env"]
    assert value["torch_home"] == "/tmp/torch-home" and "PATH" in value["env"]
    assert value["files_in_cwd"] == [] and value["cwd"] != os.getcwd()
    assert value["grandparent"] == forkserver.server_pid() != os.getpid(), \
        "its supervisor was forked by the fork server"


def test_jobs_share_the_cores_out_while_audits_run_at_once_on_a_gpu(jobs, monkeypatch):
    """Uncapped, each of 14 jobs at once ran its operators on a team of one thread per core."""
    pytest.importorskip("torch", reason="the job reads torch's threads")
    from kaudit.dynamic.runner import sharing_cores

    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = torch.get_num_threads()
    with sharing_cores(2), run_job(job(jobs, "threads", timeout=120)) as result:
        assert result.ok, result.describe()
        assert result.value == {"omp": str(max(1, cores // 2)), "torch": max(1, cores // 2)}
    with sharing_cores(cores + 1), run_job(job(jobs, "threads", timeout=120)) as result:
        assert result.value == {"omp": "1", "torch": 1}, "at least one each"
    with run_job(job(jobs, "threads", timeout=120)) as result:
        assert result.ok and result.value == {"omp": None, "torch": cores}, "given back after"
    with sharing_cores(1), run_job(job(jobs, "threads", timeout=120)) as result:
        assert result.value == {"omp": None, "torch": cores}, "one audit: torch's own choice"
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with sharing_cores(cores + 1), run_job(job(jobs, "threads", timeout=120)) as result:
        assert result.value["omp"] == "2", "the user's setting passes as it is"


def test_a_scan_shares_the_cores_out_on_a_gpu_only(monkeypatch):
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    import contextlib

    from kaudit.dynamic import executors, runner
    from kaudit.dynamic.options import DynamicOptions

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(executors, "jobs_guarded", lambda mode: contextlib.nullcontext())
    local = executors.LocalExecutor(DynamicOptions(device="cpu", jobs=4))
    import torch

    for device, expected in (("cuda", str(max(1, torch.get_num_threads() // 4))), ("cpu", None)):
        with local.guarded(device):
            assert runner._job_environment(Path(os.devnull), {}).get("OMP_NUM_THREADS") == \
                expected, device


def test_outputs_are_files_in_a_private_folder(jobs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with run_job(job(jobs, "write_file", timeout=60)) as result:
        assert result.ok, result.describe()
        assert result.read_json("data.json") == {"n": 3}
        assert result.files() == ["data.json"], "symlinks are not handed back"
        with pytest.raises(FileNotFoundError):
            result.path("link.json")
        with pytest.raises(FileNotFoundError):
            result.path("../spec.json")
    assert not (tmp_path / "left_behind.txt").exists()


def test_exception_is_a_result(jobs):
    with run_job(job(jobs, "boom", args={"why": "testing"}, timeout=60)) as result:
        assert result.status == ERROR and result.error_type == "ValueError"
        assert result.error == "boom: testing" and "Traceback" in result.traceback
        assert result.describe() == "failed during job: ValueError: boom: testing"


def test_missing_job_is_a_result(jobs):
    with run_job(Job(f"{jobs}:no_such_function", timeout=60)) as result:
        assert result.status == ERROR and result.phase == "job-import"
        assert result.error_type == "AttributeError"


def test_timeout_kills_the_process_group(jobs):
    started = time.monotonic()
    with run_job(job(jobs, "sleep", timeout=2)) as result:
        assert result.status == TIMEOUT and "timed out after 2 s" in result.describe()
    assert time.monotonic() - started < 15


def test_forked_helpers_do_not_outlive_the_job(jobs):
    with run_job(job(jobs, "orphan", timeout=60)) as result:
        assert result.ok, result.describe()
        pid = result.value["pid"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    assert not alive(pid)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie no longer does)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize(("name", "status", "text"), [
    ("hard_exit", CRASHED, "exited with code 3 without a result"),
    ("abort", CRASHED, "SIGABRT"),
    ("not_json", ERROR, "not JSON"),
])
def test_crashes_are_results(jobs, name, status, text):
    with run_job(job(jobs, name, timeout=60)) as result:
        assert result.status == status and text in result.describe(), result.describe()


def test_memory_limit(jobs):
    with run_job(job(jobs, "allocate", args={"bytes": 8 << 30}, memory_limit=2 << 30,
                     timeout=60)) as result:
        assert result.status == OOM and "out of memory" in result.describe()


def test_tensors_are_loaded_safely(jobs, tmp_path):
    torch = pytest.importorskip("torch", reason="loading outputs needs torch")
    with run_job(job(jobs, "tensors", timeout=120)) as result:
        assert result.ok, result.describe()
        (tensor,) = result.load_tensors("ok.pt")
        assert torch.equal(tensor, torch.arange(4.0))
        with pytest.raises(OutputError, match="expected tensors"):
            result.load_tensors("dict.pt")
    trap = tmp_path / "trap-sprung"
    with run_job(job(jobs, "trap", timeout=60, env={"TRAP_FILE": str(trap)})) as result:
        assert result.ok, result.describe()
        with pytest.raises(OutputError, match="cannot load"):
            result.load_tensors("trap.pt")
    assert not trap.exists(), "weights_only loading must not run pickled code"


def test_problems_without_torch_is_a_usage_error():
    """Without torch `kaudit problems` says what to install (exit 2), and nothing else needs it."""
    import subprocess
    import sys

    code = ("import sys\nsys.modules['torch'] = None\nfrom kaudit.cli import main\n"
            "sys.argv = ['kaudit', 'problems', 'fixtures/problems/good_matmul.py']\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert proc.returncode == 2
    assert "needs PyTorch" in proc.stderr and "kaudit[dynamic]" in proc.stderr


def test_job_seconds_add_up_by_kind(tmp_path):
    from kaudit.dynamic.runner import add_job_seconds, job_seconds

    add_job_seconds("outside", 1.0)  # no collection open: nothing to add to
    with job_seconds() as seconds:
        add_job_seconds("timing", 1.5)
        add_job_seconds("timing", 0.5)
        add_job_seconds("timing", "forged")
        add_job_seconds("timing", -3)
    assert seconds == {"timing": 2.0}


PROBLEM = """
import sys
import time
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        time.sleep(0.3)
        if FAIL:
            raise RuntimeError("no")
        return x * 2

def get_inputs():
    return [torch.randn(8)]

def get_init_inputs():
    return []
"""


def test_every_job_reports_its_phases_even_a_failed_one_and_the_report_is_bounded(tmp_path):
    pytest.importorskip("torch", reason="the problem job needs torch")
    from kaudit.dynamic.problems import JOB_TARGET
    from kaudit.dynamic.runner import MAX_PHASES, job_seconds

    def problem(name: str, body: str) -> Job:
        path = tmp_path / f"{name}.py"
        path.write_text(body)
        return Job(JOB_TARGET, {"path": str(path), "device": "cpu", "seeds": [1],
                                "init_seed": 0, "scales": []}, timeout=120)

    with job_seconds() as seconds:
        with run_job(problem("ok", "FAIL = False" + PROBLEM)) as ok:
            assert ok.status == OK, ok.describe()
        with run_job(problem("failing", "FAIL = True" + PROBLEM)) as failed:
            assert failed.status == ERROR and failed.phase == "forward"
    assert 0.6 <= seconds["problem:forward"] < 10, "both runs' forward, the failed one's too"
    assert seconds["problem"] >= seconds["problem:forward"] + seconds["problem:import"]
    # code under audit runs in the job: it may rewrite what the job reports of itself
    flood = ("sys.modules['harness.child']._seconds.update("
             "{f'phase{n}': 0.1 for n in range(1000)} | {'x' * 500: 1e9, 'text': 'x'})\n")
    with job_seconds() as flooded:
        with run_job(problem("flood", "FAIL = False" + PROBLEM + flood)) as result:
            assert result.ok, result.describe()
    assert len([k for k in flooded if k.startswith("problem:")]) == MAX_PHASES
    assert all(len(k) <= len("problem:") + 40 and v < 1e6 for k, v in flooded.items())


def test_a_kernels_inputs_are_read_in_kaudit_only_when_asked_and_scaled_as_the_jobs_scale_them(
        tmp_path, monkeypatch):
    torch = pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic.harness.scaling import scale_input
    from kaudit.dynamic.kernels import LazyInputs
    from kaudit.dynamic.runner import SharedInputs

    a, b = [torch.randn(64), torch.arange(3)], [torch.randn(64)]
    torch.save(a, tmp_path / "inputs_a.pt")
    torch.save(b, tmp_path / "inputs_b.pt")
    inputs = LazyInputs(SharedInputs.seal(tmp_path), {"s0": 1e-3, "s1": 1e3})
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *args, **kw: loads.append(args[0]) or
                        real_load(*args, **kw))
    assert list(inputs) == ["a", "b", "s0", "s1"] and "s1" in inputs and "s2" not in inputs
    assert loads == []  # nothing read before a set is asked for
    scaled = inputs["s1"]
    assert torch.equal(scaled[0], scale_input(a[0], 1e3, torch)) and torch.equal(scaled[1], a[1])
    assert inputs.get("s9") is None and torch.equal(inputs["b"][0], b[0])
    assert [p.name for p in loads] == ["inputs_a.pt", "inputs_b.pt"]  # each once
    inputs["a"], inputs["s0"]
    assert len(loads) == 2


SHORT_WRITE_JOB = """
import os

def short_write(args, out_dir):
    if args["disk_full"]:  # as the disk looks while it is full
        full = os.statvfs(".")
        os.statvfs = lambda path: os.statvfs_result((full.f_bsize, full.f_frsize, full.f_blocks,
                                                     0, 0, *full[5:]))
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
"""


@pytest.mark.parametrize("disk_full", [True, False])
def test_a_short_write_is_put_down_to_a_full_disk_only_while_the_disk_is_full(tmp_path,
                                                                               disk_full):
    """torch's writer names no cause; on the H200, fourteen audits filled the disk, a reference
    job failed so, and the space was free again by the time kaudit looked: the problem was
    blamed (KD503) for a disk that was full."""
    import errno

    from kaudit.dynamic import scratch

    scratch.start_budget(0)  # no --temp-limit: under one, a file-size failure is the limit's
    jobs = tmp_path / "writes.py"
    jobs.write_text(SHORT_WRITE_JOB)
    with run_job(Job(f"{jobs}:short_write", {"disk_full": disk_full}, timeout=60)) as result:
        assert result.status == ERROR
        assert result.errno == (errno.ENOSPC if disk_full else errno.EFBIG)
