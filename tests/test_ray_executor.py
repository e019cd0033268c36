"""`scan --dynamic --executor ray`: each kernel's audit as a Ray task on a local cluster (2 CPUs,
no dashboard), on CPU: the same findings as the local executor, results streamed back to the
driver as each task ends and cached there, a node without the kernel's files running the texts
the task carries, and clear messages without Ray or without a GPU for a CUDA run."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tests.conftest import DYNAMIC_FIXTURES

pytest.importorskip("torch", reason="the dynamic pass needs torch (kaudit[dynamic])")
ray = pytest.importorskip("ray", reason="--executor ray needs ray (kaudit[ray], in kaudit[test])")

import kaudit  # noqa: E402
from kaudit.cli import app  # noqa: E402
from kaudit.config import ConfigError  # noqa: E402
from kaudit.discover import WorkItem  # noqa: E402
from kaudit.dynamic.executors import RayExecutor, placed  # noqa: E402
from kaudit.dynamic.kernels import KernelTask  # noqa: E402

#: an honest Triton kernel (run by Triton's CPU interpreter) and one that zeroes its input
FIXTURES = ("good_gelu_triton", "bad_zeroes_input")
#: kernels whose audit starts no job: no problem (KD502), CUDA sources on a CPU run (KD500)
QUICK = ("bad_no_problem", "bad_needs_cuda")


@pytest.fixture(scope="module")
def cluster():
    """One small local cluster for the module; the executor joins it and leaves it running."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def copy_fixtures(folder, names) -> None:
    for name in names:
        shutil.copytree(DYNAMIC_FIXTURES / name, folder / name)


def dynamic_findings(report) -> list[tuple[str, str, str]]:
    return sorted((f.path, f.rule, f.fingerprint) for f in report.findings
                  if f.pass_ == "dynamic")


def test_ray_gives_the_findings_of_local_jobs_streamed_and_cached_by_the_driver(
        cluster, in_tmp):
    copy_fixtures(in_tmp, FIXTURES)
    reports, outcomes = {}, []
    for executor in ("local", "ray"):
        config = kaudit.Config().with_options(cache_dir=str(in_tmp / f"cache-{executor}"))
        reports[executor] = kaudit.scan_paths(
            ["."], config, dynamic=kaudit.DynamicOptions(
                device="cpu", timeout=240, executor=executor, extensions_dir=None),
            on_kernel=outcomes.append if executor == "ray" else None)
    local, remote = reports["local"], reports["ray"]
    assert dynamic_findings(remote) == dynamic_findings(local)
    assert {f.rule for f in remote.findings if f.path.startswith("bad_zeroes_input")} >= {"KD402"}
    assert [(v.path, v.verdict) for v in remote.verdicts] == \
        [(v.path, v.verdict) for v in local.verdicts]
    assert {v.path: v.verdict for v in remote.verdicts}["good_gelu_triton/kernel.py"] != "rejected"
    assert remote.summary["dynamic"]["statuses"] == local.summary["dynamic"]["statuses"]
    assert remote.warnings == local.warnings == []
    # each kernel handed back to the driver as its task ended, with its seconds on the node
    assert sorted(o.verdict.path for o in outcomes) == sorted(v.path for v in remote.verdicts)
    assert [o.done for o in outcomes] == [1, 2]
    assert all(o.seconds > 0 and not o.cached for o in outcomes)
    # the driver wrote the result cache: the next scan runs nothing
    again = kaudit.scan_paths(
        ["."], kaudit.Config().with_options(cache_dir=str(in_tmp / "cache-ray")),
        dynamic=kaudit.DynamicOptions(device="cpu", timeout=240, executor="ray",
                                      extensions_dir=None))
    assert again.summary["dynamic"]["cached"] == 2
    assert dynamic_findings(again) == dynamic_findings(remote)


def test_cli_joins_the_cluster_at_its_address_and_streams_each_kernel(cluster, in_tmp):
    copy_fixtures(in_tmp, QUICK)
    done = subprocess.run(
        ["kaudit", "scan", ".", "--dynamic", "--device", "cpu",
         "--no-cache", "--executor", "ray", "--ray-address", cluster, "--stream", "lines.jsonl",
         "-f", "json", "--fail-on", "never"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (in_tmp / "lines.jsonl").read_text().splitlines()]
    assert sorted((line["path"], line["status"]) for line in lines) == [
        ("bad_needs_cuda/kernel.py", "needs-cuda"), ("bad_no_problem/kernel.py", "no-problem")]
    rules = {f["path"]: f["rule"] for f in json.loads(done.stdout)["findings"]
             if f["rule"].startswith("KD")}
    assert rules == {"bad_needs_cuda/kernel.py": "KD500", "bad_no_problem/kernel.py": "KD502"}


def test_a_cuda_run_on_a_cluster_without_gpu_is_refused(cluster, in_tmp):
    with pytest.raises(ConfigError, match="the Ray cluster has no GPU"), \
            RayExecutor(kaudit.DynamicOptions(device="cuda", executor="ray")) as executor:
        executor.device()
    with RayExecutor(kaudit.DynamicOptions(executor="ray")) as executor:
        assert executor.device() == "cpu"  # auto: no GPU in the cluster


def test_without_ray_the_message_names_the_extra(in_tmp, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where it is absent
    copy_fixtures(in_tmp, ("bad_no_problem",))
    result = CliRunner().invoke(app, ["scan", ".", "--dynamic", "--executor", "ray"])
    assert result.exit_code == 2
    assert "pip install 'kaudit[ray]'" in result.output
    with pytest.raises(ConfigError, match=r"kaudit\[ray\]"):
        kaudit.scan_paths(["."], kaudit.Config(),
                          dynamic=kaudit.DynamicOptions(device="cpu", executor="ray"))


def test_a_node_without_the_files_runs_the_texts_the_task_carries(in_tmp):
    kernel = (DYNAMIC_FIXTURES / "bad_zeroes_input" / "kernel.py").read_text()
    problem = (DYNAMIC_FIXTURES / "bad_zeroes_input" / "problem.py").read_text()
    item = WorkItem("/elsewhere/run/kernel.py", "run/kernel.py", True)
    options = kaudit.DynamicOptions(problems_root="/elsewhere/problems")
    with placed(KernelTask(0, item, kernel, problem), options) as (here, here_options):
        assert here.display == "run/kernel.py" and here.file != item.file
        assert open(here.file).read() == kernel
        assert open(os.path.join(os.path.dirname(here.file), "problem.py")).read() == problem
        assert here_options.problems_root is None and here_options.problem is None
    assert not os.path.exists(here.file)  # removed after the audit
    # where the files are there as the driver read them, they run in place
    copy_fixtures(in_tmp, ("bad_zeroes_input",))
    local = WorkItem(str(in_tmp / "bad_zeroes_input" / "kernel.py"), "k.py", True)
    with placed(KernelTask(0, local, kernel, problem), options) as (here, _):
        assert here is local
    # a kernel loading other files next to it cannot stand on its text alone: not audited
    loads = kernel + '\nSOURCES = ["kernel.cu"]\n'
    with pytest.raises(FileNotFoundError, match="same path on every node"), \
            placed(KernelTask(0, item, loads, problem), options):
        pass
