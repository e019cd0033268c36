"""A kernel's extensions compiled before its first job on a GPU, holding no share of it.

A candidate job that compiled its `load_inline` extensions did so inside the job, for about a
minute of CPU on the H200's host, holding its share of the GPU and the GPU's shared lock: a job
that needs the GPU alone (a timing job) waited behind every compile. So on CUDA, a kernel whose
text may compile an extension and whose build folder holds nothing yet is first imported, and
its `ModelNew` made on the meta device, in a build job (`harness/build_job.py`) with no GPU
visible: its extensions compile into its build folder, and the candidate job finds them built.

The build job decides nothing: whatever it ends in, the candidate job runs as before, and
compiles what is not built (a kernel that builds only when it sees a GPU, a GPU whose compute
capability nvidia-smi does not tell). A build that failed fails again at once in the candidate
job (`harness/failed_builds.py`), with the same message.
"""

from __future__ import annotations

import os
import re
from typing import Any

from kaudit.dynamic import gpu_share
from kaudit.dynamic.runner import Job, run_job

BUILD_TARGET = "build_job:run"


def compiles_extension(text: str) -> bool:
    """Whether the kernel's text may compile an extension when it runs."""
    return bool(re.search(r"\bload_inline\b|\bcpp_extension\b", text))


def built_before(build: str) -> bool:
    """Whether a job of this kernel text already compiled in its build folder."""
    folder = os.path.join(build, "torch")
    return os.path.isdir(folder) and any(files for _, _, files in os.walk(folder))


def build_ahead(text: str, kernel: str, problem: str, build: str, env: dict[str, str], *,
                gpu: gpu_share.GpuClaim | None, **job: Any) -> None:
    """Compile kernel `text`'s extensions into `build` on no GPU, when its jobs will run on
    `gpu` and there is something to build; `problem`: the reference problem (its init inputs);
    `job`: the other `Job` fields (timeout, limits, visible, writable, disk)."""
    if gpu is None or not compiles_extension(text) or built_before(build):
        return
    capability = gpu_share.compute_capability(gpu.device)
    if capability is None:
        return
    args = {"kernel": kernel, "problem": problem, "build_dir": build,
            "arch_list": f"{capability}+PTX"}
    with run_job(Job(BUILD_TARGET, args, env=env, no_gpu=True, **job)):
        pass  # what it built is in the build folder; its failure is the candidate job's
