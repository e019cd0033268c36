"""FastKernels submissions in `scan --dynamic` and `kaudit problems`: a KernelBench-shaped
wrapper around the baseline operator and one around the candidate, built from a captured case
(`kaudit.adapters.fastkernels_captures`), the smallest of the benchmark's cases.

Baselines and candidates are modules of the benchmark's package (relative imports of its
`infra/`, `$dataclass` and `$op_ref` init arguments naming its classes), so each wrapper's folder
holds a copy of the package's sources: the problem's without any candidate, the kernel's with
the candidate alone under `tasks/candidate/L<n>/` (with the files beside it: the `.cu` sources
it loads). As `fastkernels bench` does, the wrappers:
- build the operator from the case's init recipe (tensors zero-filled, referenced operators
  built from their own recipes), cast its fp16/bf16/fp32 parameters to the case's dtype (its
  first fp16/bf16/fp32 tensor input, else bfloat16) and re-draw parameters left uninitialised
  (non-finite or above 1e4 in magnitude); the candidate gets the baseline's weights (the
  harness hands the reference's state over by name);
- make the forward arguments from their captured shapes and dtypes: floating tensors from a
  normal distribution, integer tensors below a bound read from the argument's name and the init
  arguments (token ids below the vocabulary, positions below the maximum position, expert ids
  below the expert count, cumulative sequence lengths as a partition of the activation's rows),
  other values as captured;
- call `forward` with the arguments bound by the baseline's signature, and compare every tensor
  the call returns; an operator that returns no tensor is judged by its tensor arguments after
  the call (it works in place).
Operator-specific input builders of the benchmark (paged caches, FP8 block scales) are not
reproduced: such a case fails in the reference job and is reported as not run.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

from kaudit.adapters.model import ProblemSpec

#: a candidate folder's files copied beside it (the sources it compiles or loads)
_SOURCES = (".py", ".cu", ".cuh", ".h", ".hpp", ".cpp", ".c")

_HELPERS = r'''
import importlib
import sys

sys.path.insert(0, _HERE)  # the copy of the benchmark's package beside this file
_HIGH = ("float16", "bfloat16", "float32")


def _symbol(qualname):
    module, _, name = qualname.partition(":")
    value = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


def _value(recipe, operators):
    if recipe is None or isinstance(recipe, (bool, int, float, str)):
        return recipe
    if isinstance(recipe, list):
        return [_value(v, operators) for v in recipe]
    if "$dtype" in recipe:
        return getattr(torch, recipe["$dtype"])
    if "$tensor" in recipe:
        spec = recipe["$tensor"]
        return torch.zeros(spec["shape"], dtype=getattr(torch, spec["dtype"]))
    if "$tuple" in recipe:
        return tuple(_value(v, operators) for v in recipe["$tuple"])
    if "$dict" in recipe:
        return {k: _value(v, operators) for k, v in recipe["$dict"].items()}
    if "$enum" in recipe:
        return _symbol(recipe["$enum"])(_value(recipe["value"], operators))
    if "$dataclass" in recipe:
        return _symbol(recipe["$dataclass"])(
            **{k: _value(v, operators) for k, v in recipe["fields"].items()})
    if "$op_ref" in recipe:
        ref = recipe["$op_ref"]
        variant = operators[ref["op"]]["init"]["variants"][ref["init_variant_id"]]
        return _construct(_symbol(ref["op"]), variant["args"], operators)
    raise ValueError("cannot rebuild the init argument " + json.dumps(recipe)[:200])


def _construct(cls, call, operators):
    if call is None:
        return cls()
    if "_args" in call:
        return cls(*[_value(v, operators) for v in call["_args"]])
    args = [_value(v, operators) for v in call.get("__varargs__", [])]
    kwargs = {k: _value(v, operators) for k, v in call.items()
              if k not in ("__varargs__", "__varkw__")}
    kwargs.update({k: _value(v, operators) for k, v in call.get("__varkw__", {}).items()})
    return cls(*args, **kwargs)


def _operator(cls):
    with _OnThisDevice():
        module = _construct(cls, CASE["init"], CASE["operators"])
    dtype = getattr(torch, CASE["dtype"])
    with torch.no_grad():
        for parameter in module.parameters():
            if str(parameter.dtype).removeprefix("torch.") not in _HIGH:
                continue
            if parameter.dtype != dtype:
                parameter.data = parameter.data.to(dtype)
            if parameter.numel() and (not bool(torch.isfinite(parameter).all())
                                      or float(parameter.abs().max()) > 1e4):
                parameter.normal_(0, 0.02)
    return module.eval()


def _scalars():
    init = CASE["init"] if isinstance(CASE["init"], dict) else {}
    return {k: v for k, v in init.items() if isinstance(v, (bool, int, float))}


def _integers(name, shape, dtype):
    lowered = name.lower().rsplit(".", 1)[-1]
    scalars = _scalars()
    if "cu_seq" in lowered:
        values = torch.zeros(shape, dtype=dtype)
        if shape and shape[-1] > 1:
            values.reshape(-1)[1:shape[-1]] = torch.cumsum(
                torch.randint(1, 64, (shape[-1] - 1,)), 0).to(dtype)
        return values
    bound = 128
    if "input_id" in lowered or "token" in lowered:
        bound = scalars.get("num_embeddings") or scalars.get("vocab_size") or 1024
    elif "position" in lowered:
        bound = scalars.get("max_position_embeddings") or 2048
    elif "expert" in lowered or "topk_id" in lowered:
        bound = scalars.get("num_experts") or scalars.get("n_routed_experts") or \
            scalars.get("num_local_experts") or 8
    elif any(word in lowered for word in ("slot", "block_table", "seqlen", "seq_len")):
        bound = 256
    return torch.randint(0, max(2, int(bound)), shape, dtype=dtype)


def _tensor(name, spec):
    dtype, shape = getattr(torch, spec["dtype"]), [int(s) for s in spec["shape"]]
    if dtype.is_floating_point and dtype.itemsize == 1:  # float8
        values = torch.randn(shape).clamp_(-2, 2).to(dtype)
    elif dtype.is_floating_point:
        values = torch.randn(shape, dtype=dtype)
    elif dtype == torch.bool:
        values = torch.randint(0, 2, shape, dtype=torch.bool)
    else:
        values = _integers(name, shape, dtype)
    stride = spec.get("stride")
    if stride is not None and tuple(stride) != values.stride():
        strided = torch.empty_strided(shape, stride, dtype=dtype)
        strided.copy_(values)
        return strided
    return values


def _is_tensor(value):
    return isinstance(value, dict) and isinstance(value.get("shape"), list) and \
        isinstance(value.get("dtype"), str)


def _made(value, name, tensors):
    """The argument `value` describes: its tensors appended to `tensors` when that is a list,
    else taken from the iterator `tensors`."""
    if _is_tensor(value):
        if isinstance(tensors, list):
            tensors.append(_tensor(name, value))
            return tensors[-1]
        return next(tensors)
    if isinstance(value, list):
        return [_made(v, f"{name}[{i}]", tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if set(value) == {"dtype"}:
            return getattr(torch, value["dtype"])
        if value.get("object") == "device":
            return torch.device("cpu")
        return {k: _made(v, f"{name}.{k}", tensors) for k, v in value.items()}
    return value


def _cumulative_lengths(arguments):
    """`cu_seqlens*` arguments made a partition of their activation's rows."""
    for name, values in arguments.items():
        if not name.startswith("cu_seqlens") or not isinstance(values, torch.Tensor) or \
                values.dim() != 1 or values.numel() < 2:
            continue
        partners = ("q", "query") if name.endswith("_q") else ("k", "key") \
            if name.endswith("_k") else ("q", "query", "x", "hidden_states", "key", "k")
        rows = next((arguments[p].shape[0] for p in partners
                     if isinstance(arguments.get(p), torch.Tensor) and arguments[p].dim()), None)
        if rows is not None:
            segments = values.numel() - 1
            lengths = [rows // segments + (1 if i < rows % segments else 0)
                       for i in range(segments)]
            values.copy_(torch.tensor([0, *lengths]).cumsum(0).to(values.dtype))


def get_inputs():
    tensors = []
    _cumulative_lengths(_made(CASE["forward"], "", tensors))
    return tensors


def get_init_inputs():
    return []


def _call(module, tensors):
    """forward with the case's arguments bound by the baseline's signature; its tensors."""
    arguments = _made(CASE["forward"], "", iter(tensors))
    args, kwargs = [], {}
    if "_args" in arguments:  # the capture could not bind the call to the signature
        args, kwargs = list(arguments["_args"]), dict(arguments.get("_kwargs") or {})
    else:
        for name, value in arguments.items():
            kind = CASE["kinds"].get(name, "keyword")
            if kind == "varargs":
                args.extend(value if isinstance(value, (list, tuple)) else [value])
            elif kind == "varkw":
                kwargs.update(value if isinstance(value, dict) else {})
            elif kind == "positional":
                args.append(value)
            else:
                kwargs[name] = value
    result = _leaves(module(*args, **kwargs))
    return result if result else list(tensors)


def _leaves(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _leaves(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _leaves(v)]
    return []
'''

_PROBLEM = '''

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _operator(_symbol(CASE["module"] + ":" + CASE["class"]))

    def forward(self, *tensors):
        return _call(self.inner, tensors)
'''

_KERNEL = '''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        candidate = importlib.import_module(CASE["candidate"])
        self.inner = _operator(getattr(candidate, CASE["class"]))

    def forward(self, *tensors):
        return _call(self.inner, tensors)
'''


def why_not(spec: ProblemSpec) -> str | None:
    """Why the problem's wrapper cannot be written (None when it can)."""
    where = "a captures/ folder in or above the kernel's folder, or ~/.fastkernels/captures"
    if spec.reference is None:
        return f"the FastKernels baseline of {spec.task} was not found (no checkout above it)"
    if spec.inputs_code is None:
        return f"no capture report of FastKernels' {spec.task} was found (in {where})"
    if not spec.sizes:
        return f"the captured cases of {spec.task} in {spec.inputs_code.path} cannot be " \
            f"built: {spec.sizes_note}"
    return None


def write_problem(spec: ProblemSpec, common: str, folder: Path) -> Path:
    """`folder/problem.py` around the baseline, beside a copy of its package."""
    case = _case(spec)
    folder.mkdir()
    _copy_package(_package(spec), folder / case["package"], candidate=None)
    (folder / "problem.py").write_text(_text(common, case, _PROBLEM), encoding="utf-8")
    return folder / "problem.py"


def write_kernel(spec: ProblemSpec, candidate: str, text: str, common: str,
                 folder: Path) -> Path:
    """`folder/kernel.py` around the candidate (`text`, from the file `candidate`)."""
    case = _case(spec)
    _copy_package(_package(spec), folder / case["package"], candidate=(Path(candidate), text))
    (folder / "kernel.py").write_text(_text(common, case, _KERNEL), encoding="utf-8")
    return folder / "kernel.py"


def _case(spec: ProblemSpec) -> dict:
    size = spec.sizes[0]
    level, stem = spec.task.split("/", 1)
    package = _package(spec).name
    module = f"{package}.tasks.baseline.{level}.{stem}"
    return {"package": package, "module": module,
            "candidate": module.replace(".tasks.baseline.", ".tasks.candidate."),
            "class": size.init_kwargs["class"], "init": size.init_kwargs["init"],
            "operators": size.init_kwargs["operators"], "forward": size.input_kwargs["forward"],
            "dtype": size.input_kwargs["dtype"],
            "kinds": _kinds(Path(spec.reference.file), size.init_kwargs["class"])}


def _text(common: str, case: dict, body: str) -> str:
    return common + _HELPERS + f"\nCASE = json.loads({json.dumps(case)!r})\n" + body


def _package(spec: ProblemSpec) -> Path:
    """The benchmark's package folder: `<package>/tasks/baseline/L<n>/<stem>.py`."""
    return Path(spec.reference.file).resolve().parents[3]


def _copy_package(source: Path, target: Path, candidate: tuple[Path, str] | None) -> None:
    """The package's sources, without its candidates; `candidate` (its file and text) placed
    at `tasks/candidate/L<n>/` with the files beside it."""
    candidates = source / "tasks" / "candidate"

    def skipped(folder: str, names: list[str]) -> list[str]:
        if Path(folder) == candidates:
            return names
        return [n for n in names if n.startswith(".") or n == "__pycache__" or
                ((Path(folder) / n).is_file() and not n.endswith(_SOURCES + (".json", ".yaml")))]

    shutil.copytree(source, target, ignore=skipped)
    if candidate is None:
        return
    file, text = candidate
    level = file.resolve().parent.name
    placed = target / "tasks" / "candidate" / level
    placed.mkdir(parents=True, exist_ok=True)
    for sibling in file.resolve().parent.iterdir():
        if sibling.is_file() and sibling.suffix in _SOURCES:
            shutil.copyfile(sibling, placed / sibling.name)
    (placed / file.name).write_text(text, encoding="utf-8")


def _kinds(baseline: Path, name: str) -> dict[str, str]:
    """How `name.forward` of the baseline takes each parameter: "positional" (positional
    only), "varargs", "varkw" or "keyword"; {} when it is not defined in the class itself
    (every argument then goes by keyword)."""
    try:
        tree = ast.parse(baseline.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            for method in node.body:
                if isinstance(method, ast.FunctionDef) and method.name == "forward":
                    arguments = method.args
                    kinds = {a.arg: "positional" for a in arguments.posonlyargs}
                    kinds.update({a.arg: "keyword" for a in
                                  [*arguments.args, *arguments.kwonlyargs]})
                    if arguments.vararg:
                        kinds[arguments.vararg.arg] = "varargs"
                    if arguments.kwarg:
                        kinds[arguments.kwarg.arg] = "varkw"
                    return kinds
    return {}
