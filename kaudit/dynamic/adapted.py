"""`scan --dynamic` on other benchmarks' layouts: an adapted submission (`Submission.spec`, from
`kaudit.adapters`) runs through the same jobs as a KernelBench kernel, wrapped the way its
benchmark calls it.

`prepare` writes, in a scratch folder, a KernelBench-shaped problem (`problem/problem.py`:
`Model`, `get_inputs`, `get_init_inputs`) around the benchmark's reference and input generator,
and a kernel (`kernel/kernel.py`: `ModelNew`) around the candidate's entry point, each next to a
copy of the code it wraps (the candidate's job sees only its own folder and the problem's):

- Atrex-Bench: `Model(**init_kwargs)` of `reference.py` and of the candidate, called with
  `_make_inputs(**input_kwargs)` of `input.py` at the benchmark's smallest size (shapes.json),
  as keywords named by the dict `_make_inputs` returns;
- KernelBenchX: the task's function (`def <stem>`, the name its test calls, or
  `kernel_function`), called with the arguments of its test's (below the separator) call with
  the most input elements: the test runs once with the function wrapped by a recorder (a test's
  first cases are often fixed tensors of a few elements, the same for every seed);
- CUDA-L1: the record's `ref_code` and `custom_code` as they are (KernelBench's shape), each
  class built in eval mode, as CUDA-L1's check (`eval/eval_cuda.py`) calls `.eval()` on both
  models before calling them: a kernel that folds BatchNorm with its running statistics is right
  there and wrong in training mode, where KernelBench's check leaves the models (level 3 has a
  dozen such kernels).

Where the KernelBenchX checkout has the task's timing template (`metrics/golden_metrics/
<stem>_perf.py`), both wrappers carry it (`perf.py`) and the problem can be rebound to one of the
inputs the benchmark times (`TIMED_SIZE`, `TIMED_BUDGET`: `kaudit.dynamic.shapes.timed_sweep`):
the template's `performance_metrics` runs with its imports of the task bound to the reference's
(or the submission's) functions and its `Performance_Metrics` base replaced by a stand-in; its
input list records every input's size and keeps only the one asked for, and `call_op` is the
call (`Model(name, keywords, timed)`).

Tensors that the benchmark's code creates on `device="cuda"` while building inputs land on the
CPU in a CPU run. FastKernels problems take their module and inputs from a captured case
(`kaudit.dynamic.adapted_fastkernels`); without a capture report such a submission gets a KD502
note saying where reports were looked for. Each wrapper file is self-contained
(the jobs load it without kaudit). Adapted problems are judged by their benchmark's own check
(`ProblemSpec.tolerance`) unless the scan chose one (`--tolerance`, `--atol`/`--rtol`).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
from pathlib import Path

from kaudit.adapters.kernelbenchx import submission_part, test_part, without_fences
from kaudit.adapters.model import ProblemSpec, Size
from kaudit.discover import WorkItem
from kaudit.dynamic import adapted_fastkernels as fastkernels
from kaudit.dynamic.shapes import TIMED_MARKER

#: benchmarks whose submissions run through a wrapper (KernelBench's run as they are)
WRAPPED = ("atrex", "kernelbenchx", "cuda-l1", "fastkernels")

# -- the wrappers' text (loaded by the jobs, without kaudit) -----------------------------------

#: appended to a CUDA-L1 record's code for its class `name` (lines before it keep their numbers):
#: its `__init__` wrapped in place, the name left bound to the class, which its own
#: `super(Model, self).__init__()` names
_CUDA_L1_EVAL_MODE = '''


def _built_in_eval_mode(init):
    """CUDA-L1's check calls .eval() on both models before calling them."""
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.eval()
    return __init__


{name}.__init__ = _built_in_eval_mode({name}.__init__)
'''

_COMMON = '''import importlib.util
import json
import os

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name):
    spec = importlib.util.spec_from_file_location("_wrapped_" + name,
                                                  os.path.join(_HERE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _OnThisDevice(TorchFunctionMode):
    """Tensors asked for on CUDA land on the CPU when there is no CUDA device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and not torch.cuda.is_available() and \\
                torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def _split_call(target, values, keywords):
    """target(*positional, **keywords): the last len(keywords) values are the keywords'."""
    cut = len(values) - len(keywords)
    return target(*values[:cut], **dict(zip(keywords, values[cut:])))
'''

_ATREX_PROBLEM = '''
_reference = _load("reference")
_inputs = _load("inputs")
INIT_KWARGS = json.loads({init!r})
INPUT_KWARGS = json.loads({inputs!r})
NAMES = json.loads({names!r})


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        with _OnThisDevice():
            self.inner = _reference.Model(**INIT_KWARGS)

    def forward(self, *values):
        return _split_call(self.inner, values, NAMES)


def get_inputs():
    with _OnThisDevice():
        made = _inputs._make_inputs(**INPUT_KWARGS)
    if isinstance(made, dict):
        return [made[name] for name in NAMES] if NAMES else list(made.values())
    return list(made)


def get_init_inputs():
    return []
'''

_ATREX_KERNEL = '''
_candidate = _load("candidate")
INIT_KWARGS = json.loads({init!r})
NAMES = json.loads({names!r})


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = getattr(_candidate, {entry!r})(**INIT_KWARGS)

    def forward(self, *values):
        return _split_call(self.inner, values, NAMES)
'''


_TIMED_HELPERS = '''
import re

TIMED_BUDGET = 0


class _PerfBase:
    """What the timing template's `Performance_Metrics` base gives its subclass."""

    def __init__(self, op_name, dtype=None, is_backward=False, **kwargs):
        self.op_name, self.dtype, self.kwargs = op_name, dtype, kwargs
        self.input_tensors = []


class _Enough(Exception):
    """The timed input asked for is made: the larger ones are not."""


def _shown(value):
    if isinstance(value, torch.Tensor):
        return str(list(value.shape)) + " " + str(value.dtype).replace("torch.", "")
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_shown(v) for v in value) + ")"
    return repr(value)


def _nbytes(value):
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class _Inputs(list):
    """The template's list of timed inputs: each one's bytes and description recorded, only the
    one at `keep` kept."""

    def __init__(self, keep):
        super().__init__()
        self.keep, self.sizes, self.shown, self.kinds = keep, [], [], []

    def append(self, value):
        self.sizes.append(_nbytes(value))
        self.shown.append(_shown(value))
        self.kinds.append("tuple" if isinstance(value, tuple) else
                          "list" if isinstance(value, list) else "value")
        if self.keep == len(self.sizes) - 1:
            super().append(value)
            raise _Enough()


def _timing(function):
    """An instance of the timing template's `performance_metrics` (its `perf.py` beside this
    file), its imports of the task's code bound to `function(name)`; its `input_tensors` an
    `_Inputs` list keeping the input at its `keep` index."""
    path = os.path.join(_HERE, "perf.py")
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().split("\\n")
    namespace = {"__name__": "_timing", "__file__": path, "Performance_Metrics": _PerfBase,
                 "do_bench_config": object}
    for number, line in enumerate(lines):
        found = re.match(r"(\\s*)from (kernelbenchx\\.[\\w.]+|performance_utils) import (.+)$",
                         line)
        if found:
            lines[number] = found.group(1) + "pass"
            if found.group(2) != "performance_utils":
                for part in found.group(3).strip("() ").split(","):
                    name, _, alias = part.strip().partition(" as ")
                    namespace[(alias or name).strip()] = function(name.strip())
    exec(compile("\\n".join(lines), path, "exec"), namespace)

    class Timed(namespace["performance_metrics"]):
        keep = None

        @property
        def input_tensors(self):
            return self.__dict__["_inputs"]

        @input_tensors.setter
        def input_tensors(self, values):
            self.__dict__["_inputs"] = _Inputs(self.keep)
            for value in values:
                self.__dict__["_inputs"].append(value)

    return Timed()


def _timed_inputs(perf, keep):
    perf.keep = keep
    try:
        perf.get_input_tensors()
    except _Enough:
        pass
    return perf.input_tensors


def _pack(values, kind):
    return tuple(values) if kind == "tuple" else list(values) if kind == "list" else values[0]
'''

_KBX_PROBLEM = '''
_reference = _load("reference")
NAMES = json.loads({names!r})


def _as_made(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def _elements(call):
    _, args, kwargs = call
    return sum(v.numel() for v in [*args, *kwargs.values()] if isinstance(v, torch.Tensor))


def _largest_call():
    """(name called, positional arguments, keyword arguments) of the test's call of the task's
    function with the most input elements (the first of those); the test runs to its end, or
    to an error after some call (on the CPU, a case may need CUDA)."""
    seen = []

    def recorder(name, real):
        def record(*args, **kwargs):
            # as the test made them: the call may write into its arguments (an `out=` buffer),
            # which the audit would then see as the inputs
            seen.append((name, [_as_made(v) for v in args],
                         {{key: _as_made(v) for key, v in kwargs.items()}}))
            return real(*args, **kwargs)
        return record

    namespace = dict(vars(_reference))
    namespace.update({{name: recorder(name, namespace[name]) for name in NAMES
                      if name in namespace}})
    namespace["__name__"] = "_wrapped_test"
    # where the test finds the checkout's utils/ (`../../../utils` from its task file)
    namespace["__file__"] = os.path.join(_HERE, "data", "kernelbenchx", "task", "test.py")
    path = os.path.join(_HERE, "test.py")
    with open(path, encoding="utf-8") as handle:
        test = compile(handle.read(), path, "exec")
    with _OnThisDevice():
        try:
            exec(test, namespace)
            for name, value in list(namespace.items()):
                if name.startswith("test_") and callable(value) and not seen:
                    value()
        except Exception:
            if not seen:
                raise
    if not seen:
        raise RuntimeError("the test never called " + " or ".join(NAMES))
    return max(seen, key=_elements)


class Model(nn.Module):
    def __init__(self, name, keywords, timed=None):
        super().__init__()
        self.name, self.keywords, self.timed = name, list(keywords), timed
        self.perf = _timing(lambda n: getattr(_reference, n)) if timed else None

    def forward(self, *values):
        if self.perf is not None:  # called as the timing template calls the task's function
            return self.perf.call_op(_pack(values, self.timed["kind"]))
        return _split_call(getattr(_reference, self.name), values, self.keywords)


_CHOSEN = []


def _timed_choice():
    """(index, description, kind) of the timed input TIMED_SIZE picks: 0, 1, 2 for the smallest,
    the middle and the largest of the template's inputs that fit in TIMED_BUDGET bytes."""
    if not _CHOSEN:
        made = _timed_inputs(_timing(lambda n: getattr(_reference, n)), None)
        fits = [i for i, size in enumerate(made.sizes) if size <= TIMED_BUDGET]
        picks = list(dict.fromkeys([fits[0], fits[len(fits) // 2], fits[-1]])) if fits else []
        if TIMED_SIZE >= len(picks):
            raise RuntimeError("only {{}} of the {{}} timed inputs fit in {{}} bytes".format(
                len(fits), len(made.sizes), TIMED_BUDGET))
        index = picks[TIMED_SIZE]
        _CHOSEN.append((index, "{{}} (timed input {{}} of {{}})".format(
            made.shown[index], index + 1, len(made.sizes)), made.kinds[index]))
    return _CHOSEN[0]


def get_inputs():
    if TIMED_SIZE is not None:
        index, _, kind = _timed_choice()
        (value,) = _timed_inputs(_timing(lambda n: getattr(_reference, n)), index)
        return list(value) if kind != "value" else [value]
    _, args, kwargs = _largest_call()
    return [*args, *(kwargs[key] for key in sorted(kwargs))]


def get_init_inputs():
    if TIMED_SIZE is not None:
        _, shown, kind = _timed_choice()
        return [NAMES[0], [], {{"kind": kind, "input": shown}}]
    name, _, kwargs = _largest_call()
    return [name, sorted(kwargs)]
'''

_KBX_KERNEL = '''
_candidate = _load("candidate")
NAMES = json.loads({names!r})


class ModelNew(nn.Module):
    def __init__(self, name, keywords, timed=None):
        super().__init__()
        self.keywords, self.timed = list(keywords), timed
        found = [n for n in [name, *NAMES] if callable(getattr(_candidate, n, None))]
        if not found:
            raise ImportError("the submission defines none of " + ", ".join([name, *NAMES]))
        entry = getattr(_candidate, found[0])
        self.entry = entry() if isinstance(entry, type) else entry
        # the timing template imports the task's names from the submission
        self.perf = _timing(lambda n: getattr(_candidate, n, entry)) if timed else None

    def forward(self, *values):
        if self.perf is not None:
            return self.perf.call_op(_pack(values, self.timed["kind"]))
        return _split_call(self.entry, values, self.keywords)
'''


def benchmark_check(spec: ProblemSpec):
    """The benchmark's own check of this problem: its preset, with the task's own thresholds
    where it has them (KernelBenchX's `precision_thresholds`)."""
    from kaudit.dynamic.tolerance import PRESETS

    return PRESETS[spec.tolerance].with_precision_thresholds(spec.thresholds)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A wrapped submission, ready for `kernels.audit_kernel`."""

    kernel: str
    problem: str


def wrapped(item: WorkItem) -> bool:
    spec = item.submission.spec if item.submission else None
    return spec is not None and spec.benchmark in WRAPPED


def prepare(item: WorkItem, text: str, folder: Path) -> Prepared | str:
    """The wrapper of an adapted submission written under `folder`, or why it cannot run."""
    spec = item.submission.spec
    assert spec is not None
    names = item.submission.entry.names
    problem = write_problem(spec, names, folder / "problem")
    if not isinstance(problem, Path):
        return problem
    kernel_dir = folder / "kernel"
    kernel_dir.mkdir()
    if spec.benchmark == "cuda-l1":
        _write(kernel_dir, "kernel", in_eval_mode(text, "ModelNew"))
    elif spec.benchmark == "fastkernels":
        fastkernels.write_kernel(spec, item.file, text, _COMMON, kernel_dir)
    elif spec.benchmark == "atrex":
        _write(kernel_dir, "candidate", text)
        _write(kernel_dir, "kernel", _COMMON + _ATREX_KERNEL.format(
            init=json.dumps(_size(spec).init_kwargs), names=json.dumps(_input_names(spec)),
            entry=names[0]))
    else:
        _write(kernel_dir, "candidate", without_fences(submission_part(text)))
        _write(kernel_dir, "kernel", _COMMON + _timing_part(spec, kernel_dir)
               + _KBX_KERNEL.format(names=json.dumps(list(names))))
    return Prepared(str(kernel_dir / "kernel.py"), str(problem))


def write_problem(spec: ProblemSpec, names: tuple[str, ...], folder: Path) -> Path | str:
    """`folder/problem.py`, KernelBench's shape around the benchmark's problem (`names`: the
    entry points the benchmark accepts, which a KernelBenchX test may call), or why not."""
    if spec.benchmark == "fastkernels":
        return fastkernels.why_not(spec) or fastkernels.write_problem(spec, _COMMON, folder)
    if spec.reference is None:
        return f"no reference for {spec.benchmark} task {spec.task} (its problem was not found)"
    reference = _text(spec.reference)
    if reference is None:
        return f"the reference {spec.reference.path} cannot be read"
    folder.mkdir()
    if spec.benchmark == "cuda-l1":
        _write(folder, "problem", in_eval_mode(reference, "Model"))
    elif spec.benchmark == "atrex":
        inputs = _text(spec.inputs_code) if spec.inputs_code else None
        if inputs is None:
            return f"no readable input.py for Atrex-Bench task {spec.task}"
        size = _size(spec)
        _write(folder, "reference", reference)
        _write(folder, "inputs", inputs)
        _write(folder, "problem", _COMMON + _ATREX_PROBLEM.format(
            init=json.dumps(size.init_kwargs), inputs=json.dumps(size.input_kwargs),
            names=json.dumps(_input_names(spec))))
    else:
        test = test_part(reference)
        if test is None:
            return f"the KernelBenchX task {spec.task} has no test below its separator line"
        _write(folder, "reference", submission_part(reference))
        _write(folder, "test", test)
        _copy_utils(Path(spec.reference.file), folder)
        timing = _timing_part(spec, folder)
        marker = TIMED_MARKER if timing else "TIMED_SIZE = None"
        _write(folder, "problem", _COMMON + timing + marker + "\n"
               + _KBX_PROBLEM.format(names=json.dumps(list(names))))
    return folder / "problem.py"


def _timing_part(spec: ProblemSpec, folder: Path) -> str:
    """The timing helpers, with the task's timing template copied to `folder/perf.py`, when the
    checkout has one (`metrics/golden_metrics/<stem>_perf.py`); "" without."""
    timing = _text(spec.timing) if spec.timing else None
    if timing is None:
        return ""
    _write(folder, "perf", timing)
    return _TIMED_HELPERS


def _copy_utils(task_file: Path, folder: Path) -> None:
    """The Python helpers of the checkout's `utils/` (`data/kernelbenchx/<Category>/<task>`
    three levels up), which tests import, into `folder/utils/`: the job sees only `folder`."""
    utils = task_file.parent.parent.parent.parent / "utils"
    helpers = sorted(utils.glob("*.py")) if utils.is_dir() else []
    if helpers:
        (folder / "utils").mkdir()
        for helper in helpers:
            (folder / "utils" / helper.name).write_bytes(helper.read_bytes())


def _size(spec: ProblemSpec) -> Size:
    return smallest(spec.sizes) or Size("default")


def _input_names(spec: ProblemSpec) -> list[str]:
    source = _text(spec.inputs_code) if spec.inputs_code else None
    return input_names(source or "", spec.inputs_name or "_make_inputs")


def _text(code) -> str | None:
    if code.text is not None:
        return code.text
    try:
        return Path(code.file).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def smallest(sizes: tuple[Size, ...]) -> Size | None:
    """The size with the fewest elements, by the product of its numeric input arguments (the
    cheapest to audit; every size is one the benchmark checks)."""
    def volume(size: Size) -> float:
        numbers = [abs(v) for v in size.input_kwargs.values()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return math.prod(numbers) if numbers else 0.0

    return min(sizes, key=volume) if sizes else None


def input_names(source: str, function: str) -> list[str]:
    """The keys of the dict literal `function` returns, in order ([] when it returns anything
    else: the inputs are then passed positionally, in the order the dict holds them)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return) and isinstance(inner.value, ast.Dict):
                    keys = inner.value.keys
                    if keys and all(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                    for k in keys):
                        return [k.value for k in keys]
    return []


def in_eval_mode(text: str, name: str) -> str:
    """A CUDA-L1 record's code with its class `name` built in eval mode (as it is, when it
    defines no such class at module level)."""
    try:
        defined = any(isinstance(node, ast.ClassDef) and node.name == name
                      for node in ast.parse(text).body)
    except (SyntaxError, ValueError):
        defined = False
    return text + _CUDA_L1_EVAL_MODE.format(name=name) if defined else text


def _write(folder: Path, name: str, text: str) -> None:
    (folder / f"{name}.py").write_text(text, encoding="utf-8")


def audit(item: WorkItem, text: str, options, device: str, *, gpu=None, builds=None):
    """`kernels.audit_kernel` on the wrapper of an adapted submission (in a scratch folder,
    removed afterwards), judged by its benchmark's check unless the scan chose one; a KD502 note
    when it cannot run. Findings point at the candidate's entry point."""
    from kaudit.dynamic import scratch
    from kaudit.dynamic.judge import Adder
    from kaudit.dynamic.kernels import KernelRun, audit_kernel

    spec = item.submission.spec
    where = entry_location(item.display, text, item.submission.entry.names)
    folder = scratch.folder()
    try:
        prepared = prepare(item, text, Path(folder))
        if isinstance(prepared, str):
            run = KernelRun(item.display, status="no-problem")
            Adder(run, where)("KD502", f"not run: {prepared}", reason=prepared)
            return run
        if options.benchmark_checks:
            options = dataclasses.replace(options, tolerance=benchmark_check(spec))
        run = audit_kernel(prepared.kernel, item.display, text, options, device,
                           reference=prepared.problem, gpu=gpu, builds=builds)
    finally:
        scratch.remove(folder)
    run.problem = item.submission.spec.reference.path if item.submission.spec.reference \
        else run.problem
    run.metrics["tolerance"] = options.tolerance.name
    if spec.sizes:
        run.metrics["size"] = _size(spec).id
    run.findings = [dataclasses.replace(f, location=where) if f.location.line == 1 else f
                    for f in run.findings]
    return run


def entry_location(path: str, text: str, names: tuple[str, ...]):
    """The line of the first top-level class or function named in `names` (line 1 without)."""
    from kaudit.findings import Location

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return Location(path, 1, 1, 1, 1)
    lines = text.splitlines()
    defined = {node.name: node for node in tree.body
               if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    node = next((defined[n] for n in names if n in defined), None)
    if node is None:
        return Location(path, 1, 1, 1, 1)
    width = len(lines[node.lineno - 1]) if 0 < node.lineno <= len(lines) else 0
    return Location(path, node.lineno, 1, node.lineno, width + 1)


# -- `kaudit problems` on other benchmarks' problems -----------------------------------------


@dataclasses.dataclass(frozen=True)
class BenchmarkProblem:
    """Another benchmark's problem: `file` is what findings point at (Atrex-Bench's
    `reference.py`, KernelBenchX's task file)."""

    file: str
    spec: ProblemSpec
    names: tuple[str, ...]

    def location(self):
        return entry_location(self.file, _text(self.spec.reference) or "",
                              (self.spec.reference_name, *self.names))


def find_problems(path: str) -> list[BenchmarkProblem]:
    """Atrex-Bench operator folders (`reference.py`, `input.py`, `shapes.json`) and KernelBenchX
    task files (`data/kernelbenchx/<Category>/<stem>.py`) at or under `path`."""
    from kaudit.adapters import atrex, kernelbenchx

    found = []
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(folder, name) for folder, subfolders, names in os.walk(path)
        if not any(part.startswith(".") or part == "__pycache__"
                   for part in Path(folder).relative_to(path).parts)
        for name in names if name.endswith(".py"))
    for file in files:
        folder = Path(file).parent
        if Path(file).name == "reference.py" and atrex.is_operator(folder):
            found.append(BenchmarkProblem(file, atrex.problem_spec(folder), ("Model",)))
            continue
        task = kernelbenchx.problem_spec(file)
        if task is not None:
            spec, entry = task
            found.append(BenchmarkProblem(file, spec, entry.names))
    return found
