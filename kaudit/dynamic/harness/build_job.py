"""A kernel's extensions built ahead of its jobs on the GPU, with no GPU visible: the kernel file
is imported, as the jobs after it import it, and `ModelNew` is made on the meta device (a kernel
may call `load_inline` in its constructor), so that its extensions compile into the kernel's
build folder while no share of the GPU is held. The candidate job that follows finds them built
(ninja sees the same sources and flags) and only loads them.

No GPU is visible (`runner.Job.no_gpu`: `CUDA_VISIBLE_DEVICES` is empty and, in the sandbox,
/dev has no GPU device, so a process it starts sees none either), so kernel code run here cannot
touch the GPU that other jobs share or time. torch picks its arch flags from the visible GPUs; with none,
`TORCH_CUDA_ARCH_LIST` names the one the jobs will see (`arch_list`), as torch would derive it
there, so that the flags and the build are the same.

Arguments: `kernel`, `problem` (its `get_init_inputs`), `build_dir`, `arch_list`.
"""

import os
from typing import Any

from .child import import_file
from .kernel_job import use_build_folder


def run(args: dict, out_dir: str) -> dict[str, Any]:
    use_build_folder(args, out_dir)
    if args.get("arch_list") and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        os.environ["TORCH_CUDA_ARCH_LIST"] = str(args["arch_list"])
    import torch

    kernel = import_file("kernel", args["kernel"])
    try:  # a kernel that builds in ModelNew's constructor: built on the meta device, no weights
        problem = import_file("problem", args["problem"])
        init_inputs = problem.get_init_inputs()
        with torch.device("meta"):
            kernel.ModelNew(*init_inputs)
    except Exception as exc:  # noqa: BLE001 - what it built is built; the jobs report the rest
        return {"constructed": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
    return {"constructed": True}

