"""`kaudit scan --dynamic`: run each kernel against its reference problem and measure.

For every kernel file the static scan read, this module (in the kaudit process):
1. pairs it with a reference problem (`pair_problem`): `--problem FILE`; the reference a results
   tree already names (`Submission.reference`); a sibling `problem.py`, `ref_code.py` or
   `reference.py`; KernelBench names `level_<L>_problem_<P>_...` (or `level_<L>/problem_<P>.py`)
   looked up as `ROOT/level<L>/<P>_*.py` under `--problems ROOT`. None: a KD502 note;
2. decides, before anything is compiled, whether the kernel needs CUDA (`cuda_reason`); on a
   machine without CUDA such a kernel gets a KD500 note;
3. runs the reference problem in one child job (`kernel_job.run_reference`) and the candidate in
   another (`kernel_job.run_candidate`), which receives copies of the inputs and never the
   reference outputs; both hand back tensors loaded here with `weights_only=True`;
4. judges here: write coverage (KD101/KD102) from the poisoned runs' bit patterns, correctness
   (KD201/KD202) against the reference with the preset and a scale-invariant check, stale output
   (KD401), input mutation (KD402); failures are KD501 (candidate) or KD503 (reference).

Findings point at `ModelNew.forward` in the kernel file and carry `pass_ = "dynamic"`.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kaudit.discover import WorkItem, display_path
from kaudit.dynamic.kernel_job import DEFERRED_WAIT
from kaudit.dynamic.runner import Job, OutputError, RunResult, run_job
from kaudit.dynamic.tolerance import Tolerance
from kaudit.findings import Finding, Location
from kaudit.rule import rule_by_code

REFERENCE_TARGET = "kaudit.dynamic.kernel_job:run_reference"
CANDIDATE_TARGET = "kaudit.dynamic.kernel_job:run_candidate"
SIBLING_PROBLEMS = ("problem.py", "ref_code.py", "reference.py")
INIT_SEED = 42
INPUT_SEEDS = (0, 1)
DEFAULT_SCALES = (1e-3, 1.0, 1e3)
#: share of a GPU's memory the jobs on it may take together (caching allocator cap)
GPU_MEMORY_SHARE = 0.9
#: KD103 findings per kernel at most (one per allocation)
MAX_OOB = 5
#: scale-invariant thresholds by output dtype: (relative L2 error, max error / max |reference|)
SCALE_FREE = {"float64": (1e-6, 1e-5), "float32": (1e-3, 1e-2), "float16": (1e-2, 5e-2),
              "bfloat16": (5e-2, 1e-1)}
SCALE_FREE_DEFAULT = (1e-3, 1e-2)
_KB_FILE = re.compile(r"level_?(\d+)_problem_?(\d+)(?:_|\.py$)")
_KB_FOLDER = re.compile(r"level_?(\d+)$")
_KB_PROBLEM = re.compile(r"problem_?(\d+)\.py$")


@dataclass(frozen=True)
class DynamicOptions:
    tolerance: Tolerance
    #: "auto", "cpu" or "cuda"
    device: str = "auto"
    problem: str | None = None
    problems_root: str | None = None
    timeout: float = 300.0
    init_seed: int = INIT_SEED
    seeds: tuple[int, int] = INPUT_SEEDS
    #: a cache of extension builds, one folder per kernel text (content-addressed); None: each
    #: candidate job builds in its own temporary folder
    extensions_dir: str | None = None
    #: input scales of the scale-fragility probe (KD301); 1 is the default scale
    scales: tuple[float, ...] = DEFAULT_SCALES
    #: kernels audited at once (spread over the visible GPUs on CUDA)
    jobs: int = 1
    #: where pictures of unwritten / out-of-bounds output regions go (KD101, KD103); None: none
    artifacts_dir: str | None = None


@dataclass
class KernelRun:
    path: str
    problem: str | None = None
    status: str = "not-run"
    findings: list[Finding] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)


# -- pairing and CUDA ------------------------------------------------------------------------


def pair_problem(file: str, reference: str | None, options: DynamicOptions,
                 level: int | None = None, number: int | None = None) -> str | None:
    """The reference problem for kernel `file`, in the documented order, or None."""
    if options.problem:
        return options.problem
    if reference and "#L" not in reference and os.path.isfile(reference):
        return reference
    folder = Path(file).parent
    for name in SIBLING_PROBLEMS:
        sibling = folder / name
        if sibling.is_file() and sibling.resolve() != Path(file).resolve():
            return str(sibling)
    if options.problems_root:
        match = _KB_FILE.search(Path(file).name)
        if match:
            level, number = int(match.group(1)), int(match.group(2))
        elif _KB_FOLDER.search(folder.name) and _KB_PROBLEM.search(Path(file).name):
            level = int(_KB_FOLDER.search(folder.name).group(1))
            number = int(_KB_PROBLEM.search(Path(file).name).group(1))
        if level is not None and number is not None:
            root = Path(options.problems_root)
            for folder_name in (f"level{level}", f"level_{level}"):
                found = sorted((root / folder_name).glob(f"{number}_*.py"))
                if found:
                    return str(found[0])
    return None


_CUDA_SOURCES = re.compile(r"\bcuda_sources\s*=")
_CU_FILE = re.compile(r"""['"][^'"\n]+\.cu['"]""")
_TRITON = re.compile(r"^\s*(?:import\s+triton\b|from\s+triton\b)", re.MULTILINE)


def cuda_reason(text: str, triton_interpreter: bool | None = None) -> str | None:
    """Why the kernel cannot run without CUDA (decided from the text, before any compile).
    Triton kernels run on the CPU under Triton's interpreter (`TRITON_INTERPRET=1`, set for the
    candidate child) when Triton is installed."""
    if _CUDA_SOURCES.search(text):
        return "load_inline with cuda_sources"
    if re.search(r"\bload\s*\(", text) and _CU_FILE.search(text):
        return "cpp_extension.load of .cu sources"
    if _TRITON.search(text):
        if triton_interpreter is None:
            triton_interpreter = triton_installed()
        if not triton_interpreter:
            return "Triton kernels (install triton to run them on the CPU with its interpreter)"
    return None


def uses_triton(text: str) -> bool:
    return bool(_TRITON.search(text))


def triton_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def forward_location(path: str, text: str) -> Location:
    """`def forward` of `class ModelNew` (the class line, else line 1)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return Location(path, 1, 1, 1, 1)
    lines = text.splitlines()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            target: ast.AST = node
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                        and item.name == "forward":
                    target = item
            line = target.lineno
            width = len(lines[line - 1]) if 0 < line <= len(lines) else 0
            return Location(path, line, 1, line, width + 1)
    return Location(path, 1, 1, 1, 1)


# -- running ---------------------------------------------------------------------------------


def audit_items(items: Iterable[WorkItem], options: DynamicOptions, device: str,
                on_kernel: Callable[[int, int], None] | None = None) -> list[KernelRun]:
    """Run every kernel among `items`, `options.jobs` at a time (on CUDA spread over the visible
    GPUs). A kernel held in a JSONL record runs from a temporary `kernel.py`, next to its record's
    `ref_code` as `problem.py` when it has one. Runs come back in the order of `items`."""
    work = []
    for item in items:
        try:
            text = item.text if item.text is not None else \
                Path(item.file).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "ModelNew" in text:
            work.append((item, text))
    slots = GpuSlots(options.jobs) if device == "cuda" else None
    done = [0]
    lock = threading.Lock()

    def one(entry: tuple[WorkItem, str]) -> KernelRun:
        item, text = entry
        submission = item.submission
        with contextlib.ExitStack() as stack:
            file = item.file
            if item.text is not None:
                folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="kaudit-record-"))
                file = _materialise_record(item, text, folder)
            gpu = stack.enter_context(slots.take()) if slots else None
            run = audit_kernel(file, item.display, text, options, device,
                               submission.reference if submission else None,
                               submission.level if submission else None,
                               submission.problem if submission else None, gpu=gpu)
        with lock:
            done[0] += 1
            if on_kernel:
                on_kernel(done[0], len(work))
        return run

    if options.jobs <= 1 or len(work) <= 1:
        return [one(entry) for entry in work]
    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        return list(pool.map(one, work))


def _materialise_record(item: WorkItem, text: str, folder: str) -> str:
    """Write a JSONL record's kernel to `folder/kernel.py` and, when the record has a `ref_code`,
    that to `folder/problem.py` (found as its sibling problem); returns the kernel's path."""
    kernel = os.path.join(folder, "kernel.py")
    Path(kernel).write_text(text, encoding="utf-8")
    reference = item.submission.reference if item.submission else None
    match = re.search(r"#L(\d+)/ref_code$", reference or "")
    if match:
        with open(item.file, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, start=1):
                if number == int(match.group(1)):
                    with contextlib.suppress(ValueError, AttributeError):
                        code = json.loads(line).get("ref_code")
                        if isinstance(code, str):
                            Path(folder, "problem.py").write_text(code, encoding="utf-8")
                    break
    return kernel


class GpuSlots:
    """Hands each concurrent kernel a GPU: the visible GPUs in turn, as evenly as `jobs` allows.
    `take()` yields (physical id for CUDA_VISIBLE_DEVICES, share of its memory for this job)."""

    def __init__(self, jobs: int, visible: list[str] | None = None) -> None:
        self.gpus = visible if visible is not None else visible_gpus()
        self.jobs = max(1, jobs)
        self.busy = {gpu: 0 for gpu in self.gpus}
        self.lock = threading.Lock()
        #: each job's cap: the GPU's memory shared by the jobs that may run on it at once
        self.fraction = round(GPU_MEMORY_SHARE / max(1, -(-self.jobs // max(1, len(self.gpus)))),
                              3)

    @contextlib.contextmanager
    def take(self):
        if not self.gpus:
            yield None
            return
        with self.lock:
            gpu = min(self.gpus, key=lambda g: self.busy[g])
            self.busy[gpu] += 1
        try:
            yield (gpu, self.fraction)
        finally:
            with self.lock:
                self.busy[gpu] -= 1


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries for the children."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


def audit_kernel(file: str, display: str, text: str, options: DynamicOptions, device: str,
                 reference: str | None = None, level: int | None = None,
                 number: int | None = None, gpu: tuple[str, float] | None = None) -> KernelRun:
    """Audit one kernel file; `gpu` = (CUDA_VISIBLE_DEVICES entry, memory fraction) on CUDA."""
    run = KernelRun(display)
    where = forward_location(display, text)
    add = _Adder(run, where)
    reason = cuda_reason(text)
    problem = pair_problem(file, reference, options, level, number)
    run.problem = display_path(problem) if problem else None
    if reason and device != "cuda":
        run.status = "needs-cuda"
        add("KD500", f"not run: needs CUDA ({reason}) and this run has no CUDA device",
            reason=reason)
        return run
    if problem is None:
        run.status = "no-problem"
        add("KD502", "not run: no reference problem (give --problem FILE, put problem.py next "
            "to the kernel, or --problems ROOT for KernelBench names)")
        return run
    shared_memory = _memory_limit() if device == "cpu" else None
    memory = shared_memory // max(1, options.jobs) if shared_memory else None
    cpu_seconds = options.timeout * (os.cpu_count() or 1) + 30 if device == "cpu" else None
    scales = [s for s in options.scales if s != 1]
    common = {"problem": os.path.abspath(problem), "device": device,
              "init_seed": options.init_seed, "seeds": list(options.seeds), "scales": scales,
              "gpu_memory_fraction": gpu[1] if gpu else None}
    env = {"CUDA_VISIBLE_DEVICES": gpu[0]} if gpu else {}
    with run_job(Job(REFERENCE_TARGET, common, timeout=options.timeout, seed=options.init_seed,
                     memory_limit=memory, cpu_limit=cpu_seconds, env=env)) as reference_result:
        if not reference_result.ok:
            run.status = "reference-failed"
            if reference_result.phase is None:
                try:
                    reference_result.phase = reference_result.path("phase.txt").read_text(
                        encoding="utf-8")[:40]
                except (OSError, FileNotFoundError):
                    pass
            add("KD503", f"not run: the reference problem {run.problem} failed: "
                f"{reference_result.describe()}", **_failure_metrics(reference_result))
            return run
        keys = [f"s{index}" for index in range(len(scales))]
        try:
            refs = {n: reference_result.load_tensors(f"ref_{n}.pt") for n in ("a", "b")}
            inputs = {n: _load_any(reference_result, f"inputs_{n}.pt") for n in ("a", "b")}
            scaled_refs = _scaled_references(reference_result, keys, scales)
        except OutputError as exc:
            run.status = "reference-failed"
            add("KD503", f"not run: the reference problem {run.problem} returned no tensors: "
                f"{exc}")
            return run
        # the candidate gets copies of the inputs, in a folder holding nothing else
        inputs_dir = tempfile.mkdtemp(prefix="kaudit-inputs-")
        try:
            for name in ("a", "b", *keys):
                shutil.copyfile(reference_result.path(f"inputs_{name}.pt"),
                                os.path.join(inputs_dir, f"inputs_{name}.pt"))
            # the reference outputs now live only in this process: their files are removed
            # before any candidate code runs
            reference_result.close()
            build = os.path.join(os.path.abspath(options.extensions_dir), hashlib.sha256(
                text.encode("utf-8", "surrogatepass")).hexdigest()[:16]) \
                if options.extensions_dir else None
            if device == "cpu" and uses_triton(text):
                env = {**env, "TRITON_INTERPRET": "1"}
            job = Job(CANDIDATE_TARGET, {**common, "kernel": os.path.abspath(file),
                                         "inputs_dir": inputs_dir, "extensions_dir": build},
                      timeout=options.timeout, seed=options.init_seed, memory_limit=memory,
                      cpu_limit=cpu_seconds, env=env)
            with run_job(job) as candidate:
                _judge(run, add, candidate, refs, inputs, scaled_refs, options)
        finally:
            shutil.rmtree(inputs_dir, ignore_errors=True)
    return run


def _scaled_references(result: RunResult, keys: list[str], scales: list[float]) -> list[dict]:
    """Per scale: the native and (when the float64 copy ran) float64 reference outputs."""
    described = (result.value or {}).get("scales", {})
    scaled = []
    for key, factor in zip(keys, scales):
        fp64 = described.get(key, {}).get("fp64")
        scaled.append({"key": key, "scale": factor, "native": result.load_tensors(f"ref_{key}.pt"),
                       "fp64": result.load_tensors(f"ref64_{key}.pt") if fp64 else None,
                       "fp64_error": described.get(key, {}).get("fp64_error")})
    return scaled


class _Adder:
    def __init__(self, run: KernelRun, where: Location) -> None:
        self.run, self.where = run, where

    def __call__(self, code: str, message: str, **metrics: Any) -> None:
        rule = rule_by_code(code)
        assert rule is not None, code
        finding = rule().finding(self.where, message,
                                 **{k: v for k, v in metrics.items() if v is not None})
        self.run.findings.append(dataclasses.replace(finding, pass_="dynamic"))


def _memory_limit() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4
    except (ValueError, OSError, AttributeError):
        return None


def _failure_metrics(result: RunResult) -> dict[str, Any]:
    return {"status": result.status, "phase": result.phase, "error_type": result.error_type or None,
            "stderr_tail": result.stderr_tail[-1500:] or None}


def _load_any(result: RunResult, name: str) -> list:
    import torch

    data = torch.load(result.path(name), map_location="cpu", weights_only=True)
    return list(data)


# -- judging ---------------------------------------------------------------------------------


def _judge(run: KernelRun, add: _Adder, candidate: RunResult, refs: dict, inputs: dict,
           scaled_refs: list[dict], options: DynamicOptions) -> None:
    from kaudit.dynamic import sentinels

    if not candidate.ok:
        run.status = "failed"
        if candidate.phase is None:  # timed out or crashed: where it was, from its phase file
            try:
                candidate.phase = candidate.path("phase.txt").read_text(encoding="utf-8")[:40]
            except (OSError, FileNotFoundError):
                pass
        if candidate.error_type == "DeferredOutputError":
            add("KD404", f"deferred work: {candidate.error}", returned=candidate.error)
            return
        what = {"import": "import or compile", "init": "construction"}.get(
            candidate.phase or "", candidate.phase)
        if what and candidate.phase != what:
            candidate.phase = what  # describe() names the phase
        add("KD501", f"the kernel {candidate.describe()}", **_failure_metrics(candidate))
        return
    try:
        poisoned = [candidate.load_tensors(f"poison{r}.pt") for r in range(sentinels.RUNS)]
        plain = candidate.load_tensors("plain.pt")
        fresh, same = candidate.load_tensors("fresh.pt"), candidate.load_tensors("same.pt")
        after = _load_any(candidate, "inputs_after.pt")
        scaled = [candidate.load_tensors(f"scaled_{s['key']}.pt") for s in scaled_refs]
        oob = {index: _load_any(candidate, f"oob{index}.pt") for index in range(len(plain))
               if f"oob{index}.pt" in candidate.files()}
    except (OutputError, FileNotFoundError) as exc:
        run.status = "failed"
        add("KD501", f"the kernel's outputs could not be read: {exc}")
        return
    run.status = "ok"
    info = candidate.value or {}
    run.metrics.update({k: v for k, v in info.items() if not isinstance(v, list)})
    ref_a, ref_b = refs["a"], refs["b"]
    layout = _layout_problem(ref_a, plain)
    if layout:
        add("KD202", f"wrong output: {layout}", reason="layout")
        return
    incomplete, unwritten = _coverage(add, ref_a, poisoned, oob, options)
    _out_of_bounds(add, info.get("guard_violations", []), ref_a, oob, unwritten, options)
    _deferred(add, info)
    _side_stream(add, info.get("side_stream", []), ref_a)
    correct = not incomplete and _correctness(add, ref_a, plain, options.tolerance)
    stale = _stale(add, ref_a, ref_b, plain, fresh, same, options.tolerance)
    if correct and not stale:  # a replayed answer is wrong at every other scale too
        _scale_fragility(add, scaled_refs, scaled)
    _mutation(add, inputs["a"], after)


def _coverage(add: _Adder, reference: list, poisoned: list, oob: dict,
              options: DynamicOptions) -> tuple[bool, dict[int, Any]]:
    """KD101/KD102 per output; (whether some output is not fully and cleanly written, each
    output's unwritten mask)."""
    from kaudit.dynamic import sentinels

    incomplete = False
    masks = {}
    for index, ref in enumerate(reference):
        runs = [p[index] for p in poisoned]
        if any(r.shape != ref.shape or r.dtype != ref.dtype for r in runs):
            continue
        mask = masks[index] = unwritten_mask(runs)
        coverage = write_coverage(runs, mask)
        name = _output_name(index, reference)
        if coverage["unwritten"]:
            incomplete = True
            picture = _picture(options, add, index, ref, mask, oob.get(index),
                               f"{name}: {coverage['unwritten']} of {coverage['numel']} elements "
                               f"never written")
            add("KD101", f"{name} ({_describe_tensor(ref)}): {coverage['unwritten']} of "
                f"{coverage['numel']} elements ({100 * coverage['fraction']:.3g} %) were never "
                f"written in {sentinels.RUNS - 1} runs with different sentinels; "
                f"{coverage['where']}", output=index, artifact=picture, **coverage)
        elif coverage["dependent"] and coverage["deterministic"]:
            incomplete = True
            add("KD102", f"{name} ({_describe_tensor(ref)}): {coverage['dependent']} of "
                f"{coverage['numel']} elements ({100 * coverage['dependent_fraction']:.3g} %) "
                f"change with the sentinel that fills fresh allocations, while a repeat run with "
                f"the same sentinel is bit-identical: the output depends on uninitialised memory",
                output=index, **coverage)
    return incomplete, masks


def _out_of_bounds(add: _Adder, violations: list[dict], reference: list, oob: dict,
                   unwritten: dict[int, Any], options: DynamicOptions) -> None:
    """KD103: one finding per allocation whose guard zones were written, in any poisoned run."""
    from kaudit.dynamic import sentinels

    by_allocation: dict[tuple, list[dict]] = {}
    for violation in violations:
        # by shape and dtype: the unpoisoned runs allocate in another order and cannot tell
        # which allocation became an output
        key = (violation["phase"], tuple(violation["shape"]), violation["dtype"])
        by_allocation.setdefault(key, []).append(violation)
    for (phase, shape, dtype), seen in list(by_allocation.items())[:MAX_OOB]:
        output = next((v["output"] for v in seen if v["output"] is not None), None)
        order = min(v["order"] for v in seen)
        what = (_output_name(output, reference) if output is not None else
                f"a {'temporary' if phase == 'forward' else 'construction-time'} allocation "
                f"(allocation #{order} of {phase})")
        after, before = max(v["after"] for v in seen), max(v["before"] for v in seen)
        parts = []
        if after:
            parts.append(f"{after} elements past its end (up to "
                         f"{max(v['farthest_after'] for v in seen)} elements beyond)")
        if before:
            parts.append(f"{before} elements before its start (up to "
                         f"{max(v['farthest_before'] for v in seen)} elements before)")
        picture = None
        if output is not None and output in oob and options.artifacts_dir:
            ref = reference[output]
            picture = _picture(options, add, output, ref, unwritten.get(output), oob[output],
                               f"{what}: written out of bounds")
        add("KD103", f"{what} (shape {list(shape)}, {dtype}) was written out of bounds: "
            f"{' and '.join(parts)}, in {len({v['run'] for v in seen})} of {sentinels.RUNS + 1} "
            f"runs (guard zones of {sentinels.GUARD_BYTES // 1024} KiB around each allocation)",
            output=output, allocation_phase=phase, allocation=order, shape=list(shape),
            dtype=dtype, written_after=after, written_before=before, artifact=picture)


def _deferred(add: _Adder, info: dict) -> None:
    """KD404: a tensor subclass returned, the output changing after return, kernel threads alive."""
    if info.get("returned"):
        add("KD404", f"deferred work: forward returned a {info['returned']}, a torch.Tensor "
            f"subclass, not a plain tensor (a subclass can compute or compare lazily)",
            returned=info["returned"])
    changed = info.get("changed_after_return") or 0
    threads = info.get("lingering_threads") or []
    if changed or threads:
        parts = []
        if changed:
            parts.append(f"{changed} output elements changed during the {DEFERRED_WAIT:g} s "
                         f"after forward returned (and the device was synchronised)")
        if threads:
            parts.append(f"threads the kernel started are still running: {', '.join(threads)}")
        add("KD404", f"deferred work: {'; '.join(parts)}", changed_after_return=changed or None,
            lingering_threads=threads or None)


def _side_stream(add: _Adder, differing: list[int], reference: list) -> None:
    """KD403: outputs read after forward on the current stream differ from those read after a
    device synchronise (CUDA runs only; one count per poisoned run)."""
    racing = [count for count in differing if count]
    if racing:
        numel = sum(r.numel() for r in reference)
        add("KD403", f"side stream: read on the current stream right after forward returned, "
            f"up to {max(racing)} of {numel} output elements differed from the values after a "
            f"device synchronise (in {len(racing)} of {len(differing)} runs): work left on "
            f"another stream finishes after the harness's timer and checks",
            differing=max(racing), runs=len(racing), numel=numel)


def _scale_fragility(add: _Adder, scaled_refs: list[dict], scaled: list[list]) -> None:
    """KD301: wrong at a scale where the float64 reference shows the problem is well conditioned
    (the native reference agrees with it within the scale-free limits)."""
    for record, outputs in zip(scaled_refs, scaled):
        if record["fp64"] is None or len(outputs) != len(record["native"]):
            continue
        for index, (native, wide, out) in enumerate(zip(record["native"], record["fp64"],
                                                        outputs)):
            if out.shape != native.shape or wide.shape != native.shape:
                continue
            rel_limit, ratio_limit = SCALE_FREE.get(_dtype(native), SCALE_FREE_DEFAULT)
            ref_rel, ref_ratio = scale_free_errors(wide, native)
            if ref_rel > rel_limit or ref_ratio > ratio_limit:
                continue  # the problem itself loses accuracy at this scale
            rel, ratio = scale_free_errors(wide, out)
            if rel > max(rel_limit, 10 * ref_rel) or ratio > max(ratio_limit, 10 * ref_ratio):
                name = _output_name(index, outputs)
                add("KD301", f"scale fragility: with the inputs scaled by {record['scale']:g}, "
                    f"{name} has relative L2 error {_num(rel)} and max error / max|reference| "
                    f"{_num(ratio)} against a float64 reference (limits {rel_limit:g}, "
                    f"{ratio_limit:g}), while the {_dtype(native)} reference stays within "
                    f"{_num(ref_rel)} / {_num(ref_ratio)}: correct at scale 1, wrong at "
                    f"{record['scale']:g}", scale=record["scale"], output=index,
                    relative_l2=_finite(rel), max_error_ratio=_finite(ratio),
                    reference_relative_l2=ref_rel, reference_max_error_ratio=ref_ratio)
                return


def _picture(options: DynamicOptions, add: _Adder, index: int, reference: Any, unwritten: Any,
             guards: list | None, title: str) -> str | None:
    """An SVG of the output's unwritten / out-of-bounds elements under --artifacts, else None."""
    if not options.artifacts_dir:
        return None
    from kaudit.dynamic.artifacts import write_picture

    stem = f"{add.run.path}-output{index}"
    before, after = guards if guards else (None, None)
    return write_picture(options.artifacts_dir, stem, list(reference.shape), unwritten=unwritten,
                         written_before=before, written_after=after, title=title)


def _layout_problem(reference: list, candidate: list) -> str | None:
    if len(reference) != len(candidate):
        return f"forward returned {len(candidate)} tensors, the reference {len(reference)}"
    for index, (ref, out) in enumerate(zip(reference, candidate)):
        if tuple(ref.shape) != tuple(out.shape):
            return (f"{_output_name(index, reference)} has shape {list(out.shape)}, "
                    f"the reference {list(ref.shape)}")
        if ref.dtype != out.dtype:
            return (f"{_output_name(index, reference)} has dtype {_dtype(out)}, "
                    f"the reference {_dtype(ref)}")
    return None


def unwritten_mask(runs: list) -> Any:
    """Flat bool mask of the elements equal to their run's sentinel in every poisoned run (run i
    filled with sentinel i, the last run repeating the first sentinel); all False for dtypes that
    are not poisoned."""
    import torch

    from kaudit.dynamic import sentinels

    dtype = runs[0].dtype
    bits = [sentinels.as_bits(r).reshape(-1) for r in runs]
    unwritten = torch.ones(bits[0].numel(), dtype=torch.bool)
    for run, value in enumerate(bits):
        fill = sentinels.fill_value(dtype, run)
        if fill is None:
            return torch.zeros(bits[0].numel(), dtype=torch.bool)
        unwritten &= value == fill
    return unwritten


def write_coverage(runs: list, unwritten: Any = None) -> dict[str, Any]:
    """Bit-level coverage of one output over the poisoned runs (see `unwritten_mask`)."""
    import torch

    from kaudit.dynamic import sentinels

    if unwritten is None:
        unwritten = unwritten_mask(runs)
    bits = [sentinels.as_bits(r).reshape(-1) for r in runs]
    numel = bits[0].numel()
    distinct = [r for r in range(len(bits)) if sentinels.sentinel_run(r) == r]
    differs = torch.zeros(numel, dtype=torch.bool)
    for r in distinct[1:]:
        differs |= bits[r] != bits[distinct[0]]
    repeat_same = all(torch.equal(bits[r], bits[sentinels.sentinel_run(r)])
                      for r in range(len(bits)) if sentinels.sentinel_run(r) != r)
    dependent = differs & ~unwritten
    count = int(unwritten.sum())
    shape = list(runs[0].shape)
    return {"numel": numel, "unwritten": count,
            "fraction": round(count / numel, 6) if numel else 0.0,
            "dependent": int(dependent.sum()),
            "dependent_fraction": round(int(dependent.sum()) / numel, 6) if numel else 0.0,
            "deterministic": repeat_same,
            "poisoned_dtype": sentinels.fill_value(runs[0].dtype, 0) is not None,
            **_where(unwritten, shape)}


def _where(mask: Any, shape: list[int]) -> dict[str, Any]:
    """Where the unwritten elements lie: tail, whole rows, whole columns, strided or scattered."""
    import torch

    count = int(mask.sum())
    if not count:
        return {"pattern": "none", "where": "none"}
    numel = mask.numel()
    columns = shape[-1] if len(shape) >= 1 and shape[-1] else 1
    rows = numel // columns
    grid = mask.reshape(rows, columns)
    full_rows = grid.all(dim=1)
    full_columns = grid.all(dim=0)
    positions = torch.nonzero(mask).reshape(-1)
    first = int(positions[0])
    info: dict[str, Any] = {"first_unwritten": first, "rows": rows, "columns": columns,
                            "rows_unwritten": int(full_rows.sum()),
                            "columns_unwritten": int(full_columns.sum())}
    if count == numel:
        info.update(pattern="all", where="no element of the output was written")
    elif count == numel - first:
        info.update(pattern="tail", where=f"the tail from flat index {first} on "
                    f"({count} elements) was never written")
    elif rows > 1 and int(full_rows.sum()) * columns == count:
        written = [int(i) for i in torch.nonzero(~full_rows).reshape(-1)[:5]]
        info.update(pattern="rows", where=f"{int(full_rows.sum())} of {rows} rows (of "
                    f"{columns} elements) were never written; written rows include {written}")
    elif columns > 1 and int(full_columns.sum()) * rows == count:
        info.update(pattern="columns", where=f"{int(full_columns.sum())} of {columns} columns "
                    f"were never written")
    else:
        steps = torch.unique(positions[1:] - positions[:-1]) if count > 1 else None
        if steps is not None and steps.numel() == 1 and int(steps[0]) > 1:
            info.update(pattern="strided", stride=int(steps[0]),
                        where=f"every {int(steps[0])}th element from flat index {first} on")
        else:
            info.update(pattern="scattered", where=f"scattered, first at flat index {first}, "
                        f"{int(full_rows.sum())} whole rows of {rows}")
    return info


def scale_free_errors(reference: Any, candidate: Any) -> tuple[float, float]:
    """(relative L2 error, max error / max |reference|), in float64; inf when the reference is all
    zero and the candidate is not."""
    import torch

    ref = reference.double().reshape(-1)
    out = candidate.double().reshape(-1)
    if not ref.numel():
        return 0.0, 0.0
    diff = out - ref
    if not bool(torch.isfinite(diff).all()):
        return math.inf, math.inf
    norm, peak = float(ref.norm()), float(ref.abs().max())
    error_norm, error_peak = float(diff.norm()), float(diff.abs().max())
    rel = error_norm / norm if norm else (0.0 if error_norm == 0 else math.inf)
    ratio = error_peak / peak if peak else (0.0 if error_peak == 0 else math.inf)
    return rel, ratio


def _correctness(add: _Adder, reference: list, candidate: list, tolerance: Tolerance) -> bool:
    """KD201/KD202 per output; True when every output passes both checks."""
    from kaudit.dynamic.probes import passes

    correct = True
    for index, (ref, out) in enumerate(zip(reference, candidate)):
        dtype = _dtype(ref)
        atol, rtol = tolerance.for_dtype(dtype)
        preset = passes(ref, out, atol, rtol)
        rel, ratio = scale_free_errors(ref, out)
        rel_limit, ratio_limit = SCALE_FREE.get(dtype, SCALE_FREE_DEFAULT)
        scale_ok = rel <= rel_limit and ratio <= ratio_limit
        name = _output_name(index, reference)
        peak = float(ref.double().abs().max()) if ref.numel() else 0.0
        numbers = (f"relative L2 error {_num(rel)} (limit {rel_limit:g}), max error / "
                   f"max|reference| {_num(ratio)} (limit {ratio_limit:g}), max|reference| "
                   f"{peak:.3g}")
        metrics = {"output": index, "relative_l2": _finite(rel), "max_error_ratio": _finite(ratio),
                   "max_abs_reference": peak, "atol": atol, "rtol": rtol,
                   "tolerance": tolerance.name}
        correct = correct and scale_ok
        if preset and not scale_ok:
            add("KD201", f"{name} passes {tolerance.name} allclose (atol {atol:g}, rtol {rtol:g}) "
                f"only through its absolute part: {numbers}", **metrics)
        elif not preset and not scale_ok:
            add("KD202", f"wrong output: {name} fails {tolerance.name} allclose (atol {atol:g}, "
                f"rtol {rtol:g}) and the scale-invariant check: {numbers}", **metrics)
    return correct


def _stale(add: _Adder, ref_a: list, ref_b: list, plain: list, fresh: list, same: list,
           tolerance: Tolerance) -> bool:
    """KD401; True when reported."""
    from kaudit.dynamic.probes import passes

    def matches(refs: list, outs: list) -> bool:
        return len(refs) == len(outs) and all(
            r.shape == o.shape and passes(r, o, *tolerance.for_dtype(_dtype(r)))
            for r, o in zip(refs, outs))

    if matches(ref_a, ref_b) or not matches(ref_a, plain):
        return False  # inputs A and B give the same answer, or the first call was already wrong
    for outs, how in ((fresh, "new buffers"), (same, "the first call's buffers")):
        if not matches(ref_b, outs) and matches(ref_a, outs):
            add("KD401", f"stale output: called again with fresh inputs in {how}, forward "
                f"returned the first call's answer, not the answer for the new inputs",
                buffers="new" if outs is fresh else "same")
            return True
    return False


def _mutation(add: _Adder, before: list, after: list) -> None:
    import torch

    for index, (old, new) in enumerate(zip(before, after)):
        if not isinstance(old, torch.Tensor) or not isinstance(new, torch.Tensor):
            continue
        if old.shape != new.shape or old.dtype != new.dtype:
            add("KD402", f"input {index} changed shape or dtype during forward",
                input=index)
            continue
        from kaudit.dynamic import sentinels

        changed = sentinels.as_bits(old) != sentinels.as_bits(new)
        count = int(changed.sum())
        if count:
            add("KD402", f"input {index} ({_describe_tensor(old)}) was modified by forward: "
                f"{count} of {old.numel()} elements ({100 * count / old.numel():.3g} %) differ "
                f"afterwards", input=index, changed=count, numel=old.numel())


def _output_name(index: int, outputs: list) -> str:
    return "the output" if len(outputs) == 1 else f"output {index}"


def _dtype(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _describe_tensor(tensor: Any) -> str:
    return f"shape {list(tensor.shape)}, {_dtype(tensor)}"


def _num(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}"


def _finite(value: float) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else value


# -- scan integration ------------------------------------------------------------------------


def resolve_device(requested: str) -> str:
    from kaudit.dynamic.problems import resolve_device as resolve

    return resolve(requested)


def run_dynamic(paths: list[str], report: Any, options: DynamicOptions, config: Any) -> list[KernelRun]:
    """Run the dynamic pass over what `kaudit scan` scanned and merge its findings into `report`
    (a `kaudit.api.Report`): findings appended, fingerprints assigned, verdicts judged again."""
    from kaudit.baseline import load_baseline, mark_findings
    from kaudit.discover import discover
    from kaudit.findings import assign_fingerprints
    from kaudit.results import BaselineTimings, ResultTrees, Submission
    from kaudit.source import split_lines
    from kaudit.verdicts import judge, summarize

    device = resolve_device(options.device)
    items, _errors = discover(list(paths))
    items = ResultTrees().annotate(items)
    if options.extensions_dir is None:
        # one build per kernel text for the whole scan (a results tree repeats kernels)
        with tempfile.TemporaryDirectory(prefix="kaudit-extensions-") as builds:
            runs = audit_items(items, dataclasses.replace(options, extensions_dir=builds), device)
    else:
        runs = audit_items(items, options, device)
    lines_of: dict[str, list[str]] = {}
    for item in items:
        if item.text is not None:
            lines_of[item.display] = split_lines(item.text)
        elif os.path.isfile(item.file):
            lines_of[item.display] = split_lines(
                Path(item.file).read_text(encoding="utf-8", errors="replace"))
    new = assign_fingerprints([f for r in runs for f in r.findings
                               if config.is_enabled(f.rule)], lines_of)
    if config.baseline:
        new = mark_findings(new, load_baseline(config.baseline))
    report.findings.extend(new)
    # a file's dynamic findings next to its static ones (reports group consecutive findings)
    first: dict[str, int] = {}
    for index, finding in enumerate(report.findings):
        first.setdefault(finding.path, index)
    report.findings.sort(key=lambda f: first[f.path])
    by_path: dict[str, list[Finding]] = {}
    for finding in report.findings:
        by_path.setdefault(finding.path, []).append(finding)
    timings = BaselineTimings.load(config.baseline_timings) if config.baseline_timings else None
    report.verdicts = [judge(v.path, v.submission or Submission("plain"), by_path.get(v.path, []),
                             timings, config.suspicious_speedup) for v in report.verdicts]
    report.summary = summarize(report.verdicts)
    report.summary["dynamic"] = {"device": device, "kernels": len(runs),
                                 "statuses": _count(r.status for r in runs)}
    return runs


def _count(values: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts
