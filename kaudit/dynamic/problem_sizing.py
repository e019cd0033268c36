"""Problems sized before they run. One CPU job (`harness/problem_sizes.py`) measures, on torch's
meta device, the bytes of each problem's parameters, inputs and outputs, in seconds and without
memory or a GPU. `kaudit problems` asks each problem's GPU share from them (`problems.gpu_needs`);
`scan --dynamic` reserves the temporary disk a kernel's reference job will write
(`reference_writes`) before that job starts, instead of learning it when the disk is full."""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from kaudit.dynamic.runner import Job, run_job

SIZES_TARGET = "problem_sizes:size_problems"


@dataclass(frozen=True)
class ProblemSize:
    """Bytes of a problem's parameters (and buffers), of one call's inputs and of its outputs,
    with the outputs' element count; outputs None when only forward failed on the meta device."""

    params: int
    inputs: int
    outputs: int | None = None
    output_elements: int | None = None


def size_problems(paths: list[str], init_seed: int, timeout: float = 120.0
                  ) -> dict[str, ProblemSize]:
    """The sizes of the problem files `paths` (absolute), from one job on the CPU; a problem it
    could not size, and every problem when the job fails, is left out."""
    if not paths:
        return {}
    job = Job(SIZES_TARGET, {"paths": paths, "init_seed": init_seed}, timeout=timeout,
              env={"CUDA_VISIBLE_DEVICES": ""},
              visible=tuple(sorted({os.path.dirname(path) for path in paths})))
    try:
        with run_job(job) as result:
            found = (result.value or {}).get("sizes") if result.ok else None
    except OSError:  # its folder could not be made (a full disk): nothing is sized
        return {}
    sizes = {}
    for path, size in (found.items() if isinstance(found, dict) else ()):
        if path not in paths or not isinstance(size, dict):
            continue  # the job ran problem code: only what was asked, and numbers, are read
        params, inputs, outputs, elements = (
            value if isinstance(value, int) and not isinstance(value, bool) and value >= 0
            else None for value in (size.get(key) for key in (
                "params", "inputs", "outputs", "output_elements")))
        if params is not None and inputs is not None:
            sizes[path] = ProblemSize(params, inputs, outputs,
                                      elements if outputs is not None else None)
    return sizes


def reference_writes(size: ProblemSize, scales: int) -> int:
    """What a kernel's reference job writes (`harness/kernel_job.run_reference`): two sets of
    inputs, the model's state, two outputs and, for each of the `scales` input scales other than
    1, an output and its float64 twin; 0 (unknown) when the outputs could not be sized."""
    if size.outputs is None or size.output_elements is None:
        return 0
    float64 = 8 * size.output_elements
    return 2 * size.inputs + size.params + (2 + scales) * size.outputs + scales * float64


class SizeMemo:
    """Sizes by problem text and init seed: a results tree repeats problems (KernelBench runs
    hold many samples of one task; CUDA-L1 records carry their problem's text), each sized once
    by the process; at most MAX_MEMO texts are kept."""

    MAX_MEMO = 4096

    def __init__(self) -> None:
        self._sizes: dict[tuple[str, int], ProblemSize | None] = {}
        self._locks: dict[tuple[str, int], threading.Lock] = {}
        self._lock = threading.Lock()

    def size(self, path: str, init_seed: int) -> ProblemSize | None:
        try:
            key = (hashlib.sha256(Path(path).read_bytes()).hexdigest(), init_seed)
        except OSError:
            return None
        with self._lock:
            if len(self._locks) > self.MAX_MEMO:
                self._sizes.clear()
                self._locks.clear()
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one sizing job per text; the other audits of it wait for its answer
            if key not in self._sizes:
                path = os.path.abspath(path)
                self._sizes[key] = size_problems([path], init_seed).get(path)
            return self._sizes[key]


#: the process's sizes (`scan --dynamic`)
sizes = SizeMemo()
