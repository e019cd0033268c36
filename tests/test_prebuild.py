"""Extensions compiled ahead of their audits (`kaudit.dynamic.prebuild`): each kernel text built
once, by a build job or by its audit, whichever takes its folder first; none when the build cache
holds it; a build that fails only leaves the audit to build and report."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from kaudit.dynamic.builds import BuildCache

PROBLEM = '''
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(64, 64)]

def get_init_inputs():
    return []
'''

#: a stand-in for `load_inline` (named here, so kaudit counts the kernel as one that compiles):
#: each import notes whether it found the "extension" built, and builds it when not
KERNEL = '''
import os
import torch

# {name}: built like torch.utils.cpp_extension.load_inline would, in TORCH_EXTENSIONS_DIR
_folder = os.environ["TORCH_EXTENSIONS_DIR"]
_built = os.path.join(_folder, "ext.so")
with open(os.path.join(_folder, "imports.log"), "a") as log:
    log.write(("found" if os.path.exists(_built) else "built") + "\\n")
open(_built, "w").write("{name}")
{fail}

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
'''


def _tasks(tmp_path: Path, names: list[str], fail: str = "") -> list:
    from kaudit.discover import WorkItem
    from kaudit.dynamic.kernels import KernelTask

    tasks = []
    for index, name in enumerate(names):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "problem.py").write_text(PROBLEM)
        text = KERNEL.format(name=name, fail=fail)
        (folder / "kernel.py").write_text(text)
        item = WorkItem(str(folder / "kernel.py"), f"{name}/kernel.py", True)
        tasks.append(KernelTask(index, item, text, PROBLEM))
    return tasks


def _imports(cache: Path, task) -> list[str]:
    log = cache / BuildCache.key(task.text) / "torch" / "imports.log"
    return log.read_text().split() if log.exists() else []


@pytest.fixture
def dynamic():
    pytest.importorskip("torch", reason="the dynamic pass needs torch")
    from kaudit.dynamic.options import DynamicOptions, TimingSettings

    return DynamicOptions(device="cpu", timeout=240, jobs=2, timing=TimingSettings("off"))


def test_build_jobs_build_each_kernel_once_and_not_again_from_a_warm_cache(tmp_path, dynamic):
    from kaudit.dynamic.prebuild import Prebuilds

    dynamic = dataclasses.replace(dynamic, extensions_dir=None)
    cache = tmp_path / "builds"
    tasks = _tasks(tmp_path, ["one", "two"])
    prebuilds = Prebuilds(BuildCache(str(cache)), dynamic, "cpu", None)
    prebuilds.start(tasks)
    for future in prebuilds._futures:  # close() would cancel those not started
        future.result()
    prebuilds.close()
    assert [_imports(cache, task) for task in tasks] == [["built"], ["built"]]
    assert sorted(prebuilds.seconds) == [0, 1]

    warm = Prebuilds(BuildCache(str(cache)), dynamic, "cpu", None)
    warm.start(tasks)
    warm.close()
    assert warm.seconds == {}, "a folder built before runs no build job"
    assert [_imports(cache, task) for task in tasks] == [["built"], ["built"]]


def test_a_folder_in_use_or_built_is_not_handed_to_a_build():
    cache = BuildCache()
    try:
        held, release = threading.Event(), threading.Event()

        def job() -> None:
            with cache.use("kernel A"):
                held.set()
                release.wait(10)

        worker = threading.Thread(target=job)
        worker.start()
        held.wait(10)
        with cache.unbuilt("kernel A") as folder:
            assert folder is None, "a job holds the folder"
        release.set()
        worker.join(10)
        with cache.unbuilt("kernel A") as folder:
            assert folder is None, "a job built into it"
        with cache.unbuilt("kernel B") as folder:
            assert folder is not None
            Path(folder, "ext.so").write_text("x")
        with cache.use("kernel B") as folder:
            assert Path(folder, "ext.so").exists() and cache.discarded == []
    finally:
        cache.close()


def test_a_scan_builds_ahead_and_audits_as_before(tmp_path, dynamic):
    """The audits run beside the build jobs: each kernel is built once (by its build job, or by
    its audit when that came first), and each audit ends as without them."""
    from kaudit.dynamic.executors import LocalExecutor

    cache = tmp_path / "builds"
    options = dataclasses.replace(dynamic, extensions_dir=str(cache))
    tasks = _tasks(tmp_path, ["one", "two", "three"])
    runs = {}
    LocalExecutor(options).audit(tasks, "cpu",
                                 lambda task, run, seconds: runs.__setitem__(task.index, run))
    for task in tasks:
        run = runs[task.index]
        assert run.status == "ok" and not [f for f in run.findings if f.level == "error"], \
            run.findings
        imports = _imports(cache, task)
        assert imports[0] == "built" and set(imports[1:]) == {"found"}, imports
    assert "prebuild" in runs[0].metrics["job_seconds"], \
        "the first kernel's build job takes its folder before its audit's reference job ends"


def test_a_build_that_fails_leaves_the_audit_to_report_it(tmp_path, dynamic):
    from kaudit.dynamic.executors import LocalExecutor

    options = dataclasses.replace(dynamic, extensions_dir=str(tmp_path / "b"))
    tasks = _tasks(tmp_path, ["one", "two"], fail='raise RuntimeError("error building extension")')
    runs = {}
    LocalExecutor(options).audit(tasks, "cpu",
                                 lambda task, run, seconds: runs.__setitem__(task.index, run))
    for task in tasks:
        run = runs[task.index]
        assert [f.rule for f in run.findings] == ["KD501"], run.findings
        assert "error building extension" in run.findings[0].message
