"""Extensions compiled before a kernel's first job on a GPU, with no GPU visible
(`kaudit.dynamic.prebuild`)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kaudit.dynamic import gpu_share, prebuild
from kaudit.dynamic.gpu_share import GpuClaim

pytest.importorskip("torch", reason="the build job imports torch")

#: a kernel whose import records what it saw where torch builds extensions (`load_inline` is
#: only named: it is what makes a kernel's text one that may compile)
RECORDING_KERNEL = '''
import json, os
from torch.utils.cpp_extension import load_inline  # noqa: F401
folder = os.environ["TORCH_EXTENSIONS_DIR"]
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "imports.jsonl"), "a") as handle:
    handle.write(json.dumps({name: os.environ.get(name) for name in
                             ("CUDA_VISIBLE_DEVICES", "TORCH_CUDA_ARCH_LIST")}) + "\\n")
'''


#: a kernel that builds in its constructor (as many real ones call `load_inline`), its layer's
#: weights as large as its init inputs say
BUILDS_WHEN_MADE = '''import os
import torch
from torch.utils.cpp_extension import load_inline  # noqa: F401


class ModelNew(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)
        folder = os.environ["TORCH_EXTENSIONS_DIR"]
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "made.txt"), "w") as handle:
            handle.write(f"{self.linear.weight.device} {features}")
'''
PROBLEM = "def get_init_inputs():\n    return [1 << 16]\n"


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    monkeypatch.setattr(gpu_share, "compute_capability", lambda device: "9.0")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    path, build = tmp_path / "kernel.py", tmp_path / "build"
    path.write_text(RECORDING_KERNEL)
    (tmp_path / "problem.py").write_text(PROBLEM)
    build.mkdir()
    return path, build


def _ahead(path: Path, build: Path, gpu: GpuClaim | None = GpuClaim("0", 0.1)) -> list[dict]:
    prebuild.build_ahead(path.read_text(), str(path), str(path.parent / "problem.py"), str(build),
                         {}, gpu=gpu, timeout=120, visible=(str(path.parent),),
                         writable=(str(build),))
    record = build / "torch" / "imports.jsonl"
    return [json.loads(line) for line in record.read_text().splitlines()] \
        if record.exists() else []


def test_a_kernel_is_built_once_with_no_gpu_visible_and_the_gpus_arch(kernel):
    """Its jobs on the GPU see one; torch derives the same flags from TORCH_CUDA_ARCH_LIST."""
    path, build = kernel
    assert _ahead(path, build) == [{"CUDA_VISIBLE_DEVICES": "", "TORCH_CUDA_ARCH_LIST": "9.0+PTX"}]
    assert len(_ahead(path, build)) == 1, "a folder a job compiled in is not built again"


def test_a_kernel_that_builds_in_its_constructor_is_made_on_the_meta_device(kernel):
    """Its weights (here 16 GiB of them) are never made."""
    path, build = kernel
    path.write_text(BUILDS_WHEN_MADE)
    _ahead(path, build)
    assert (build / "torch" / "made.txt").read_text() == f"meta {1 << 16}"


def test_the_users_arch_list_is_kept(kernel, monkeypatch):
    """The user's list reaches every job of the kernel, so the build job builds what they build."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    path, build = kernel
    assert _ahead(path, build)[0]["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0"


def test_nothing_is_built_ahead_without_a_gpu_a_known_arch_or_an_extension(kernel, monkeypatch):
    path, build = kernel
    assert _ahead(path, build, gpu=None) == [], "on the CPU no share of a GPU is held"
    path.write_text(RECORDING_KERNEL.replace("load_inline", "cpu_count"))
    assert _ahead(path, build) == [], "a kernel that compiles nothing"
    path.write_text(RECORDING_KERNEL)
    monkeypatch.setattr(gpu_share, "compute_capability", lambda device: None)
    assert _ahead(path, build) == [], "flags other than the jobs' would build it twice"


def test_a_failed_import_leaves_the_kernels_jobs_to_report_it(kernel):
    path, build = kernel
    path.write_text(RECORDING_KERNEL + "raise RuntimeError('needs a GPU at import')\n")
    assert len(_ahead(path, build)) == 1  # ran, failed, and raised nothing here


def test_the_compute_capability_comes_from_nvidia_smi(tmp_path, monkeypatch):
    tool = tmp_path / "nvidia-smi"
    tool.write_text('#!/bin/sh\ncase "$1" in --id=0) echo " 9.0";; --id=1) echo "[N/A]";;'
                    ' *) exit 6;; esac\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    gpu_share.compute_capability.cache_clear()
    try:
        assert gpu_share.compute_capability("0") == "9.0"
        assert gpu_share.compute_capability("1") is None, "what is not a capability"
        assert gpu_share.compute_capability("MIG-x") is None, "nvidia-smi refused the id"
    finally:
        gpu_share.compute_capability.cache_clear()
