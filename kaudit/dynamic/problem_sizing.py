"""Problems sized before they run. One CPU job (`harness/problem_sizes.py`) measures, on torch's
meta device, the bytes of each problem's parameters, inputs and outputs, in seconds and without
memory or a GPU. `kaudit problems` asks each problem's GPU share from them (`gpu_need`), and so
do the jobs of a kernel's audit (`kernels.size_claim`); `scan --dynamic` also reserves the
temporary disk a kernel's audit will write (`audit_writes`) before its first job starts, instead
of learning it when the disk is full."""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kaudit.dynamic.harness.problem_sizes import SIZES_FILE
from kaudit.dynamic.runner import Gate, Job, RunResult, run_job

SIZES_TARGET = "problem_sizes:size_problems"
#: sizing jobs side by side at most (`sizing_jobs`)
MAX_SIZING_JOBS = 4
#: what `torch.save` adds to a file besides its tensors' bytes (about 1.5 kB measured), rounded up
SAVE_OVERHEAD = 4096
#: a job's GPU memory beyond the problem's peak (`job_peak`): PEAK_MARGIN times it for the caching
#: allocator, and FIXED_BYTES for what no size shows (cuBLAS and cuDNN workspaces)
PEAK_MARGIN, FIXED_BYTES = 1.25, 1 << 30


@dataclass(frozen=True)
class ProblemSize:
    """Bytes of a problem's parameters (and buffers), of one call's inputs and of its outputs;
    of the outputs' float64 twins, of its tensor init inputs, and whether its forward changes
    its inputs. `outputs` and `twins` are None when only forward failed on the meta device.
    `forward`: the most bytes forward's tensors hold at once (the outputs included); the
    float64 run's (`problem_job`) model, inputs and `forward64` likewise, None when that run
    could not be sized."""

    params: int
    inputs: int
    outputs: int | None = None
    twins: int | None = None
    init: int = 0
    inputs_changed: bool = False
    #: forward's floating-point operations as torch counts them (None: unknown)
    flops: int | None = None
    forward: int | None = None
    params64: int | None = None
    inputs64: int | None = None
    forward64: int | None = None


def size_problems(paths: list[str], init_seed: int, timeout: float = 120.0,
                  gate: Gate | None = None, jobs: int = 1) -> dict[str, ProblemSize | None]:
    """The sizes of the problem files `paths` (absolute), from `jobs` jobs on the CPU side by
    side, each sizing every `jobs`-th problem: None for a problem a job could not size; a
    problem is missing when its job failed before it (one that hangs or crashes a job keeps the
    sizes of those before it). With a `gate`, the jobs start at once and make the meta device
    ready, and size once the gate is entered."""
    chunks = [paths[start::jobs] for start in range(max(1, min(jobs, len(paths))))]
    if len(chunks) == 1:
        return _size_chunk(paths, init_seed, timeout, gate) if paths else {}
    with ThreadPoolExecutor(len(chunks), thread_name_prefix="sizing") as pool:
        found = pool.map(lambda chunk: _size_chunk(chunk, init_seed, timeout, gate), chunks)
        return {path: size for sizes in found for path, size in sizes.items()}


def sizing_jobs(problems: int) -> int:
    """How many sizing jobs share `problems`: one job took 1.2-3.5 s after its go for
    KernelBench level 1's 100 on the H200's host, before the first problem could start; one
    job per dozen problems and per four cores, at most four (two cores: one job)."""
    return max(1, min(MAX_SIZING_JOBS, problems // 12, (os.cpu_count() or 1) // 4))


def _size_chunk(paths: list[str], init_seed: int, timeout: float,
                gate: Gate | None) -> dict[str, ProblemSize | None]:
    job = Job(SIZES_TARGET, {"paths": paths, "init_seed": init_seed}, timeout=timeout,
              no_gpu=True,
              visible=tuple(sorted({os.path.dirname(path) for path in paths})),
              gated=gate is not None)
    try:
        with run_job(job, gate) as result:
            answer = result.value if result.ok else _sizes_so_far(result)
            found = answer.get("sizes") if isinstance(answer, dict) else None
    except OSError:  # its folder could not be made (a full disk): nothing is sized
        return {}
    sizes: dict[str, ProblemSize | None] = {}
    for path, size in (found.items() if isinstance(found, dict) else ()):
        if path not in paths:
            continue  # the job ran problem code: only what was asked, and numbers, are read
        number = {key: non_negative_int(size.get(key) if isinstance(size, dict) else None)
                  for key in ("params", "inputs", "outputs", "twins", "init", "flops",
                              "forward", "params64", "inputs64", "forward64")}
        if number["params"] is None or number["inputs"] is None:
            sizes[path] = None
            continue
        known = number["outputs"] is not None and number["twins"] is not None
        float64 = all(number[key] is not None for key in ("params64", "inputs64", "forward64"))
        sizes[path] = ProblemSize(number["params"], number["inputs"],
                                  number["outputs"] if known else None,
                                  number["twins"] if known else None, number["init"] or 0,
                                  size.get("inputs_changed") is True,
                                  number["flops"] if known else None,
                                  number["forward"] if known else None,
                                  *((number["params64"], number["inputs64"], number["forward64"])
                                    if known and float64 else (None, None, None)))
    return sizes


def _sizes_so_far(result: RunResult) -> object:
    """What a sizing job that failed wrote before (`harness/problem_sizes.SIZES_FILE`)."""
    try:
        return result.read_json(SIZES_FILE)
    except (OSError, ValueError):
        return None


def non_negative_int(value: object) -> int | None:
    """`value` if it is a non-negative integer (not a bool), else None: numbers a job that ran
    benchmark code reported."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def reference_writes(size: ProblemSize, scales: int) -> int:
    """What a kernel's reference job writes (`harness/kernel_job.run_reference`): two sets of
    inputs (twice, when its forward changes them), the model's state and init inputs, two
    outputs and, for each of the `scales` input scales other than 1, the output's float64 twin
    (`harness.scaling.twin`); 0 (unknown) when the outputs could not be sized."""
    if size.outputs is None or size.twins is None:
        return 0
    input_files = 4 if size.inputs_changed else 2
    files = input_files + 1 + 2 + scales
    return (input_files * size.inputs + size.params + size.init + 2 * size.outputs
            + scales * size.twins + files * SAVE_OVERHEAD)


#: a kernel's job writes up to this many outputs (the candidate's poisoned, fresh, repeated and
#: scaled calls, and those of its own initialisation; the plain run's calls)
JOB_WRITES = 12


def audit_writes(size: ProblemSize, scales: int) -> int:
    """What a kernel's audit holds on the temporary disk at most: its reference job's files
    (`reference_writes`), then the inputs and state its kernel's jobs share with one job's
    JOB_WRITES outputs; 0 (unknown) when the outputs could not be sized."""
    reference = reference_writes(size, scales)
    if not reference:
        return 0
    input_files = 4 if size.inputs_changed else 2
    shared = input_files * size.inputs + size.params + size.init
    return max(reference, shared + JOB_WRITES * (size.outputs or 0))


def job_peak(size: ProblemSize) -> int:
    """The most a problem's job holds at once on the GPU, from its sizes (`harness/problem_job`):
    in the native runs the model, the inputs and a scaled copy of them, or the inputs and what
    forward makes; in the float64 runs, which come last (the native model gone), the float64
    model and inputs beside one native input being cast, or beside what forward makes in
    float64. On KernelBench level 1 on the H200 this was what the job's caching allocator held
    at most, within 2 %, for 59 of the 100 problems, and less for none; the other 41 held
    workspaces beside it (0.2 GiB or less for most, 2 GiB for transposed convolutions) or, like
    HuberLoss (8 GiB), temporaries made inside one operator, which no size shows."""
    made = size.forward if size.forward is not None else size.inputs
    native = size.params + size.inputs + max(size.inputs, made)
    if size.forward64 is None or size.params64 is None or size.inputs64 is None:
        return native
    return max(native, size.params64 + size.inputs64 + max(size.inputs, size.forward64))


def candidate_peak(size: ProblemSize, scales: int) -> int:
    """The most a kernel's candidate job (`harness/kernel_job.run_candidate`) holds at once on
    the GPU: the plain model; every input set on the device (A, B and each of `scales` scaled
    sets, kept to see them changed, beside the first call's inputs and the call's own); the
    outputs of the first call and, in a poisoned run, their copy before the synchronise; the
    free blocks left to poison; and the poisoned run's model with everything its forward
    allocates, kept alive as guarded blocks up to the poisoner's budget. Its jobs all ask the
    most of the audit's (`audit_gpu_need`): four of 14 warm audits on the H200 ran out at the
    problem job's need and ran again (`job_seconds.gpu_retry`, 14-31 s each)."""
    from kaudit.dynamic.harness.poison import GUARD_BUDGET_BYTES, WARM_CACHE_BYTES

    made = size.forward if size.forward is not None else size.inputs
    outputs = size.outputs if size.outputs is not None else made
    poisoned = max(size.params + made, GUARD_BUDGET_BYTES)
    return size.params + (4 + scales) * size.inputs + 2 * outputs + WARM_CACHE_BYTES + poisoned


def share_of(peak: int, total: int) -> float:
    """The share of a GPU of `total` bytes that a job holding `peak` bytes at most asks first
    (`gpu_share.GpuClaim.need`): the peak with the margins above."""
    return (PEAK_MARGIN * peak + FIXED_BYTES) / total


def gpu_need(size: ProblemSize, total: int) -> float:
    """What a job of this problem (`kaudit problems`) asks first."""
    return share_of(job_peak(size), total)


def audit_gpu_need(size: ProblemSize, scales: int, total: int) -> float:
    """What the jobs of a kernel's audit (`scan --dynamic`) ask first: the most of its
    reference's and its candidate's."""
    return share_of(max(job_peak(size), candidate_peak(size, scales)), total)


class SizeMemo:
    """Sizes by problem text and init seed: a results tree repeats problems (KernelBench runs
    hold many samples of one task; CUDA-L1 records carry their problem's text), each sized once
    by the process (a sizing job that failed is tried again); at most MAX_MEMO texts are kept."""

    MAX_MEMO = 4096

    def __init__(self) -> None:
        self._sizes: dict[tuple[str, int], ProblemSize | None] = {}
        self._locks: dict[tuple[str, int], threading.Lock] = {}
        self._lock = threading.Lock()

    def size_all(self, paths: list[str], init_seed: int) -> dict[str, ProblemSize | None]:
        """The sizes of `paths` by path (None: unknown), those not known yet sized at once
        (`size_problems` in `sizing_jobs` jobs side by side), not one job per problem as audits
        reach them; a problem the jobs did not size is sized again when an audit asks."""
        keys = {path: self._key(path, init_seed) for path in dict.fromkeys(paths)}
        with self._lock:
            missing = {key: os.path.abspath(path) for path, key in keys.items()
                       if key is not None and key not in self._sizes}
        unknown = list(dict.fromkeys(missing.values()))
        found = size_problems(unknown, init_seed, jobs=sizing_jobs(len(unknown))) \
            if unknown else {}
        with self._lock:
            self._bound()
            self._sizes.update((key, found[path]) for key, path in missing.items()
                               if path in found)
            return {path: self._sizes.get(key) if key is not None else None
                    for path, key in keys.items()}

    def size(self, path: str, init_seed: int) -> ProblemSize | None:
        key = self._key(path, init_seed)
        if key is None:
            return None
        with self._lock:
            self._bound()
            lock = self._locks.setdefault(key, threading.Lock())
            if key in self._sizes:
                return self._sizes[key]
        with lock:  # one sizing job per text; the other audits of it wait for its answer
            with self._lock:
                if key in self._sizes:
                    return self._sizes[key]
            path = os.path.abspath(path)
            found = size_problems([path], init_seed)
            with self._lock:
                if path in found:
                    self._sizes[key] = found[path]
            return found.get(path)

    def _bound(self) -> None:
        """At most MAX_MEMO texts, however they were sized (called holding `_lock`)."""
        if max(len(self._sizes), len(self._locks)) > self.MAX_MEMO:
            self._sizes.clear()
            self._locks.clear()

    @staticmethod
    def _key(path: str, init_seed: int) -> tuple[str, int] | None:
        try:
            return hashlib.sha256(Path(path).read_bytes()).hexdigest(), init_seed
        except OSError:
            return None


#: the process's sizes (`scan --dynamic`)
sizes = SizeMemo()
